"""The errors translation.md and reliability.md call "one line" are one line through the
real command-line tools: stderr is counted (Python's own deprecation warnings from hydra
and torch are switched off, they are not ours), not just searched.

Each kind of error is shown once in a process of its own (a flag's value, fp16 on CPU, a
checkpoint of other data to fairseq-generate, a truncated checkpoint to fairseq-train): all a
fresh process prints is counted. Its other cases run the same command through the launcher's
``main`` in the test process (``inprocess.run_in_process``: stdout, stderr and exit status as a
process of its own gives them), as does the resume that follows the advice.
"""

import random
import shutil
import subprocess

import pytest
from cli_helpers import TINY_FLAGS, command
from conftest import USER_DIR, cli_env
from inprocess import run_in_process

from realformer_tools.fairseq_fixes.checkpoint_errors import first_sentence as _first_sentence


def run_cli(tool, *args, separate=True):
    """``tool`` through the launcher: in a process of its own, or (``separate=False``) in this one."""
    if not separate:
        return run_in_process(tool, *args, check=False, env={"PYTHONWARNINGS": "ignore"})
    env = dict(cli_env(), PYTHONWARNINGS="ignore")
    return subprocess.run(command(tool, *args), capture_output=True, text=True,  # launched
                          env=env, timeout=600)


def ours(stderr):
    """stderr without fairseq's log records (fairseq-generate logs to stderr)."""
    return [line for line in stderr.splitlines() if line.strip()
            and not line.startswith(("INFO:", "DEBUG:", "WARNING:")) and " | INFO | " not in line]


def assert_one_line(proc, *words):
    assert proc.returncode != 0
    lines = ours(proc.stderr)
    assert len(lines) == 1, f"{len(lines)} lines:\n" + "\n".join(lines[:40])
    assert lines[0].startswith("realformer_nmt: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def train(data, save_dir, *flags, separate=True):
    """fairseq-train through the launcher (its default fixes: bf16_without_tpu refuses fp16
    training on CPU)."""
    return run_cli("fairseq-train", data, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
                   "--save-dir", save_dir, *TINY_FLAGS, *flags, separate=separate)


@pytest.mark.slow
@pytest.mark.parametrize("flags,words,separate", [
    (["--residual-attention-paths", "encoder,decodr"], ["--residual-attention-paths", "'decodr'"], True),
    (["--residual-attention-mode", "max"], ["--residual-attention-mode", "'max'"], False),
    (["--residual-attention-kernel", "flash"], ["--residual-attention-kernel", "'flash'"], False),
    (["--fp16"], ["--fp16", "--bf16"], True),
], ids=["paths-typo", "mode", "kernel", "fp16-on-cpu"])
def test_flag_errors_are_one_line_and_create_nothing(data_bin, tmp_path, flags, words, separate):
    """Not fairseq's 175-line usage before the error; and nothing created: --save-dir does
    not exist afterwards (an --fp16 run on CPU used to leave it behind, empty). A flag's
    value and fp16 in processes of their own, the other two flags in this one."""
    save_dir = tmp_path / "ckpt"
    proc = train(data_bin, save_dir, "--max-update", 1, *flags, separate=separate)
    assert_one_line(proc, *words)
    assert "usage:" not in proc.stderr
    assert not save_dir.exists()


@pytest.fixture(scope="module")
def other_data(tmp_path_factory):
    """A corpus like the reversal corpus but over 20 letters: a larger dictionary."""
    raw = tmp_path_factory.mktemp("raw20")
    rng = random.Random(1)
    for split, n in [("train", 100), ("valid", 20), ("test", 20)]:
        src = [" ".join(rng.choice("abcdefghijklmnopqrst") for _ in range(rng.randint(3, 8)))
               for _ in range(n)]
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(s.upper()[::-1] for s in src) + "\n")
    dest = tmp_path_factory.mktemp("bin20")
    # cli_helpers.binarize's fairseq-preprocess, in this process (the data, not what is tested)
    run_in_process("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
                   "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", dest, "--workers", "1",
                   "--joined-dictionary")
    return dest


def dictionary_size(data):
    """fairseq's Dictionary: the file's symbols plus <s>, <pad>, </s>, <unk>."""
    return len((data / "dict.src.txt").read_text().splitlines()) + 4


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["fairseq-generate", "fairseq-train"])
def test_checkpoint_with_another_dictionary_is_one_line(trained, data_bin, other_data, tmp_path, tool):
    save, _ = trained
    checkpoint = save / "checkpoint_last.pt"
    if tool == "fairseq-generate":  # in a process of its own
        proc = run_cli(tool, other_data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu")
    else:  # in this one
        proc = train(other_data, tmp_path / "ckpt", "--restore-file", checkpoint, "--max-update", 1, separate=False)
    trained_size, data_size = dictionary_size(data_bin), dictionary_size(other_data)
    assert trained_size != data_size
    line = assert_one_line(proc, str(checkpoint), str(other_data), "trained on other data")
    assert f"dictionary has {trained_size} entries" in line
    assert f"the data's dictionary has {data_size}" in line
    assert "size mismatch" not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_truncated_checkpoint_last_says_how_to_resume(trained, data_bin, tmp_path):
    """A checkpoint_last.pt cut short (a kill while writing it): one line, torch's reason
    kept whole to its first sentence, and the advice it gives works."""
    save, _ = trained
    run_dir = tmp_path / "ckpt"
    shutil.copytree(save, run_dir)
    last = run_dir / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:100_000])
    proc = train(data_bin, run_dir, "--max-update", 32)
    line = assert_one_line(proc, f"cannot read checkpoint {last}", "truncated")
    best = run_dir / "checkpoint_best.pt"
    assert f"--restore-file {best}" in line
    reason = line.split("(", 1)[1].split(")")[0]
    assert reason == ("RuntimeError: PytorchStreamReader failed reading zip archive: "
                      "failed finding central directory"), reason

    resumed = train(data_bin, run_dir, "--max-update", 32, "--restore-file", best, separate=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "num_updates 32" in resumed.stdout
    assert "Loaded checkpoint" in resumed.stdout and str(best) in resumed.stdout


def test_quoted_messages_are_cut_at_a_word_boundary():
    text = ("PytorchStreamReader failed reading zip archive: failed finding central directory. "
            "This is an internal miniz error. If you are seeing this error ...\nsecond line")
    assert _first_sentence(text) == ("PytorchStreamReader failed reading zip archive: "
                                     "failed finding central directory")
    long = "word " * 40
    cut = _first_sentence(long, limit=50)
    assert cut.endswith(" ...") and len(cut) <= 54
    assert all(w == "word" for w in cut[:-4].split())
