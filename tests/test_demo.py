"""make demo (scripts/run_demo.py) on a machine too slow for its --max-minutes cap: the run
the cap stops is still translated and scored, labelled UNDERTRAINED, with the command
that finishes it; that command, verbatim, continues from checkpoint_last.pt and ends in
a finished, scored run; progress lines carry an ETA from the first one on.

The cap is made tiny instead of the machine slow: fairseq checks it after every update, so
a capped run does one update and stops there. The model is tiny to keep the test short."""

import json
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO, cli_env
from inprocess import run_in_process

from realformer_tools.cli import _demo, run_demo

SCRIPT = REPO / "scripts" / "run_demo.py"
TINY = ["--layers", "1", "--embed-dim", "32", "--max-tokens", "1024", "--max-update", "3",
        "--data", "data", "--save-dir", "ckpt", "--json", "out/demo.json", "--num-examples", "2"]


def demo_env():
    """The environment of a demo started by hand (the suite may run under `make test`,
    whose MAKELEVEL would make the demo advise `make demo`, tested on its own below)."""
    env = cli_env()
    for name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
        env.pop(name, None)
    return env


def demo(cwd, cmd):
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=demo_env(), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads((cwd / "out" / "demo.json").read_text())


@pytest.mark.slow
def test_a_run_its_cap_stops_is_scored_labelled_and_the_printed_command_finishes_it(tmp_path, monkeypatch):
    # the capped run: the script's main in this process (tests/inprocess.py: its argv, cwd and environment
    # as demo_env gives them, its output captured; the fairseq tools it starts are processes of their own)
    for name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
        monkeypatch.delenv(name, raising=False)
    first = run_in_process("realformer-demo", *TINY, "--max-minutes", "0.001", check=False, env=demo_env(),
                           cwd=tmp_path, fixes=False, argv0=SCRIPT)
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert (report["stopped_early"], report["undertrained"], report["num_updates"]) == (True, True, 1)
    assert isinstance(report["bleu"], float) and report["num_test_sentences"] == 500
    assert report["environment"] == {"REALFORMER_NMT_DATA_FIXES": "1"}  # every test sentence decoded and scored
    assert f"BLEU = {report['bleu']:.2f}" in first.stdout and first.stdout.count("HYP:") == 2
    last = first.stdout.splitlines()[-1]
    assert last.startswith("UNDERTRAINED: training stopped early, after 1 of 3 updates (the --max-minutes 0.001 cap")
    assert report["minutes_left_estimate"] > 0 and f"about {report['minutes_left_estimate']:g} more minutes" in last
    finish = report["finish_command"]
    assert last.endswith(f": {finish}") and shlex.split(finish)[-2:] == ["--max-minutes", "0"]
    assert "0.001" not in finish

    # the printed command, verbatim, as a user starts it: continues at update 1 to the end, scored, not labelled
    second, report = demo(tmp_path, shlex.split(finish))
    assert re.search(r"loaded \S*checkpoint_last.pt: continuing at update 1\n", second.stderr)
    assert (report["stopped_early"], report["num_updates"], report["train_runs"]) == (False, 3, 2)
    assert report["finish_command"] is None and "UNDERTRAINED" not in second.stdout
    assert f"BLEU = {report['bleu']:.2f}" in second.stdout and "updates=3 of 3 " in second.stdout


def test_the_continue_command_is_the_same_run_without_a_cap(monkeypatch):
    monkeypatch.setenv("MAKELEVEL", "1")
    assert run_demo.continue_command(run_demo.parse_args([])) == 'make demo DEMO_ARGS="--max-minutes 0"'
    args = run_demo.parse_args(["--fresh", "--max-minutes", "5", "--train-args", "--dropout 0.2"])
    assert run_demo.continue_command(args) == \
        "make demo DEMO_ARGS=\"--train-args '--dropout 0.2' --max-minutes 0\""
    monkeypatch.delenv("MAKELEVEL")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])  # run as scripts/run_demo.py
    words = shlex.split(run_demo.continue_command(args))
    assert words[1].endswith("run_demo.py") and words[2:] == ["--train-args", "--dropout 0.2", "--max-minutes", "0"]
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/realformer-demo"])  # the installed command
    assert run_demo.continue_command(run_demo.parse_args(["--max-minutes=3"])) == "realformer-demo --max-minutes 0"


def test_the_first_progress_line_has_an_eta_and_says_when_the_cap_will_stop_it():
    clock = iter([100.0, 160.0])  # training begins at 100 s; update 20 is logged at 160 s
    lines = []
    progress = _demo.Progress(max_update=600, cap_seconds=600, log=lines.append, clock=lambda: next(clock))
    progress("2026-11-26 07:33:48 | INFO | fairseq.trainer | begin training epoch 1")
    progress("2026-11-26 07:34:48 | INFO | train_inner | epoch 001:     20 / 123 loss=8.5, nll_loss=8.1, "
             "num_updates=20, lr=0.0004")
    # 20 updates in 60 s: 580 left take 29 minutes; the 10-minute cap stops it 9 minutes on
    assert lines == ["update 20 of 600, loss 8.5 | 0.33 upd/s, eta 29m00s; the time cap stops it in about "
                     "9m00s near update 200, which is then scored (undertrained)"]
