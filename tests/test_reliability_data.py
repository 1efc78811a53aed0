"""Bad input data through fairseq's CLIs: empty lines, over-long sentences, unknown words,
non-UTF-8 bytes, and what each fairseq 0.12 tool does with them. fairseq-preprocess, -train and
-generate run in this process (tests/inprocess.py: the console command's own function, its
stdout, stderr and exit status as a subprocess gives them); fairseq-interactive, whose stdin
decoding is under test, runs in its own process (reading ``--input FILE``, in this one).

One corpus (the reversal task of test_cli_end_to_end) with bad lines injected, binarized
and trained on once (30 updates, ``--max-source/target-positions 16``).

What fairseq 0.12 does, measured (the last two are fixed by ``realformer_tools.fairseq_fixes``,
and the tests below hold the fixed behaviour):

* empty / whitespace-only lines are neither skipped nor reported by ``fairseq-preprocess``:
  each becomes an EOS-only sentence (length 1) at its own index, so the pairs stay
  aligned and nothing crashes, but pairs like ("", "G H I") are trained on silently;
* over-long sentences: ``fairseq-train`` always drops over-long *training* pairs with a
  warning; validation and ``fairseq-generate``/``fairseq-interactive`` stop with a clear
  one-line message naming ``--skip-invalid-size-inputs-valid-test``, and skip (with a
  warning) when given it;
* fairseq-fixed's ``batch_by_size`` drops the last ``n % required_batch_size_multiple``
  sentences (default multiple 8) -- upstream fairseq keeps that partial batch -- so
  ``fairseq-generate`` silently leaves up to 7 sentences (the longest) untranslated, and
  prints nothing at all for a test set of fewer than 8 sentences;
* invalid UTF-8 reaching ``fairseq-interactive``: decoded strictly (``--input FILE``
  always; stdin under locales such as en_US.UTF-8) it dies with ``UnicodeDecodeError``
  and the good lines *before* the bad one are lost too (decoding is per 8 KiB chunk);
  under C.UTF-8/POSIX locales stdin uses ``surrogateescape`` and the bad word is <unk>.
"""

import math
import re
import subprocess

import numpy as np
import pytest
from cli_helpers import TINY_FLAGS, command, write_reversal_corpus
from conftest import USER_DIR, cli_env, trains
from fairseq.data import Dictionary, data_utils
from inprocess import run_in_process as run

LONG = " ".join("abcdefghij"[k % 10] for k in range(30))  # 31 tokens with EOS > 16
LONG_IDS = {"train": [10, 15, 20], "valid": [0, 5, 7], "test": [0, 5, 7]}
# (split, line index, side): lines made empty or whitespace-only
EMPTY = [("train", 0, "src"), ("train", 1, "tgt"), ("train", 2, "src"), ("train", 2, "tgt"),
         ("valid", 1, "src"), ("test", 1, "src")]
BLANK = [("train", 3, "src")]
N_LINES = {"train": 400, "valid": 40, "test": 40}


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_reversal_corpus(raw)
    for split in N_LINES:
        lines = {side: (raw / f"{split}.{side}").read_text().splitlines() for side in ("src", "tgt")}
        for i in LONG_IDS[split]:
            lines["src"][i] = LONG
            lines["tgt"][i] = " ".join(c.upper() for c in reversed(LONG.split()))
        for s, i, side in EMPTY:
            if s == split:
                lines[side][i] = ""
        for s, i, side in BLANK:
            if s == split:
                lines[side][i] = "   "
        for side in ("src", "tgt"):
            (raw / f"{split}.{side}").write_text("\n".join(lines[side]) + "\n")
    return raw


@pytest.fixture(scope="module")
def preprocessed(raw, tmp_path_factory):
    dest = tmp_path_factory.mktemp("bin")
    proc = run(  # cli_helpers.binarize's command, in this process
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
        "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", dest, "--workers", "1",
        "--joined-dictionary",
    )
    return dest, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
@trains
def trained(preprocessed, tmp_path_factory):
    data_bin, _ = preprocessed
    save = tmp_path_factory.mktemp("ckpt")
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        *TINY_FLAGS, "--max-tokens", 300, "--max-update", 30, "--save-dir", save,
        "--max-source-positions", 16, "--max-target-positions", 16,
        "--skip-invalid-size-inputs-valid-test",
    )
    return save / "checkpoint_last.pt", proc.stdout + proc.stderr


def generate(data_bin, ckpt, *flags, check=True, batch_size=16):
    """fairseq-generate on the test split (``batch_size=None``: fairseq's default batching)."""
    batching = [] if batch_size is None else ["--batch-size", batch_size]
    return run(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", ckpt,
        "--gen-subset", "test", "--beam", 2, "--cpu", *batching, *flags, check=check,
    )


