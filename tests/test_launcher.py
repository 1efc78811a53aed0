"""The launcher (``realformer-fairseq`` / ``python -m realformer_tools.launch``): a fairseq
command with the fixes to fairseq 0.12 installed in its process and in the ranks it starts,
named in one log line before the command's first (each fix's own line at ``--verbose`` and at
debug level); an input it refuses is the only line printed; its scoring commands keep every
sentence; ``--bf16`` is no TPU flag; in a program, ``fixes_installed`` leaves the process as it
found it."""

import contextlib
import json
import re
import shlex
import subprocess
import sys

import pytest
from cli_helpers import TINY_FLAGS, command, run, write_reversal_corpus
from conftest import REPO, USER_DIR, cli_env, trains
from test_docs import logical_lines, section, split_markdown

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


def test_the_fixes_are_announced_in_one_line_before_the_commands_first(checkpoint):
    """fairseq-train's log begins with the launcher's one line naming every fix installed and
    where they are explained; no line per fix (those are at debug level)."""
    _, log = checkpoint
    from realformer_tools import fairseq_fixes

    lines = log.splitlines()
    ours = [line for line in lines if "| realformer_tools.fairseq_fixes |" in line]
    assert len(ours) == 1 and ours[0] == lines[0], lines[:3]
    names = ours[0].split("fairseq fixes: ", 1)[1].split(" (", 1)[0].split(", ")
    assert names == [fairseq_fixes.short_name(fix) for fix in fairseq_fixes.ALWAYS_ON] + ["ranks"]
    assert "docs/reliability.md#fixes-to-fairseq-itself" in ours[0] and "--verbose" in ours[0]
    assert "fairseq_cli.train" in lines[1]  # the command's own first line follows


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_and_debug_give_one_line_per_fix(tmp_path, caplog, verbose):
    """``--verbose``: one INFO line per fix, naming what it changes and replaces; without it the
    same lines are logged at DEBUG (shown with LOGLEVEL=DEBUG)."""
    import logging

    from realformer_tools import fairseq_fixes

    raw = tmp_path / "raw"
    raw.mkdir()
    write_reversal_corpus(raw, [("train", 20), ("valid", 5)])
    caplog.set_level(logging.DEBUG, logger=fairseq_fixes.__name__)
    status = launch.main([*["--verbose"] * verbose, "fairseq-preprocess", "--source-lang", "src", "--target-lang",
                          "tgt", "--trainpref", raw / "train", "--validpref", raw / "valid", "--destdir",
                          tmp_path / "bin", "--workers", "1"])
    assert status == 0
    records = [r for r in caplog.records if r.name == fairseq_fixes.__name__]
    assert records[0].getMessage().startswith("fairseq fixes: ") and records[0].levelno == logging.INFO
    per_fix = records[1:]
    assert [r.getMessage().split(":", 1)[0] for r in per_fix] == \
        [f"fairseq fix {fairseq_fixes.short_name(f)}" for f in fairseq_fixes.ALWAYS_ON] + ["fairseq fix ranks"]
    assert {r.levelno for r in per_fix} == {logging.INFO if verbose else logging.DEBUG}
    for record, fix in zip(per_fix, fairseq_fixes.ALWAYS_ON):
        assert fix.CHANGES in record.getMessage() and all(spec in record.getMessage() for spec in fix.REPLACES)


@pytest.mark.parametrize("subset", sorted(TEST_SIZES))
def test_generate_translates_every_sentence(data, checkpoint, subset):
    """fairseq-generate through the launcher: one hypothesis per test sentence; fairseq alone
    (the same checkpoint, torch's weights-only loading switched off for this file we wrote)
    leaves the last ``len % 8`` out (fairseq issue 5036: this test fails once it does not)."""
    path, _ = checkpoint
    args = [data, "--user-dir", USER_DIR, "--path", path, "--gen-subset", subset, "--beam", 1,
            "--batch-size", 64, "--cpu", "--max-len-a", 0, "--max-len-b", 10]  # untrained: short hypotheses
    launched = run("fairseq-generate", *args)
    assert _hypotheses(launched.stdout) == TEST_SIZES[subset]
    assert re.search(r"\| fairseq fixes: [^\n]*\bkeep_last_batch\b", launched.stdout)
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
with fixes_installed(data_fixes=True, bf16_decoding=True, every_sentence=True, verbose=True):
    inside = state()
    again = len(records)
    with fixes_installed(data_fixes=True, bf16_decoding=True):  # nested: nothing new, nothing said
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
    lists is replaced, one line names them and (verbose) one line per fix follows; nested,
    nothing more; afterwards every
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

    fixes = fairseq_fixes.chosen(data_fixes=True, bf16_decoding=True, every_sentence=True)
    names = [fairseq_fixes.short_name(f) for f in fixes] + ["ranks"]
    assert result["lines"][0].startswith(f"fairseq fixes: {', '.join(names)} (")
    assert [line.split(":", 1)[0] for line in result["lines"][1:]] == [f"fairseq fix {name}" for name in names]


