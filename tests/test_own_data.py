"""The README's "Your own data" block, run as written from a folder outside the clone on a
parallel corpus of our own making, and what it promises:

* every test sentence translated and scored, in order: the test set has 203 lines (odd, not a
  multiple of 8: fairseq 0.12's generate alone drops the last ``len % 8``), and hypothesis
  *n* must line up with reference *n*: fairseq's own record of each sentence (its id, its
  source, its reference, character for character) and each hypothesis closer to its own
  reference than to its neighbours' (one-word to 80-word lines), a check that a shift by one
  line fails;
* UTF-8 as written: accents, an emoji, ``…``, ``ﬁ``, ``½`` come back from SentencePiece and
  fairseq unchanged (its default NFKC normalization would rewrite the last three);
* bad input refused by the preparation line in one line naming the file, nothing written.

Only what makes the run fast is changed: the training command gets a tiny model, 240 updates
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
from conftest import cli_env
from test_docs import logical_lines, section, split_markdown

TEST_LINES = 203  # odd, and 203 % 8 == 3: the sentences fairseq 0.12 alone would leave out
TINY = ("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 "
        "--encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 2 "
        "--decoder-attention-heads 2 --max-tokens 2048 --max-update 240 --warmup-updates 24 --lr 0.003 --dropout 0 "
        "--log-interval 40 --cpu --seed 1")
# source words and their translations: accents, an emoji, the characters NFKC rewrites (… ﬁ ½)
SOURCE = ["café", "naïve", "ﬁsh", "½", "…", "😀", "straße", "élan", "über", "ça", "zoë", "año",
          "tea", "dog", "cat", "red", "sun", "map", "pen", "sky"]
TARGET = ["Kaffee…", "naïv", "ﬁsch", "halb½", "Pünktchen…", "Lächeln😀", "Straße", "Schwung", "oben", "das",
          "Zoë", "Jahr", "Tee", "Hund", "Katze", "rot", "Sonne", "Karte", "Stift", "Himmel"]
NFKC_REWRITES = ("…", "ﬁ", "½")


def sentence_lengths(rng, n):
    """Mostly 2-12 words, and one-word and 80-word lines among them."""
    lengths = [rng.randint(2, 12) for _ in range(n)]
    for i in range(0, n, 17):
        lengths[i] = 1
    for i in range(5, n, 41):
        lengths[i] = 80
    return lengths


def write_corpus(raw, src="en", tgt="de"):
    """A word-for-word translation (a fixed word map, same order): train 1,501, valid 61 and test
    TEST_LINES sentence pairs (odd counts), one per line, UTF-8. Returns the test pairs."""
    rng = random.Random(7)
    mapping = dict(zip(SOURCE, TARGET))
    raw.mkdir()
    for split, n in (("train", 1501), ("valid", 61), ("test", TEST_LINES)):
        pairs = []
        for length in sentence_lengths(rng, n):
            words = [rng.choice(SOURCE) for _ in range(length)]
            pairs.append((" ".join(words), " ".join(mapping[w] for w in words)))
        (raw / f"{split}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (raw / f"{split}.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return pairs


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


def commands_on_path(bin_dir):
    """A folder for PATH holding ``realformer-fairseq``, ``realformer-prepare-data`` and
    ``realformer-nmt-user-dir``: the venv's console scripts where it has them, else the same
    entry points through ``python -m``."""
    bin_dir.mkdir()
    for name, module in (("realformer-fairseq", "realformer_tools.launch"),
                         ("realformer-prepare-data", "realformer_tools.cli.prepare_data"),
                         ("realformer-nmt-user-dir", "realformer_tools.cli.user_dir")):
        installed = shutil.which(name, path=os.path.dirname(sys.executable))
        if installed:
            os.symlink(installed, bin_dir / name)
        else:
            shim = bin_dir / name
            shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m {module} \"$@\"\n")
            shim.chmod(0o755)
    return bin_dir


def aligned_share(hypotheses, references):
    """The share of lines whose hypothesis is closer (sentence chrF) to its own reference than to
    the references of the lines before and after it. Hypothesis *n* translating line *n*
    gives nearly all of them (measured: 202 of 203; the one other an 80-word line cut short);
    a shift by one line, nearly none (measured: 1 of 203)."""
    import sacrebleu

    assert len(hypotheses) == len(references), f"{len(hypotheses)} hypotheses for {len(references)} references"
    closer = 0
    for n, hypothesis in enumerate(hypotheses):
        own = sacrebleu.sentence_chrf(hypothesis, [references[n]]).score
        others = [sacrebleu.sentence_chrf(hypothesis, [references[m]]).score for m in (n - 1, n + 1)
                  if 0 <= m < len(references)]
        closer += own > max(others)
    return closer / len(hypotheses)


def fairseq_records(generate_txt):
    """``{id: {"S": source, "T": reference, "D": detokenized hypothesis}}`` from fairseq-generate."""
    records = {}
    for line in generate_txt.splitlines():
        m = re.match(r"^([STD])-(\d+)\t(.*)$", line)
        if m:
            kind, sid, rest = m.groups()
            records.setdefault(int(sid), {})[kind] = rest.split("\t")[-1] if kind == "D" else rest
    return records


@pytest.mark.slow
def test_own_data_block_runs_anywhere_and_scores_every_line_in_order(tmp_path):
    pytest.importorskip("realformer_tools.launch")
    pytest.importorskip("sentencepiece")
    script = shrunk(readme_block())
    assert script.startswith("set -euo pipefail\n")
    work = tmp_path / "elsewhere"  # a folder outside the clone, as a user's
    work.mkdir()
    test_pairs = write_corpus(work / "raw")
    sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
    assert len(references) % 2 == 1 and {len(s.split()) for s in sources} >= {1, 80}
    assert all(any(c in r for r in references) for c in (*NFKC_REWRITES, "😀", "ä"))
    env = cli_env()
    env["PATH"] = os.pathsep.join([str(commands_on_path(tmp_path / "bin")), os.path.dirname(sys.executable),
                                   env.get("PATH", "")])
    proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(os.listdir(work)) == ["raw", "work"]  # everything it made is in its work folder

    # every test sentence translated, once, and the hypotheses file in corpus order
    records = fairseq_records((work / "work" / "generate.txt").read_text(encoding="utf-8"))
    assert sorted(records) == list(range(TEST_LINES)), f"{len(records)} of {TEST_LINES} test sentences translated"
    hypotheses = (work / "work" / "hypotheses.de").read_text(encoding="utf-8").split("\n")[:-1]
    assert hypotheses == [records[i]["D"] for i in range(TEST_LINES)]
    # fairseq's own source and reference of sentence n are line n of the raw files, character for character
    assert [records[i]["S"] for i in range(TEST_LINES)] == sources
    assert [records[i]["T"] for i in range(TEST_LINES)] == references
    # and each hypothesis is the translation of its line: the check a shift by one line fails
    assert aligned_share(hypotheses, references) >= 0.95
    for shifted in (hypotheses[1:] + hypotheses[:1], hypotheses[-1:] + hypotheses[:-1]):
        assert aligned_share(shifted, references) < 0.1

    # scored: sacreBLEU's JSON line is the BLEU of these hypotheses against the raw references
    starts = [m.start() for m in re.finditer(r'^\{\s*\n\s*"name": "BLEU"', proc.stdout, flags=re.M)]
    assert starts, proc.stdout[-3000:]
    score = json.loads(proc.stdout[starts[-1]:])
    assert re.search(r"nrefs:1\|", score["signature"]), score
    import sacrebleu

    assert score["score"] == pytest.approx(round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 1), abs=0.05)
    assert score["score"] > sacrebleu.corpus_bleu(hypotheses[1:] + hypotheses[:1], [references]).score
    # the launcher named its fixes in one line (fairseq logs to stdout: generate's lines are in generate.txt)
    logs = proc.stdout + proc.stderr + (work / "work" / "generate.txt").read_text(encoding="utf-8")
    assert len(re.findall(r"\| fairseq fixes: ", logs)) == 2 and "| fairseq fix " not in logs


def test_sentencepiece_gives_back_every_line_as_written(tmp_path):
    """The preparation's SentencePiece model (identity normalization) encodes and decodes
    accents, an emoji, ``…``, ``ﬁ``, ``½``, one-word and 80-word lines back to themselves;
    SentencePiece's default (NFKC) would not, which is what the test can tell apart."""
    spm = pytest.importorskip("sentencepiece")
    from realformer_tools.data import own, pipeline

    write_corpus(tmp_path / "raw")
    lines = (tmp_path / "raw" / "test.en").read_text(encoding="utf-8").splitlines() + \
        (tmp_path / "raw" / "test.de").read_text(encoding="utf-8").splitlines()
    assert any(len(line.split()) == 80 for line in lines) and any(len(line.split()) == 1 for line in lines)
    models = {}
    for name, options in (("identity", {"normalization_rule_name": own.NORMALIZATION}), ("nfkc", {})):
        models[name] = spm.SentencePieceProcessor(model_file=pipeline.train_sentencepiece(
            str(tmp_path / "raw"), str(tmp_path / name / "spm"), 300, langs=("en", "de"), **options))
    back = [models["identity"].decode(models["identity"].encode(line)) for line in lines]
    assert back == lines
    nfkc = [models["nfkc"].decode(models["nfkc"].encode(line)) for line in lines]
    changed = {c for line, again in zip(lines, nfkc) if again != line for c in NFKC_REWRITES if c in line}
    assert changed == set(NFKC_REWRITES)


