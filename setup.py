import os

from setuptools import find_packages, setup

# The CUDA rule of `--residual-attention-kernel auto` the project measured (make gpu-check) is
# package data: realformer_nmt/modules/residual_attention/kernel_rule.json, read with
# importlib.resources, the same file in a checkout and in the wheel.
PACKAGE_DATA = {"realformer_nmt.modules.residual_attention": ["kernel_rule.json"]}

# console commands -> the same main() that scripts/<name>.py runs in a checkout
COMMANDS = {
    "realformer-prepare-data": "prepare_data:main",
    "realformer-prepare-pretraining-data": "prepare_pretraining_data:main",
    "realformer-prepare-finetune-data": "prepare_finetune_data:main",
    "realformer-convert-google-checkpoint": "convert_google_checkpoint:main",
    "realformer-export-hf": "export_hf:main",
    "realformer-compare-backbones": "compare_backbones:main",
    "realformer-compare-mlm-backbones": "compare_mlm_backbones:main",
    "realformer-demo": "run_demo:main",
    "realformer-analyze-attention": "analyze_attention:command",
    "realformer-benchmark-speed": "benchmark_speed:command",
    "realformer-benchmark-kernels": "benchmark_kernels:command",
    "realformer-nmt-user-dir": "user_dir:main",
}


setup(
    name="realformer-nmt",
    version="0.1.0",
    description="RealFormer (residual attention) for fairseq: translation and encoder pre-training",
    long_description=open("README.md", encoding="utf-8").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="MIT",
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Operating System :: OS Independent",
        "Intended Audience :: Science/Research",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["realformer_nmt", "realformer_nmt.*"]),
    package_data=PACKAGE_DATA,
    entry_points={"console_scripts": [f"{name} = realformer_nmt.cli.{target}" for name, target in COMMANDS.items()]},
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
        # fairseq logs "Please install tensorboardX" at import without it (every fairseq-* command);
        # with it, fairseq's --tensorboard-logdir works
        "tensorboardX",
    ],
    extras_require={"test": ["pytest", "matplotlib", "ruff==0.17.6", "transformers==5.24.0", "protobuf==7.36.2"],
                    "plot": ["matplotlib"],
                    # scripts/export_hf.py and the exported folders (AutoModel*.from_pretrained)
                    "hf": ["transformers==5.24.0", "protobuf==7.36.2"],  # protobuf: reading spm.model
                    # optional: convert_google_checkpoint.py --reader tensorflow (TensorFlow's own reader)
                    "convert-tf": ["tensorflow-cpu"]},
)
