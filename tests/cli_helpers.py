"""Running fairseq's real command-line tools from tests, on a tiny corpus."""

import random
import subprocess

import torch
from conftest import BIN, cli_env

TINY_FLAGS = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 "
    "--encoder-attention-heads 2 --decoder-attention-heads 2 "
    "--optimizer adam --lr 1e-3 --max-tokens 2000 --cpu --no-progress-bar --log-interval 10 "
    "--no-epoch-checkpoints --seed 1"
).split()


def run(tool, *args, check=True, input=None):
    """Run a console script of this venv; on failure show the end of its stderr."""
    proc = subprocess.run(
        [str(BIN / tool), *map(str, args)], capture_output=True, text=True, env=cli_env(),
        input=input, timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def write_reversal_corpus(raw):
    """A tiny real task: reverse a letter sequence and upper-case it."""
    rng = random.Random(0)
    for split, n in [("train", 400), ("valid", 40), ("test", 40)]:
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
