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
        "scipy",  # Student t intervals of the seed-paired differences
        # IWSLT'14 as fairseq prepares it: Moses tokenizer/detokenizer and subword-nmt BPE
        "sacremoses>=0.2.0",
        "subword-nmt>=0.3.8",
    ],
    extras_require={"test": ["pytest", "matplotlib", "ruff==0.17.6"], "plot": ["matplotlib"],
                    # optional: convert_google_checkpoint.py --reader tensorflow (TensorFlow's own reader)
                    "convert-tf": ["tensorflow-cpu"]},
)
