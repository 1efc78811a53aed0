"""The README's "Your own data" block, run as written on a parallel corpus of our own making:
SentencePiece, fairseq-preprocess, fairseq-train and fairseq-generate through the launcher,
sacreBLEU against the raw references. The test set has 203 sentences, not a multiple of 8
(fairseq 0.12's generate alone drops the last ``len % 8``, and sacreBLEU then refuses the
shorter output): every one of them must be translated and scored.

Only what makes it fast is changed: the training command gets a tiny model, a dozen updates
and ``--cpu`` appended (fairseq's parser takes the last value of a flag), the generation
command ``--cpu``; every other word is the README's."""

import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import USER_DIR, cli_env
from test_docs import logical_lines, section, split_markdown

TEST_LINES = 203  # 203 % 8 == 3: the sentences fairseq 0.12 alone would leave out
TINY = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
        "--decoder-attention-heads 2 --max-tokens 1024 --max-update 12 --warmup-updates 4 --log-interval 4 --cpu")


def readme_block():
    """The bash block of the README's "Your own data" section, continuations joined."""
    blocks, _ = split_markdown(section("README.md", "Your own data"))
    code = next(code for lang, _, code in blocks if lang == "bash")
    return logical_lines(code)


def shrunk(lines):
    """The block with the training made tiny and both fairseq commands on CPU."""
    out, changed = [], {"fairseq-train": 0, "fairseq-generate": 0}
    for line in lines:
        words = line.split()
        if words[:2] == ["realformer-fairseq", "fairseq-train"]:
            line = f"{line.rstrip()} {TINY}"
            changed["fairseq-train"] += 1
        elif words[:2] == ["realformer-fairseq", "fairseq-generate"]:
            command, redirect, target = line.partition(" > ")
            line = f"{command.rstrip()} --cpu{redirect}{target}"
            changed["fairseq-generate"] += 1
        out.append(line)
    assert changed == {"fairseq-train": 1, "fairseq-generate": 1}, f"the README's block changed shape: {lines}"
    return "\n".join(out)


def write_corpus(raw, src="en", tgt="de"):
    """A word-for-word "translation" (a fixed word map, target order reversed): train 1200,
    valid 60 and test TEST_LINES sentence pairs, one per line."""
    rng = random.Random(7)
    words = [f"w{i}" for i in range(40)]
    target = {w: f"t{(i * 7) % 40}x" for i, w in enumerate(words)}
    raw.mkdir()
    for split, n in (("train", 1200), ("valid", 60), ("test", TEST_LINES)):
        pairs = []
        for _ in range(n):
            sentence = [rng.choice(words) for _ in range(rng.randint(3, 9))]
            pairs.append((" ".join(sentence), " ".join(target[w] for w in reversed(sentence))))
        (raw / f"{split}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (raw / f"{split}.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")


def launcher_on_path(bin_dir):
    """A folder for PATH holding ``realformer-fairseq``: the installed console script where the
    venv has it, else the same entry point through ``python -m realformer_tools.launch``."""
    installed = shutil.which("realformer-fairseq", path=os.path.dirname(sys.executable))
    bin_dir.mkdir()
    if installed:
        os.symlink(installed, bin_dir / "realformer-fairseq")
    else:
        shim = bin_dir / "realformer-fairseq"
        shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m realformer_tools.launch \"$@\"\n")
        shim.chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_own_data_block_scores_every_line(tmp_path):
    pytest.importorskip("realformer_tools.launch")
    pytest.importorskip("sentencepiece")
    script = shrunk(readme_block())
    write_corpus(tmp_path / "raw")
    os.symlink(USER_DIR, tmp_path / "realformer_nmt")  # the block's --user-dir realformer_nmt
    env = cli_env()
    path = [str(launcher_on_path(tmp_path / "bin")), os.path.dirname(sys.executable), env.get("PATH", "")]
    env["PATH"] = os.pathsep.join(path)
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # every test sentence translated, once
    ids = sorted(int(m) for m in re.findall(r"^D-(\d+)\t", (tmp_path / "mine.txt").read_text(), flags=re.M))
    assert ids == list(range(TEST_LINES)), f"{len(ids)} of {TEST_LINES} test sentences translated"
    # and scored: sacreBLEU's JSON line, over as many hypotheses as references
    starts = [m.start() for m in re.finditer(r'^\{\s*\n\s*"name": "BLEU"', proc.stdout, flags=re.M)]
    assert starts, proc.stdout[-3000:]
    score = json.loads(proc.stdout[starts[-1]:])
    assert isinstance(score["score"], float) and re.search(r"nrefs:1\|", score["signature"]), score
    # the launcher announced its fixes (fairseq logs to stdout: generate's lines are in mine.txt)
    logs = proc.stdout + proc.stderr + (tmp_path / "mine.txt").read_text()
    assert "fairseq fix " in logs, logs[-3000:]