@pytest.mark.parametrize("parser, decoding, said", [
    ("generation", False, "decodes in float32 as fairseq does (the launcher's --bf16-decoding casts the model)"),
    ("generation", True, "decodes in bfloat16"),
    ("training", False, "trains in bfloat16 through fairseq's FP16Optimizer")])
def test_the_bf16_line_says_what_the_command_does(parser, decoding, said, caplog):
    """``--cpu --bf16``: the bf16_without_tpu fix's one line names decoding for fairseq-generate
    (in bfloat16 only where the opt-in bf16_decoding fix is installed; no optimizer there) and
    the FP16Optimizer for fairseq-train."""
    import logging

    from fairseq import options

    from realformer_tools.fairseq_fixes import bf16_without_tpu, fixes_installed

    parse = bf16_without_tpu.bf16_without_tpu(options.parse_args_and_arch)  # the fix's wrapper, installed nowhere
    words = ["/nonexistent", "--cpu", "--bf16"] + (["--path", "x.pt"] if parser == "generation" else
                                                    ["--arch", "transformer"])
    with caplog.at_level(logging.INFO, logger=bf16_without_tpu.__name__), \
            (fixes_installed(bf16_decoding=True, quiet=True) if decoding else contextlib.nullcontext()):
        args = parse(getattr(options, f"get_{parser}_parser")(), input_args=words)
    lines = [r.getMessage() for r in caplog.records if "--bf16 without a TPU" in r.getMessage()]
    assert not args.tpu and len(lines) == 1 and said in lines[0]
    assert ("FP16Optimizer" in lines[0]) == (parser == "training")


def test_bf16_without_cpu_is_no_tpu_under_the_default_fixes():
    """``fairseq-train --bf16`` without ``--cpu`` (a GPU user's command): fairseq 0.12 alone sets
    ``tpu`` (and then asks torch_xla for a device); under the launcher's default fixes ``tpu``
    stays off where torch_xla cannot be imported, so the run trains in bfloat16 on its GPU (on
    CPU here)."""
    from fairseq import options

    from realformer_tools.fairseq_fixes import bf16_without_tpu, fixes_installed

    words = ["/nonexistent", "--arch", "transformer", "--bf16"]
    fairseq_alone = options.parse_args_and_arch(options.get_training_parser(), input_args=words)
    assert not getattr(options.parse_args_and_arch, "__realformer_fixed__", False) and fairseq_alone.tpu
    with fixes_installed(quiet=True):  # the launcher's defaults: no group asked for
        fixed = options.parse_args_and_arch(options.get_training_parser(), input_args=words)
    assert fixed.bf16 and not fixed.cpu
    assert fixed.tpu == bf16_without_tpu.tpu_possible() and bf16_without_tpu.tpu_possible() is False


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
    monkeypatch.setenv(launch.BF16_DECODING_ENV, "yes")
    assert launch.main(["fairseq-train"]) == 2
    assert "REALFORMER_NMT_BF16_DECODING='yes': set it to 1 or 0" in capsys.readouterr().err
    monkeypatch.setenv(launch.BF16_DECODING_ENV, "1")
    monkeypatch.setenv(launch.DATA_FIXES_ENV, "0")
    assert launch.parse(["fairseq-generate", "x"]) == (
        {"data_fixes": False, "bf16_decoding": True, "verbose": False}, "fairseq-generate", ["x"])
    assert launch.parse(["--data-fixes", "/venv/bin/fairseq-train", "-h"])[0]["data_fixes"]


def test_the_earlier_bf16_names_still_ask_for_bf16_decoding(monkeypatch):
    monkeypatch.delenv(launch.BF16_DECODING_ENV, raising=False)
    monkeypatch.delenv(launch.CPU_BF16_ENV, raising=False)
    assert not launch.parse(["fairseq-generate", "x"])[0]["bf16_decoding"]
    assert launch.parse(["--cpu-bf16", "fairseq-generate", "x"])[0]["bf16_decoding"]
    monkeypatch.setenv(launch.CPU_BF16_ENV, "1")
    assert launch.parse(["fairseq-generate", "x"])[0]["bf16_decoding"]


def test_help_names_the_options(capsys):
    assert launch.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: realformer-fairseq [--data-fixes] [--bf16-decoding] [--verbose] FAIRSEQ_COMMAND")
    assert launch.DATA_FIXES_ENV in out and launch.BF16_DECODING_ENV in out and "--cpu-bf16" in out


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


def _readme_gpu_training(work):
    """The launcher's arguments in the README's "On a GPU" fairseq-train command, with the
    eight-GPU values its comment gives and ``$WORK`` = ``work``."""
    blocks, _ = split_markdown(section("README.md", "On a GPU"))
    lines = next(logical_lines(code) for lang, _, code in blocks if lang == "bash" and "fairseq-train" in code)
    settings, eight = lines[0].split("# eight GPUs:")
    values = dict(word.split("=", 1) for word in shlex.split(settings))
    values.update(re.findall(r"(\w+)=(\S+)", eight), WORK=str(work), USER_DIR=USER_DIR)
    words = shlex.split(re.sub(r"\$(\w+)", lambda m: values[m.group(1)], lines[1]))
    assert words[:2] == ["realformer-fairseq", "fairseq-train"] and values["GPUS"] == "8", lines
    return words[1:]