def interactive(data_bin, ckpt, stdin: bytes, *flags, env=None):
    """fairseq-interactive fed raw bytes, in its own process (how stdin is decoded, by locale and
    PYTHONIOENCODING, is what these tests are about); returns (returncode, stdout, stderr) as text."""
    proc = subprocess.run(  # through the launcher (cli_helpers.command): with the fixes to fairseq
        command("fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--source-lang", "src",
                "--target-lang", "tgt", "--beam", "2", "--cpu", *flags),
        input=stdin, capture_output=True, env={**cli_env(), **(env or {})}, timeout=600,
    )
    decode = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
    return proc.returncode, decode(proc.stdout), decode(proc.stderr)


def lines_with(prefix, text):
    """{id: rest} for fairseq's 'S-3\t...' / 'H-3\tscore\t...' output lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix + "-"):
            head, _, rest = line.partition("\t")
            out[int(head[len(prefix) + 1:])] = rest
    return out


# --------------------------------------------------------------------------------------
# Empty lines in the raw corpus
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_empty_lines_become_eos_only_pairs_and_training_survives(preprocessed, trained):
    data_bin, log = preprocessed
    # reported only as part of the sentence count: nothing is skipped or flagged
    for split, n in N_LINES.items():
        for side in ("src", "tgt"):
            assert f"{split}.{side}: {n} sents" in log, log[-2000:]

    d = Dictionary.load(str(data_bin / "dict.src.txt"))
    datasets = {side: data_utils.load_indexed_dataset(str(data_bin / f"train.src-tgt.{side}"), d)
                for side in ("src", "tgt")}
    # copy: .sizes is a view into the dataset's mmap, invalid once the dataset is collected
    sizes = {side: np.array(ds.sizes) for side, ds in datasets.items()}
    assert len(sizes["src"]) == len(sizes["tgt"]) == N_LINES["train"]  # still aligned
    for split, i, side in EMPTY + BLANK:
        if split == "train":
            assert sizes[side][i] == 1  # EOS only, at its own index
    assert sizes["tgt"][0] > 1 and sizes["src"][1] > 1  # the other side is untouched

    _, train_log = trained
    assert "done training" in train_log
    epoch_losses = re.findall(r"\btrain\W+epoch \d+ \| loss (\S+) ", train_log)
    assert epoch_losses and all(math.isfinite(float(x)) for x in epoch_losses), train_log[-2000:]


# --------------------------------------------------------------------------------------
# Over-long sentences
# --------------------------------------------------------------------------------------


def test_train_skips_over_long_pairs_with_a_warning(trained):
    _, log = trained
    warnings = [line for line in log.splitlines() if "have invalid sizes and will be skipped" in line]
    assert len(warnings) >= 2, log[-3000:]  # the training set and the validation set
    assert all("3 samples" in w and "max_positions=(16, 16)" in w for w in warnings)


def test_generate_skips_over_long_sentences(preprocessed, trained):
    data_bin, _ = preprocessed
    ckpt, _ = trained
    proc = generate(data_bin, ckpt, "--skip-invalid-size-inputs-valid-test")
    hyps = lines_with("H", proc.stdout)
    assert set(hyps) == set(range(N_LINES["test"])) - set(LONG_IDS["test"])
    # fairseq's log: stderr for fairseq-generate alone, stdout through the launcher
    assert "3 samples have invalid sizes and will be skipped" in proc.stdout + proc.stderr
    assert hyps[1]  # the empty source line is translated too (to something)


def test_generate_without_the_skip_flag_stops_with_one_clear_message(preprocessed, trained):
    data_bin, _ = preprocessed
    ckpt, _ = trained
    proc = generate(data_bin, ckpt, check=False)
    assert proc.returncode != 0
    assert "skip this example with --skip-invalid-size-inputs-valid-test" in proc.stderr


def test_generate_translates_every_valid_sentence_with_default_batching(preprocessed, trained):
    """No --batch-size / --max-tokens: fairseq-generate's defaults (--max-tokens 12000,
    --required-batch-size-multiple 8), one batch of the 37 valid test sentences here, of
    which fairseq's own batch_by_size keeps 32 (the multiple of 8): the patch keeps all."""
    data_bin, _ = preprocessed
    ckpt, _ = trained
    valid = sorted(set(range(N_LINES["test"])) - set(LONG_IDS["test"]))
    fairseqs_own = getattr(data_utils.batch_by_size, "__wrapped__", data_utils.batch_by_size)
    unpatched = fairseqs_own(np.array(valid, dtype=np.int64), lambda i: 16, max_tokens=12000,
                             required_batch_size_multiple=8)
    assert sum(len(b) for b in unpatched) == 32  # what the patch has to put back: 5 sentences
    proc = generate(data_bin, ckpt, "--skip-invalid-size-inputs-valid-test", batch_size=None)
    assert "'max_tokens': 12000" in proc.stdout + proc.stderr  # fairseq-generate's default, logged
    hyps = lines_with("H", proc.stdout)
    assert sorted(hyps) == valid


