"""``import realformer_nmt`` (what ``--user-dir realformer_nmt`` does) registers the
models, the task and the criterions and changes nothing else in the process, whatever the
environment says; the fixes to fairseq are installed only by the launcher
(``realformer_tools.launch``), in its process, and then exactly the ones
docs/reliability.md lists, each put back when its block ends.

Measured in fresh interpreters by ``tests/import_snapshot.py``: every attribute of every
loaded ``fairseq``, ``fairseq_cli``, ``torch`` and ``numpy`` module (class dicts and
module-level containers included), torch's weights-only allow-list, ``sys.excepthook``,
the root logger, ``os.environ``, ``sys.path``, the warning filters and the exit hooks,
before and after the import. (Run against the code before this test existed, the same
measurement listed 43 changes: 20 fairseq functions and classes replaced, ``numpy.compat``
added, 17 types added to torch's allow-list, ``sys.excepthook`` and an exit hook.)
"""

import json
import subprocess
import sys

import pytest
from conftest import REPO, cli_env

# the launcher's variables (REALFORMER_NMT_CPU_BF16: the earlier name of the bf16 one), and the one
# the plugin read until the fixes left it
SWITCHES = ("REALFORMER_NMT_DATA_FIXES", "REALFORMER_NMT_BF16_DECODING", "REALFORMER_NMT_CPU_BF16",
            "REALFORMER_NMT_FAIRSEQ_FIXES")

SNAPSHOT = str(REPO / "tests" / "import_snapshot.py")

# What the fixes replace, by fixes module (the names fairseq looks them up by)
FIXED = {
    "safe_checkpoint_loading": ["fairseq.checkpoint_utils:load_checkpoint_to_cpu",
                                "fairseq.checkpoint_utils:load_model_ensemble_and_task",
                                "fairseq.trainer:Trainer.load_checkpoint"],
    "atomic_checkpoint_copies": ["fairseq.file_io:PathManager.copy"],
    "interactive_utf8": ["fairseq_cli.interactive:buffered_read"],
    "batch_thread_exit": ["fairseq.data.iterators:BufferedIterator._create_consumer"],
    "data_dir_checks": ["fairseq.data.indexed_dataset:make_dataset",
                        "fairseq.tasks.translation:TranslationTask.setup_task"],
    "numpy2_compat": ["fairseq.data.data_utils:get_buckets", "fairseq.data.bucket_pad_length_dataset:get_buckets"],
    "cpu_distributed": ["fairseq.models.distributed_fairseq_model:DistributedDataParallel",
                        "fairseq.distributed.utils:call_main",
                        "fairseq.distributed_utils:call_main"],  # fairseq's alias of fairseq.distributed.utils
    "arch_choices": ["fairseq.options:add_model_args"],
    "train_preflight": ["fairseq_cli.train:main", "fairseq_cli.train:convert_namespace_to_omegaconf",
                        "fairseq_cli.generate:convert_namespace_to_omegaconf",
                        "fairseq_cli.validate:convert_namespace_to_omegaconf"],
    "bf16_without_tpu": ["fairseq.options:parse_args_and_arch", "fairseq.trainer:Trainer.__init__"],
    "preprocess_checks": ["fairseq_cli.preprocess:main"],
    "one_line_errors": [],  # sys.excepthook (below)
}
BF16_DECODING_FIXED = {"bf16_decoding": ["fairseq_cli.generate:main", "fairseq_cli.interactive:main",
                                         "fairseq_cli.eval_lm:main",
                                         "fairseq.models.fairseq_model:BaseFairseqModel.prepare_for_inference_"]}
DATA_FIXED = {"keep_last_batch": ["fairseq.data.data_utils:batch_by_size"],
              "epoch_workers": ["fairseq.data.iterators:EpochBatchIterator.next_epoch_itr"],
              "resume_batches": ["fairseq.trainer:Trainer.get_train_iterator"]}
# besides: numpy2_compat adds numpy.compat, batch_thread_exit an exit hook, one_line_errors
# replaces sys.excepthook, and the launcher wraps torch.multiprocessing.spawn (its ranks get the fixes)
FIXES_BESIDES = ["added numpy:compat", "changed excepthook", "changed exit_hooks"]
LAUNCHER_REPLACES = ["torch.multiprocessing:spawn"]


def _env(**switches):
    env = cli_env()
    for name in SWITCHES:
        env.pop(name, None)
    env.update(switches)
    return env