def _prepare(raw, dest, capsys):
    from realformer_tools.cli import prepare_data

    status = prepare_data.main(["--corpus", "own", "--raw-dir", str(raw), "--dest", str(dest)])
    return status, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("fault, message", [
    ("short", "{raw}/test.en has 203 lines but {raw}/test.de has 202: line n of the two files must be a translation "
              "pair (nothing was written)"),
    ("latin1", "{raw}/train.en is not UTF-8: line 1502, byte 4 of the line (0xe9): convert the file to UTF-8"),
    ("missing", "--raw-dir {raw} has no valid.de (plain or .gz)"),
])
def test_bad_input_is_one_line_naming_the_file_and_nothing_is_written(tmp_path, capsys, fault, message):
    raw = tmp_path / "raw"
    write_corpus(raw)
    if fault == "short":
        (raw / "test.de").write_text("".join((raw / "test.de").read_text(encoding="utf-8").splitlines(True)[:-1]),
                                     encoding="utf-8")
    elif fault == "latin1":
        with open(raw / "train.en", "ab") as f:
            f.write("caf\u00e9 x\n".encode("latin-1"))
        with open(raw / "train.de", "a", encoding="utf-8") as f:
            f.write("Kaffee\n")
    else:
        (raw / "valid.de").unlink()
    status, err = _prepare(raw, tmp_path / "work" / "data", capsys)
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith(f"prepare_data.py: error: {message.format(raw=raw)}"), err[0]
    assert not (tmp_path / "work").exists()


def test_test_lines_are_all_kept_and_train_pairs_with_an_empty_side_dropped(tmp_path):
    """The test split keeps every line, an empty one included (its hypotheses must line up with
    the user's reference file); train and valid drop a pair with an empty side, counted."""
    from realformer_tools.data import own

    raw = tmp_path / "raw"
    raw.mkdir()
    for split, src, tgt in (("train", "a b\n\nc\n", "A B\nX\nC\n"), ("valid", "a\n", "A\n"),
                            ("test", "a  b\n\nc\n", "A B\n\nC\n")):
        (raw / f"{split}.en").write_text(src, encoding="utf-8")
        (raw / f"{split}.de").write_text(tgt, encoding="utf-8")
    splits, report = own.read_own(str(raw), ("en", "de"))
    assert splits["test"] == [("a b", "A B"), ("", ""), ("c", "C")]
    assert splits["train"] == [("a b", "A B"), ("c", "C")] and report["train"]["dropped_empty"] == 1