@pytest.mark.parametrize("n", [5, 13, 37])
def test_batch_by_size_keeps_every_index(n):
    """With the fix the scoring commands get (the launcher's keep_last_batch)."""
    from realformer_tools.launch import fixes_installed

    indices = np.arange(n, dtype=np.int64)
    with fixes_installed(every_sentence=True, quiet=True):
        batches = data_utils.batch_by_size(indices, lambda i: 5, max_sentences=64,
                                           required_batch_size_multiple=8)
    assert sorted(int(i) for b in batches for i in b) == list(range(n))


# --------------------------------------------------------------------------------------
# fairseq-interactive: unknown words, empty lines, over-long lines, non-UTF-8 bytes
# --------------------------------------------------------------------------------------

GOOD, UNKNOWN, BAD_UTF8 = b"a b c", "zz qq a".encode(), b"\xff\xfe b"


def test_interactive_translates_around_bad_lines(preprocessed, trained):
    """Under a C.UTF-8/POSIX-like stdin (surrogateescape), every line but the over-long
    one is translated, in order; unknown and undecodable words become <unk>."""
    data_bin, _ = preprocessed
    ckpt, _ = trained
    stdin = b"\n".join([GOOD, UNKNOWN, b"", LONG.encode(), BAD_UTF8, b"j i h"]) + b"\n"
    rc, out, err = interactive(data_bin, ckpt, stdin, "--skip-invalid-size-inputs-valid-test",
                               env={"PYTHONIOENCODING": "utf-8:surrogateescape"})
    assert rc == 0, err[-3000:]
    sources, hyps = lines_with("S", out), lines_with("H", out)
    assert sorted(hyps) == [0, 1, 2, 4, 5]  # 3 (over-long) skipped with a warning
    assert "1 samples have invalid sizes and will be skipped" in out + err  # the log: either stream
    assert sources[0] == "a b c" and sources[5] == "j i h"
    assert sources[1] == "<unk> <unk> a"
    assert sources[2] == ""  # the empty line: translated from EOS alone
    assert sources[4] == "<unk> b"
    assert all(len(h.split("\t")) == 2 and float(h.split("\t")[0]) < 0 for h in hyps.values())
    ids_in_order = [int(line.split("\t")[0][2:]) for line in out.splitlines() if line.startswith("H-")]
    assert ids_in_order == sorted(ids_in_order)


def test_interactive_over_long_line_without_skip_flag_keeps_earlier_output(preprocessed, trained):
    """Without the flag the over-long line ends the run with fairseq's clear message; what
    was already translated has been written; the lines after it are not translated."""
    data_bin, _ = preprocessed
    ckpt, _ = trained
    rc, out, err = interactive(data_bin, ckpt, b"\n".join([GOOD, LONG.encode(), b"j i h"]) + b"\n")
    assert rc != 0
    assert "skip this example with --skip-invalid-size-inputs-valid-test" in err
    assert sorted(lines_with("H", out)) == [0]


@pytest.mark.parametrize("where", ["stdin-strict-locale", "input-file"])
def test_interactive_survives_invalid_utf8(preprocessed, trained, tmp_path, where):
    data_bin, _ = preprocessed
    ckpt, _ = trained
    data = b"\n".join([GOOD, BAD_UTF8, b"j i h"]) + b"\n"
    if where == "input-file":  # read from a file (strictly, always): no stdin, in this process
        (tmp_path / "in.txt").write_bytes(data)
        proc = run("fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", ckpt, "--source-lang", "src",
                   "--target-lang", "tgt", "--beam", "2", "--cpu", "--input", tmp_path / "in.txt", check=False)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    else:  # what sys.stdin is under e.g. LANG=en_US.UTF-8
        rc, out, err = interactive(data_bin, ckpt, data, env={"PYTHONIOENCODING": "utf-8:strict"})
    hyps = lines_with("H", out)
    assert rc == 0 and "UnicodeDecodeError" not in err, err[-1500:]
    assert 0 in hyps and 2 in hyps  # the good lines before and after the bad one