def _start(*args, env):
    return subprocess.Popen([sys.executable, SNAPSHOT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)


def _result(proc):
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def snapshots():
    """Every measurement, started at once (independent processes)."""
    procs = {
        "plain": _start("host", env=_env()),
        "switches": _start("host", env=_env(**{name: "1" for name in SWITCHES})),
        "launcher": _start("launcher", env=_env()),
        "bare": _start("bare", env=_env()),
    }
    try:
        out = {name: _result(proc) for name, proc in procs.items()}
        # the same fairseq modules the bare import loaded, imported without the plugin
        out["fairseq"] = _result(_start("fairseq", *out["bare"]["fairseq_modules"], env=_env()))
        return out
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _replaced(changes):
    return sorted(c.split(" ", 1)[1] for c in changes if c.startswith("replaced "))


def _besides(changes):
    return sorted(c.split(":", 1)[0] if c.startswith("changed ") else c for c in changes
                  if not c.startswith("replaced "))


def test_importing_the_plugin_changes_nothing_but_the_registries(snapshots):
    """In a process that has loaded what fairseq's CLIs load, then ``import realformer_nmt``
    with both switches unset: no attribute of fairseq, fairseq_cli, torch or numpy replaced,
    added or removed, torch's allow-list, sys.excepthook, the root logger, the environment,
    sys.path, the warning filters and the exit hooks as they were; fairseq's registries grew."""
    plain = snapshots["plain"]
    assert plain["changes"] == []
    registered = set(plain["registered"])
    for entry in ("fairseq.models:ARCH_MODEL_REGISTRY['realformer_transformer']",
                  "fairseq.models:ARCH_MODEL_REGISTRY['realformer_bert']",
                  "fairseq.models:MODEL_REGISTRY['realformer_transformer']",
                  "fairseq.tasks:TASK_REGISTRY['masked_lm_nsp']",
                  "fairseq.criterions:CRITERION_REGISTRY['masked_lm_nsp']"):
        assert entry in registered, sorted(registered)[:20]
    assert not any(m.startswith("realformer_tools") for m in plain["new_modules"])


def test_a_bare_import_leaves_the_process_as_importing_fairseq_does(snapshots):
    """``import realformer_nmt`` first thing in a program: the root logger, sys.excepthook,
    torch's allow-list, the environment, the exit hooks and numpy's names are what importing
    the same fairseq modules gives without the plugin (fairseq 0.12's own imports configure
    the root logger: ``wav2vec2_classification`` calls ``logging.basicConfig``)."""
    bare, fairseq = snapshots["bare"], snapshots["fairseq"]
    assert bare.pop("fairseq_modules") == fairseq.pop("fairseq_modules")
    assert bare == fairseq
    assert bare["excepthook_is_pythons"] and "compat" not in bare["numpy_names"]


def test_no_environment_variable_makes_the_import_install_anything(snapshots):
    """The launcher's switches (and the one the plugin read before) set to 1 in a plain
    fairseq process: the import changes nothing either; the fixes live in the launcher's
    process only."""
    assert snapshots["switches"]["changes"] == []
    assert not any(m.startswith("realformer_tools") for m in snapshots["switches"]["new_modules"])


def test_the_launcher_installs_exactly_the_listed_fixes_and_puts_them_back(snapshots):
    """Inside the launcher's ``fixes_installed`` (every group): exactly the attributes listed
    here per fix are replaced, the allow-list stays torch's (fairseq's types are allowed per
    load only); after the block nothing is left changed (the exit hook is unregistered, which
    ``atexit``'s count does not show: tests/test_launcher.py checks it is not called)."""
    inside, after = snapshots["launcher"]["inside"], snapshots["launcher"]["after"]
    expected = sorted(name for group in (FIXED, BF16_DECODING_FIXED, DATA_FIXED) for names in group.values()
                      for name in names)
    assert _replaced(inside) == sorted(expected + LAUNCHER_REPLACES)
    assert _besides(inside) == sorted(FIXES_BESIDES)
    assert not any("safe_globals" in c or "_weights_only_unpickler" in c for c in inside)
    assert [c for c in after if not c.startswith("changed exit_hooks")] == []


def test_every_fixes_module_is_accounted_for():
    """The lists above are the fixes' own ``REPLACES``, group by group."""
    from realformer_tools import fairseq_fixes

    def listed(group):
        return {fairseq_fixes.short_name(fix): sorted(s for s in fix.REPLACES if ":" in s and
                                                      not s.startswith(("sys:", "numpy:"))) for fix in group}

    assert listed(fairseq_fixes.ALWAYS_ON) == {name: sorted(specs) for name, specs in FIXED.items()}
    assert listed(fairseq_fixes.BF16_DECODING) == {name: sorted(specs) for name, specs in BF16_DECODING_FIXED.items()}
    assert listed(fairseq_fixes.DATA_FIXES) == {name: sorted(specs) for name, specs in DATA_FIXED.items()}
