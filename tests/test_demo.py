"""make demo (scripts/run_demo.py) on a machine too slow for its --max-minutes cap: the run
says it stopped early, records it, prints no BLEU and exits 3; the command it prints
continues from checkpoint_last.pt; a run that reaches --max-update is scored.

The cap is made tiny instead of the machine slow: fairseq checks it after every update, so
each capped run does at least one update and stops there. The model is shrunk through
--train-args (later flags win) to keep the test short."""

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO, cli_env

SCRIPT = REPO / "scripts" / "run_demo.py"
SMALL = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
         "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --max-tokens 1024")


def demo_env():
    """The environment of a demo started by hand: the suite may itself run under `make test`,
    whose MAKELEVEL would make the demo advise `make demo` (tested on its own below)."""
    env = cli_env()
    for name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
        env.pop(name, None)
    return env


def demo(cwd, *args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          env=demo_env(), timeout=600)


def load_demo_module():
    """The demo's code (scripts/run_demo.py runs realformer_nmt.cli.run_demo's main)."""
    return importlib.import_module("realformer_nmt.cli.run_demo")


def loaded_at(stderr):
    """The update fairseq-train resumed from ("Loaded checkpoint ... (epoch e @ n updates)")."""
    found = re.findall(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", stderr)
    return int(found[-1]) if found else None


@pytest.mark.slow
def test_demo_stopped_by_its_cap_says_so_and_the_same_command_finishes_it(tmp_path):
    common = ["--max-update", "3", "--data", "data", "--save-dir", "ckpt", "--json", "out/demo.json",
              "--train-args", SMALL, "--num-examples", "2"]
    first = demo(tmp_path, *common, "--max-minutes", "0.001")
    assert first.returncode == 3, first.stderr[-3000:]
    out = first.stdout.splitlines()
    assert out[0].startswith("TRAINING STOPPED EARLY: 1 of 3 updates done (the --max-minutes 0.001 cap")
    assert "BLEU" not in first.stdout and "HYP:" not in first.stdout
    report = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert report["stopped_early"] is True and report["bleu"] is None
    assert (report["num_updates"], report["max_update"]) == (1, 3)
    assert not (tmp_path / "out" / "generate.txt").exists()  # nothing decoded
    finish = report["finish_command"]
    assert f"run: {finish}" in out[0]
    assert "--fresh" not in finish and "--max-minutes 0.001" in finish

    # the command it printed, verbatim: continues at update 1 (not from scratch)
    second = subprocess.run(shlex.split(finish), cwd=tmp_path, capture_output=True, text=True,
                            env=demo_env(), timeout=600)
    assert second.returncode == 3, second.stderr[-3000:]
    assert loaded_at(second.stderr) == 1
    assert second.stdout.startswith("TRAINING STOPPED EARLY: 2 of 3 updates done")
    report = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert (report["num_updates"], report["train_runs"], report["stopped_early"]) == (2, 2, True)

    # no cap: continues at update 2, reaches --max-update, and only then is scored
    third = demo(tmp_path, *common, "--max-minutes", "0")
    assert third.returncode == 0, third.stderr[-3000:]
    assert loaded_at(third.stderr) == 2
    assert "STOPPED EARLY" not in third.stdout and "BLEU = " in third.stdout
    report = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert report["stopped_early"] is False and report["num_updates"] == 3
    assert isinstance(report["bleu"], float) and report["num_test_sentences"] == 500
    assert "updates=3 " in third.stdout

    # a finished run is not resumed: the next run trains from scratch
    fourth = demo(tmp_path, *common, "--max-minutes", "0.001")
    assert fourth.returncode == 3 and loaded_at(fourth.stderr) is None, fourth.stderr[-3000:]
    assert fourth.stdout.startswith("TRAINING STOPPED EARLY: 1 of 3 updates done")


def test_finish_command_names_make_demo_when_make_started_it(monkeypatch):
    run_demo = load_demo_module()
    args = run_demo.parse_args(["--fresh", "--max-minutes", "5", "--train-args", "--dropout 0.2"])
    monkeypatch.setenv("MAKELEVEL", "1")
    command = run_demo.finish_command(args)
    assert command.startswith("make demo DEMO_ARGS=")
    assert shlex.split(shlex.split(command)[2].split("=", 1)[1]) == [
        "--max-minutes", "5", "--train-args", "--dropout 0.2"]
    monkeypatch.setenv("MAKELEVEL", "1")
    assert run_demo.finish_command(run_demo.parse_args([])) == "make demo"
    monkeypatch.delenv("MAKELEVEL")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])  # run as scripts/run_demo.py
    words = shlex.split(run_demo.finish_command(args))
    assert os.path.samefile(words[1], SCRIPT)
    assert words[2:] == ["--max-minutes", "5", "--train-args", "--dropout 0.2"]
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/realformer-demo"])  # the installed command
    assert shlex.split(run_demo.finish_command(args)) == ["realformer-demo", "--max-minutes", "5", "--train-args",
                                                          "--dropout 0.2"]
