"""Driving fairseq's own generation paths in-process (as fairseq's ``tests/utils.py`` does)
and through the real command-line tools, and reading what they print.

In-process calls parse argv with fairseq's own parsers (``options.parse_args_and_arch``)
and call ``fairseq_cli.<tool>.main``; ``fairseq-interactive`` gets its input from a
``sys.stdin`` replaced by an ``io.StringIO``, exactly as fairseq's ``generate_main`` test
helper and notebook code do.
"""

import contextlib
import io
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from cli_helpers import command, load_checkpoint, write_reversal_corpus
from conftest import cli_env
from fairseq import options
from fairseq_cli import generate, interactive, preprocess, train
from inprocess import checkout_launcher

# ----------------------------------------------------------------------------------------
# The corpus: the reversal task of cli_helpers, with BPE-style continuation marks on the
# target side ("C B A D" is written "C@@ B A@@ D", i.e. the words "CB AD"), so that
# --remove-bpe / --eval-bleu-remove-bpe change what is scored.
# ----------------------------------------------------------------------------------------

SPLITS = ("train", "valid", "test")


def bpe_target(letters):
    """Upper-cased reversed letters, joined pairwise with ``@@`` marks (two letters = a word)."""
    rev = [c.upper() for c in reversed(letters)]
    return " ".join(tok + ("@@" if i % 2 == 0 and i + 1 < len(rev) else "") for i, tok in enumerate(rev))


def write_bpe_reversal_corpus(raw):
    write_reversal_corpus(raw)
    for split in SPLITS:
        sources = (raw / f"{split}.src").read_text().splitlines()
        (raw / f"{split}.tgt").write_text("".join(bpe_target(s.split()) + "\n" for s in sources))


def remove_bpe(line):
    return (line + " ").replace("@@ ", "").rstrip()


def preprocess_in_process(raw, dest, *extra):
    """``fairseq-preprocess`` the three splits, in-process (fairseq's own test helper does so)."""
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--trainpref", str(raw / "train"),
        "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
        "--destdir", str(dest), "--workers", "1", "--joined-dictionary", *map(str, extra),
    ])
    preprocess.main(args)


def preprocess_test_only(raw_prefix, dest, dict_dir, *extra):
    """Binarize one ``test`` split with the dictionaries of ``dict_dir``."""
    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--testpref", str(raw_prefix),
        "--destdir", str(dest), "--workers", "1", "--srcdict", str(dict_dir / "dict.src.txt"),
        "--tgtdict", str(dict_dir / "dict.tgt.txt"), *map(str, extra),
    ])
    preprocess.main(args)


# ----------------------------------------------------------------------------------------
# Running the tools
# ----------------------------------------------------------------------------------------

PARSERS = {
    "generate": options.get_generation_parser,
    "interactive": options.get_interactive_generation_parser,
    "train": options.get_training_parser,
}
MAINS = {"generate": generate.main, "interactive": interactive.main, "train": train.main}


def parse(tool, argv):
    return options.parse_args_and_arch(PARSERS[tool](), [str(a) for a in argv])


def in_process(tool, argv, stdin=None):
    """Run ``fairseq_cli.<tool>.main`` on parsed ``argv``; return what it printed.

    ``stdin`` replaces ``sys.stdin`` for the call: text becomes an ``io.StringIO``, any
    other object (a stream) is used as it is.
    """
    args = parse(tool, argv)
    out = io.StringIO()
    saved_stdin = sys.stdin
    if stdin is not None:
        sys.stdin = io.StringIO(stdin) if isinstance(stdin, str) else stdin
    try:
        with contextlib.redirect_stdout(out), fixes(tool):
            MAINS[tool](args)
    finally:
        sys.stdin = saved_stdin
    return out.getvalue()


def fixes(tool):
    """The fixes to fairseq the launcher gives ``fairseq-<tool>`` (``realformer_tools.launch``:
    checkpoints that load on torch >= 2.6, ...; generate and interactive keep every sentence),
    installed for the call and gone after it; nothing where the checkout has no launcher (the
    test process has the fixes already)."""
    launch = checkout_launcher()
    if launch is None:
        return contextlib.nullcontext()
    return launch.fixes_installed(every_sentence=tool in ("generate", "interactive"), quiet=True)


def cli(tool, argv, stdin=b"", check=True, env=None):
    """Run ``fairseq-<tool>`` in its own process through the launcher (``cli_helpers.command``:
    the fixes to fairseq, as ``realformer-fairseq fairseq-<tool> ...``); ``stdin`` is bytes, passed as is."""
    proc = subprocess.run(
        command(f"fairseq-{tool}", *argv), input=stdin, capture_output=True,
        env={**cli_env(), **(env or {})}, timeout=600,
    )
    out, err = proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        raise AssertionError(f"fairseq-{tool} failed ({proc.returncode}):\n{err[-3000:]}")
    return proc.returncode, out, err


# ----------------------------------------------------------------------------------------
# Reading fairseq-generate / fairseq-interactive output
# ----------------------------------------------------------------------------------------


@dataclass
class Hypothesis:
    score: float  # base 2, as printed
    tokens: list
    positional: list = field(default_factory=list)  # base 2, one per token plus EOS
    alignment: list = None  # [(src, tgt)] when --print-alignment


@dataclass
class Sentence:
    source: str = None
    target: str = None
    hyps: list = field(default_factory=list)


LINE = re.compile(r"^([STHDPA])-(\d+)\t(.*)$")


def parse_output(text):
    """``{id: Sentence}`` from the S-/T-/H-/P-/A- lines, n-best order kept."""
    sents = defaultdict(Sentence)
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        kind, i, rest = m.group(1), int(m.group(2)), m.group(3)
        s = sents[i]
        if kind == "S":
            s.source = rest
        elif kind == "T":
            s.target = rest
        elif kind == "H":
            score, _, hyp = rest.partition("\t")
            s.hyps.append(Hypothesis(float(score), hyp.split()))
        elif kind == "P":
            s.hyps[-1].positional = [float(x) for x in rest.split()]
        elif kind == "A":
            s.hyps[-1].alignment = [tuple(map(int, p.split("-"))) for p in rest.split()]
    return dict(sents)


def hypothesis_lines(text):
    """The H-/P-/A- lines, in printed order (what must match between two runs)."""
    return [line for line in text.splitlines() if line[:2] in ("H-", "P-", "A-")]


# ----------------------------------------------------------------------------------------
# The same weights as fairseq's own transformer
# ----------------------------------------------------------------------------------------


def as_vanilla_transformer(checkpoint, dest):
    """Write ``checkpoint`` (a ``realformer_transformer``) as a ``transformer`` checkpoint:
    same weights and settings, model name changed, the RealFormer flags removed."""
    state = load_checkpoint(checkpoint)
    model_cfg = state["cfg"]["model"]
    model_cfg.arch = model_cfg._name = "transformer"
    for key in [k for k in vars(model_cfg) if k.startswith("residual_attention")]:
        delattr(model_cfg, key)
    torch.save(state, dest)
    return dest
