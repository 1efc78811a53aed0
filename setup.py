from setuptools import find_packages, setup

setup(
    name="realformer-nmt",
    version="0.1.0",
    description="RealFormer (residual attention) for fairseq: translation and encoder pre-training",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["realformer_nmt", "realformer_nmt.*"]),
    python_requires=">=3.9",
    # torch is deliberately not listed: pip must never replace the torch a user has
    # (CPU or a CUDA build). Install torch first; see README.
    install_requires=[
        "fairseq-fixed==0.12.3.1",
        "sentencepiece",
        "sacrebleu>=2.0",
    ],
    extras_require={"test": ["pytest", "matplotlib", "ruff==0.17.6", "transformers==5.24.0", "protobuf==7.36.2"],
                    "plot": ["matplotlib"],
                    # scripts/export_hf.py and the exported folders (AutoModel*.from_pretrained)
                    "hf": ["transformers==5.24.0", "protobuf==7.36.2"],  # protobuf: reading spm.model
                    # optional: convert_google_checkpoint.py --reader tensorflow (TensorFlow's own reader)
                    "convert-tf": ["tensorflow-cpu"]},
)