def _refusals(data, tmp):
    """{case: (launcher arguments, exit status, words of the one line, path that must not exist)}"""
    raw = tmp / "raw"
    raw.mkdir()
    write_reversal_corpus(raw, [("train", 30), ("test", 21)])
    (raw / "short.src").write_text((raw / "test.src").read_text())
    (raw / "short.tgt").write_text("".join((raw / "test.tgt").read_text().splitlines(keepends=True)[:20]))
    (raw / "latin1.src").write_bytes(b"a b\nc d\ncaf\xe9 e\n")
    (raw / "latin1.tgt").write_bytes(b"B A\nD C\nE F\n")
    train = ["--arch", "transformer", "--cpu", "--max-update", "1", "--save-dir", tmp / "save"]
    prep = ["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
            "--workers", "1", "--destdir", tmp / "bin"]
    # plain fairseq binarizes a 21-line source against its 20-line target (valid and test)
    unequal = tmp / "unequal"
    run("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
        "--validpref", raw / "short", "--testpref", raw / "short", "--workers", "1", "--destdir", unequal, fixes=False)
    counts = f"{unequal}/{{0}}.src-tgt.src.idx has 21 examples but {unequal}/{{0}}.src-tgt.tgt.idx has 20"
    return {
        "missing data folder": (["fairseq-train", tmp / "missing", *train], 1,
                                f"data directory {str(tmp / 'missing')!r} does not exist", tmp / "save"),
        "missing data folder, two ranks": (["fairseq-train", tmp / "missing", *train, "--distributed-world-size",
                                            "2"], 1, f"data directory {str(tmp / 'missing')!r} does not exist",
                                           tmp / "save"),
        "the README's eight-GPU command, no data": (_readme_gpu_training(tmp / "work"), 1,
                                                    f"data directory {str(tmp / 'work' / 'data')!r} does not exist",
                                                    tmp / "work"),
        "train: valid pairs unequal": (["fairseq-train", unequal, *train], 1, counts.format("valid"), tmp / "save"),
        "generate: test pairs unequal": (["fairseq-generate", unequal, "--path", tmp / "never-read.pt", "--cpu",
                                          "--results-path", tmp / "generated"], 1, counts.format("test"),
                                         tmp / "generated"),
        "fp16 on cpu": (["fairseq-train", data, *train, "--fp16"], 1, "--fp16 trains on CUDA GPUs only",
                        tmp / "save"),
        "mistyped arch": (["fairseq-train", data, *train, "--arch", "transfomer"], 2,
                          "--arch 'transfomer' is not a registered architecture: did you mean transformer",
                          tmp / "save"),
        "line counts differ": ([*prep, "--testpref", raw / "short"], 1,
                               f"{raw / 'short.src'} has 21 lines but {raw / 'short.tgt'} has 20", tmp / "bin"),
        "not utf-8": ([*prep, "--testpref", raw / "latin1"], 1,
                      f"{raw / 'latin1.src'} is not UTF-8: line 3, byte 4 of the line (0xe9)", tmp / "bin"),
    }


@pytest.mark.slow
def test_a_refused_input_is_the_only_line_printed(data, tmp_path):
    """Each input the launcher refuses: one line on stderr (no announcement, no Hydra warning
    before it, nothing on stdout), the status of its kind (2 for a usage error, as argparse's),
    and nothing written: no --save-dir, no --destdir. Several ranks (``--cpu
    --distributed-world-size 2``; the README's eight-GPU command, with its ``--bf16`` note held
    back) are refused in the process that would start them; a split whose source and target
    counts differ (binarized by plain fairseq) is refused before fairseq-train or -generate logs."""
    from concurrent.futures import ThreadPoolExecutor

    env = {k: v for k, v in cli_env().items() if k != "PYTHONWARNINGS"}
    cases = _refusals(data, tmp_path)

    def launched(args):
        return subprocess.run([sys.executable, "-m", "realformer_tools.launch", *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(2) as pool:
        procs = dict(zip(cases, pool.map(launched, [args for args, _, _, _ in cases.values()])))
    for case, (_, status, words, written) in cases.items():
        proc = procs[case]
        assert (proc.returncode, proc.stdout) == (status, ""), (case, proc.stdout[-2000:], proc.stderr[-2000:])
        assert proc.stderr.splitlines() == [f"realformer_nmt: error: {proc.stderr.split(': error: ', 1)[1].strip()}"]
        assert words in proc.stderr, (case, proc.stderr)
        assert not written.exists(), case


def test_the_command_line_helper_uses_the_launcher():
    assert command("fairseq-train", "x", data_fixes=True)[1:5] == ["-m", "realformer_tools.launch", "--data-fixes",
                                                                   "fairseq-train"]
