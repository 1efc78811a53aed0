import os

from setuptools import find_packages, setup

# The CUDA rule of `--residual-attention-kernel auto` the project measured (make gpu-check) is
# package data: realformer_nmt/modules/residual_attention/kernel_rule.json, read with
# importlib.resources, the same file in a checkout and in the wheel.
PACKAGE_DATA = {"realformer_nmt.modules.residual_attention": ["kernel_rule.json"]}

# console commands -> the same main() in realformer_tools.cli that scripts/<name>.py runs in a checkout
# (a target named in full: elsewhere in realformer_tools)
COMMANDS = {
    "realformer-fairseq": "realformer_tools.launch:command",  # a fairseq command with the fixes to fairseq 0.12
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


# What the tools (commands, corpora, harness, conversion) need beyond the plugin, which needs
# fairseq-fixed alone: `pip install realformer-nmt` is the --user-dir plugin,
# `pip install 'realformer-nmt[tools]'` adds what the commands import.
TOOLS = [
    "sentencepiece",
    "sacrebleu>=2.0",
    "scipy",  # Student t intervals of the seed-paired differences
    # IWSLT'14 as fairseq prepares it: Moses tokenizer/detokenizer and subword-nmt BPE
    "sacremoses>=0.2.0",
    "subword-nmt>=0.3.8",
    # fairseq logs "Please install tensorboardX" at import without it (every fairseq-* command);
    # with it, fairseq's --tensorboard-logdir works
    "tensorboardX",
    "matplotlib",  # the studies' figures
]
HF = ["transformers==5.24.0", "protobuf==7.36.2"]  # protobuf: reading spm.model


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
    # two packages: realformer_nmt (the plugin, what --user-dir loads) and realformer_tools (the commands)
    packages=find_packages(include=["realformer_nmt", "realformer_nmt.*", "realformer_tools", "realformer_tools.*"]),
    package_data=PACKAGE_DATA,
    entry_points={"console_scripts": [
        f"{name} = {target if target.startswith('realformer_tools.') else 'realformer_tools.cli.' + target}"
        for name, target in COMMANDS.items()]},
    python_requires=">=3.9",
    # torch is deliberately not listed: pip must never replace the torch a user has
    # (CPU or a CUDA build). Install torch first; see README.
    install_requires=["fairseq-fixed==0.12.3.1"],  # the plugin's only requirement (besides torch)
    extras_require={"tools": TOOLS,
                    "test": TOOLS + ["pytest", "pytest-xdist>=3.5", "ruff==0.17.6"] + HF + [
                        # the triton kernel's CPU tests run it in Triton's interpreter; the version the
                        # GPU image ships (its CUDA torch pins it)
                        "triton==3.6.0; platform_system == 'Linux' and platform_machine == 'x86_64'"],
                    "plot": ["matplotlib"],
                    # the triton kernel, which --residual-attention-kernel auto runs on CUDA where it
                    # applies; CUDA builds of torch on Linux bring the triton they pin, which is what it
                    # runs with there (this extra: another machine, or the CPU tests' interpreter)
                    "triton": ["triton>=3.6.0"],
                    # scripts/export_hf.py and the exported folders (AutoModel*.from_pretrained)
                    "hf": HF,
                    # optional: torch.onnx.export of an exported folder, and its test (skipped without these)
                    "onnx": ["onnx==1.23.2", "onnxscript==0.7.2", "onnxruntime==1.32.0"],
                    # optional: convert_google_checkpoint.py --reader tensorflow (TensorFlow's own reader)
                    "convert-tf": ["tensorflow-cpu"]},
)
