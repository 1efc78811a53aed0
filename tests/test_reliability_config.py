"""Bad configuration gets one clear line naming the flag or file, exit non-zero, no
traceback, and nothing written; changed residual settings on load get a warning.

The tools run in this process (``tests/inprocess.py``: the console command's own function, its
stdout, stderr and exit status as a subprocess gives them); tests/test_error_lines.py and
tests/test_startup_errors.py see one-line errors of the console commands in subprocesses."""

import pytest
from cli_helpers import TINY_FLAGS
from conftest import USER_DIR
from inprocess import run_in_process as run


def assert_one_line_error(proc, *words):
    """Exit non-zero with exactly one error line, the last line written (nothing of the
    message continues below it; argparse's usage block and library warnings may come
    before it), naming every one of ``words``."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    error_lines = [line for line in lines if "error" in line.lower()]
    assert len(error_lines) == 1, error_lines or proc.stderr[-2000:]
    assert lines[-1] == error_lines[0], f"lines after the error: {lines[lines.index(error_lines[0]) + 1:]}"
    for word in words:
        assert word in error_lines[0], error_lines[0]


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--residual-attention-paths", "encoder,foo"], ["--residual-attention-paths", "'foo'"]),
        (["--residual-attention-paths", ""], ["--residual-attention-paths", "empty"]),
        (["--residual-attention-paths", "none,cross"], ["--residual-attention-paths", "'none'"]),
        (["--residual-attention-mode", "max"], ["--residual-attention-mode", "'max'"]),
        (["--residual-attention-paths", "cross", "--no-cross-attention"], ["cross", "--no-cross-attention"]),
        (["--residual-attention-kernel", "flash"], ["--residual-attention-kernel", "'flash'"]),
        (["--base-layers", "1"], ["--base-layers", "mixture-of-experts"]),
    ],
    ids=["unknown-path", "empty-paths", "none-with-others", "unknown-mode", "cross-without-cross-attention",
         "unknown-kernel", "base-layers"],
)
@pytest.mark.slow
def test_bad_flags_fail_with_one_clear_line(data_bin, tmp_path, flags, expected):
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--max-update", 1, "--save-dir", tmp_path, *TINY_FLAGS, *flags, check=False,
    )
    assert_one_line_error(proc, *expected)
    assert not list(tmp_path.glob("*.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["fairseq-train", "fairseq-generate"])
@pytest.mark.parametrize("case", ["missing-dir", "no-dictionaries"])
def test_unusable_data_dir_is_one_clear_line(tmp_path, trained, tool, case):
    data = tmp_path / "data"
    if case == "no-dictionaries":
        data.mkdir()
        (data / "train.src-tgt.src.bin").write_bytes(b"")
    extra = (["--max-update", 1, "--save-dir", tmp_path / "ckpt", *TINY_FLAGS]
             if tool == "fairseq-train" else ["--path", trained[0] / "checkpoint_last.pt", "--cpu"])
    proc = run(tool, data, "--user-dir", USER_DIR, "--arch", "realformer_transformer", *extra, check=False) \
        if tool == "fairseq-train" else run(tool, data, "--user-dir", USER_DIR, *extra, check=False)
    assert_one_line_error(proc, str(data))
    assert ("does not exist" if case == "missing-dir" else "dict.") in proc.stderr


@pytest.mark.slow
def test_changed_residual_settings_on_load_are_named(data_bin, trained, tmp_path):
    """Warm-starting from a checkpoint trained with other settings works, with a
    warning that says exactly what changed."""
    save, _ = trained  # trained with encoder,decoder,cross and mean
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--residual-attention-paths", "encoder", "--residual-attention-mode", "sum",
        "--finetune-from-model", save / "checkpoint_last.pt", "--max-update", 32,
        "--save-dir", tmp_path, *TINY_FLAGS,
    )
    log = proc.stdout + proc.stderr
    assert "residual paths encoder,decoder,cross -> encoder" in log
    assert "mode mean -> sum" in log
    same = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--residual-attention-mode", "mean", "--finetune-from-model", save / "checkpoint_last.pt",
        "--max-update", 32, "--save-dir", tmp_path / "same", *TINY_FLAGS,
    )
    assert "different residual attention settings" not in same.stdout + same.stderr
