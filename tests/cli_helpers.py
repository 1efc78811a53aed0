"""Running fairseq's real command-line tools from tests, on a tiny corpus."""

import random
import subprocess
import sys

import torch
from conftest import BIN, cli_env

TINY_FLAGS = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 "
    "--encoder-attention-heads 2 --decoder-attention-heads 2 "
    "--optimizer adam --lr 1e-3 --max-tokens 2000 --cpu --no-progress-bar --log-interval 10 "
    "--no-epoch-checkpoints --seed 1"
).split()


def command(tool, *args, fixes=True, data_fixes=False, bf16_decoding=False):
    """The command line of the fairseq tool ``tool`` (``fairseq-train`` ...): through the
    launcher (``python -m realformer_tools.launch``: the fixes to fairseq 0.12, and the data /
    bf16-decoding fixes when asked), or with ``fixes=False`` the plain console script as a user
    without our tools runs it."""
    if not fixes:
        assert not (data_fixes or bf16_decoding), "the data and bf16 fixes come with the launcher"
        return [str(BIN / tool), *map(str, args)]
    flags = ["--data-fixes"] * data_fixes + ["--bf16-decoding"] * bf16_decoding
    return [sys.executable, "-m", "realformer_tools.launch", *flags, tool, *map(str, args)]


def run(tool, *args, check=True, input=None, fixes=True, data_fixes=False, bf16_decoding=False, env=None):
    """Run the fairseq tool ``tool`` of this venv (through the launcher unless ``fixes=False``:
    see :func:`command`); on failure show the end of its stderr."""
    proc = subprocess.run(
        command(tool, *args, fixes=fixes, data_fixes=data_fixes, bf16_decoding=bf16_decoding), capture_output=True,
        text=True, env={**cli_env(), **(env or {})}, input=input, timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def write_reversal_corpus(raw, splits=(("train", 400), ("valid", 40), ("test", 40))):
    """A tiny real task: reverse a letter sequence and upper-case it; ``splits``: (name, sentences)."""
    rng = random.Random(0)
    for split, n in splits:
        src, tgt = [], []
        for _ in range(n):
            s = [rng.choice("abcdefghij") for _ in range(rng.randint(3, 8))]
            src.append(" ".join(s))
            tgt.append(" ".join(c.upper() for c in reversed(s)))
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt) + "\n")


def binarize(raw, dest):
    """fairseq-preprocess train/valid/test ``.src``/``.tgt`` into ``dest``; returns the process."""
    return run(
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", dest, "--workers", "1", "--joined-dictionary",
    )


def load_checkpoint(path):
    """torch.load of a checkpoint these tests wrote: weights-only, with fairseq's own types
    (argparse.Namespace, omegaconf containers) allowed for this one load."""
    from realformer_tools.fairseq_fixes.safe_checkpoint_loading import fairseq_checkpoint_types

    with fairseq_checkpoint_types():
        return torch.load(path, map_location="cpu")
