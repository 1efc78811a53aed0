"""Checkpoints load weights-only through the real fairseq CLIs and the hub interface,
and booby-trapped ones are refused without their payload ever running.

One tiny corpus and one tiny ``transformer`` checkpoint (fairseq's own architecture,
so these tests do not depend on the RealFormer model code) are built per module.
"""

import argparse
import collections
import io
import os
import pickle
import pickletools
import re
import shutil
import subprocess
import zipfile

import numpy as np
import pytest
import torch
from cli_helpers import command
from conftest import BIN, REPO, USER_DIR, cli_env, trains

import realformer_nmt  # noqa: F401  (the fixes: the fairseq_fixes fixture, below)
from realformer_nmt.errors import CheckpointFileError, UnsafeCheckpointError
from realformer_tools.fairseq_fixes import safe_checkpoint_loading as checkpoint_safety
from realformer_tools.fairseq_fixes.safe_checkpoint_loading import (
    FAIRSEQ_CHECKPOINT_GLOBALS,
    fairseq_checkpoint_types,
    install_safe_checkpoint_loading,
)

# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")

SYSTEM = f"{os.system.__module__}.{os.system.__name__}"  # posix.system on Linux

TINY_MODEL = [
    "--arch", "transformer", "--cpu", "--seed", "1", "--num-workers", "0",
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--optimizer", "adam", "--lr", "5e-4",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "500", "--no-epoch-checkpoints", "--log-format", "simple",
    # BLEU validation stores numpy arrays in the meters: exercises the numpy stand-ins
    "--eval-bleu", "--eval-bleu-detok", "space",
    "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 4}',
    "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
]


def _cli(name):
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


class _Cli:
    """A fairseq CLI started in the background; ``.result()`` waits for it."""

    def __init__(self, name, *args, cwd, env_extra=None):
        env = {k: v for k, v in cli_env().items() if not k.startswith("TORCH_FORCE_")}
        env.update(env_extra or {})
        self.proc = subprocess.Popen(
            command(name, *args), cwd=cwd, env=env,  # through the launcher: the fixes to fairseq
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def result(self):
        stdout, stderr = self.proc.communicate(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode,
                                           stdout, stderr)


def _train(data, save_dir, *extra, cwd, env_extra=None):
    return _Cli("fairseq-train", data, "--user-dir", USER_DIR, *TINY_MODEL,
                "--save-dir", save_dir, *extra, cwd=cwd, env_extra=env_extra)


def _generate(data, path, cwd):
    return _Cli("fairseq-generate", data, "--user-dir", USER_DIR, "--path", path, "--cpu",
                "--beam", "2", "--batch-size", "16", "--max-len-b", "10", cwd=cwd)


def _pickle_globals(path):
    """GLOBAL names in a torch zip checkpoint (disassembled, nothing is executed)."""
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        data = archive.read(name)
    return {arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data)
            if op.name == "GLOBAL"}


class Payload:
    """Pickles as a call of os.system: what an attacker hides in a checkpoint."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Harmless:
    """An innocent class that fairseq checkpoints simply never contain."""

    def __init__(self):
        self.value = 1


# --------------------------------------------------------------------------------------
# Fixtures: one corpus, one trained checkpoint, trapped variants of it
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt_safety")


@pytest.fixture(scope="module")
@trains
def trained(work, data_bin):
    save_dir = work / "ckpt"
    proc = _train(data_bin, save_dir, "--max-epoch", "1", cwd=work).result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint = save_dir / "checkpoint_last.pt"
    assert checkpoint.is_file()
    return checkpoint


def plain_load(path):
    """torch.load, weights-only by default, with fairseq's types allowed for this load only."""
    with fairseq_checkpoint_types():
        return torch.load(path, map_location="cpu")


@pytest.fixture(scope="module")
def state(trained):
    return plain_load(trained)


def _variant(work, state, name, **extra_state):
    path = work / "variants" / name
    path.parent.mkdir(exist_ok=True)
    trapped = dict(state, extra_state=dict(state["extra_state"], **extra_state))
    torch.save(trapped, path)
    return path


@pytest.fixture(scope="module")
def marker(work):
    return work / "PAYLOAD_RAN"


@pytest.fixture(scope="module")
def booby(work, state, marker):
    return _variant(work, state, "booby.pt", payload=Payload(f"touch {marker}"))


@pytest.fixture(scope="module")
def truncated(work, trained):
    path = work / "variants" / "truncated.pt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(trained.read_bytes()[:4096])
    return path


@pytest.fixture(scope="module")
def cli(work, data_bin, trained, booby, truncated):
    """Every CLI run the tests below check, started at once (they are independent)."""
    resume_dir = work / "resume"
    shutil.copytree(trained.parent, resume_dir)
    runs = {
        "generate": _generate(data_bin, trained, cwd=work),
        "resume": _train(data_bin, resume_dir, "--max-epoch", "2", "--max-update", "4",
                         cwd=work),
        "generate-booby": _generate(data_bin, booby, cwd=work),
        # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD would turn fairseq's torch.load into a full
        # unpickle; the wrapper must refuse instead
        "restore-booby-plain": _train(data_bin, work / "restore-plain", "--restore-file", booby,
                                      "--max-update", "1", cwd=work),
        "restore-booby": _train(data_bin, work / "restore", "--restore-file", booby,
                                "--max-update", "1", cwd=work,
                                env_extra={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}),
        "finetune-booby": _train(data_bin, work / "finetune", "--finetune-from-model",
                                 booby, "--max-update", "1", cwd=work),
        "generate-truncated": _generate(data_bin, truncated, cwd=work),
    }
    try:
        return {name: run.result() for name, run in runs.items()}
    finally:
        for run in runs.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()


@pytest.fixture(autouse=True)
def _no_payload_ran(marker):
    yield
    assert not marker.exists(), "the checkpoint's payload was executed"


def _assert_refused_cli(proc, path, offending):
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("realformer_nmt: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert str(path) in lines[0] and offending in lines[0], lines[0]
    assert "weights_only" not in lines[0]


# --------------------------------------------------------------------------------------
# Real checkpoints load
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_trained_checkpoint_holds_the_types_we_allow_list(trained):
    names = _pickle_globals(trained)
    assert "argparse.Namespace" in names  # legacy-flag cfg.model
    assert "numpy.ndarray" in names  # --eval-bleu meters
    with fairseq_checkpoint_types():
        assert torch.serialization.get_unsafe_globals_in_checkpoint(str(trained)) == []


@pytest.mark.slow
def test_fairseq_generate_loads_real_checkpoint(cli):
    proc = cli["generate"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^H-\d+\t", proc.stdout, re.M), proc.stdout[-2000:]
    assert "Generate test with beam=2" in proc.stdout


def test_fairseq_train_resumes_real_checkpoint(cli):
    proc = cli["resume"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and "No existing checkpoint" not in log, log[-3000:]


def test_load_model_ensemble_and_task_in_process(trained, data_bin):
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(trained)], arg_overrides={"data": str(data_bin)}
    )
    assert len(models) == 1 and cfg.model._name == "transformer"
    meters = dict((m[1], m[3]) for m in plain_load(trained)["extra_state"]["metrics"]["valid"])
    counts = meters["_bleu_counts"]["sum"]
    assert isinstance(counts, np.ndarray) and counts.dtype == np.int64


def test_hub_interface_from_pretrained(trained, data_bin):
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(
        str(trained.parent), checkpoint_file=trained.name, data_name_or_path=str(data_bin)
    )
    assert isinstance(hub.translate("a b c", beam=1, max_len_b=5), str)


def test_fairseqs_types_are_allowed_for_the_load_only(tmp_path, monkeypatch):
    """The allow-list grows for the duration of a checkpoint load and no longer: any other
    ``torch.load`` in the process gets torch's own answer (a Namespace refused), and loading
    changes no environment variable."""
    from fairseq import checkpoint_utils

    path = tmp_path / "ns.pt"
    torch.save({"cfg": {"model": argparse.Namespace(arch="transformer", lr=[0.1])}, "model": {"w": torch.ones(2)},
                "optimizer_history": [{"num_updates": 0, "optimizer_name": "adam", "lr_scheduler_state": {}}],
                "extra_state": {"train_iterator": {"epoch": 1}}}, path)
    allowed, environ = torch.serialization.get_safe_globals(), dict(os.environ)
    with pytest.raises(pickle.UnpicklingError, match="argparse.Namespace"):
        torch.load(path, weights_only=True)
    real_load, seen = torch.load, []

    def spying_load(*args, **kwargs):
        seen.append((len(torch.serialization.get_safe_globals()), dict(os.environ)))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spying_load)
    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert loaded["cfg"].model.arch == "transformer" and loaded["cfg"].model.lr == [0.1]
    assert torch.equal(loaded["model"]["w"], torch.ones(2))
    assert seen == [(len(allowed) + len(FAIRSEQ_CHECKPOINT_GLOBALS), environ)]  # allowed while loading
    assert set(torch.serialization.get_safe_globals()) == set(allowed) and dict(os.environ) == environ
    # an entry the program had allowed itself stays allowed after a load
    monkeypatch.setattr(torch, "load", real_load)
    torch.serialization.add_safe_globals([argparse.Namespace])
    try:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert argparse.Namespace in torch.serialization.get_safe_globals()
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(allowed)


def test_numpy_values_round_trip_as_plain_numpy(tmp_path):
    values = {"f": np.float64(1.5), "i": np.int64(3), "b": np.bool_(True),
              "a": np.arange(6, dtype=np.int32).reshape(2, 3), "g": np.ones(2, ">f4")}
    torch.save(values, tmp_path / "np.pt")
    loaded = plain_load(tmp_path / "np.pt")
    for key, value in values.items():
        # same values and dtype as plain pickle gives (numpy unpickles '>f4' as native)
        assert np.array_equal(loaded[key], value)
        assert loaded[key].dtype == pickle.loads(pickle.dumps(value)).dtype
    assert type(loaded["f"]) is np.float64
    # re-saved arrays are plain numpy arrays again, not our stand-in class
    torch.save(loaded, tmp_path / "again.pt")
    assert not any("realformer" in g for g in _pickle_globals(tmp_path / "again.pt"))
    assert type(pickle.loads(pickle.dumps(loaded["a"]))) is np.ndarray
    with pytest.raises(pickle.UnpicklingError):  # the stand-in cannot be called
        checkpoint_safety.NumericArray((1,), np.dtype("O"), b"AAAAAAAA")


# --------------------------------------------------------------------------------------
# Booby-trapped checkpoints are refused and the payload never runs
# --------------------------------------------------------------------------------------


def test_fairseq_generate_refuses_payload(cli, booby):
    _assert_refused_cli(cli["generate-booby"], booby, SYSTEM)


def test_fairseq_train_restore_file_refuses_payload(cli, booby):
    _assert_refused_cli(cli["restore-booby-plain"], booby, SYSTEM)


def test_fairseq_train_restore_file_refuses_payload_even_when_forced_unsafe(cli, booby):
    _assert_refused_cli(cli["restore-booby"], booby, "without weights-only restrictions")


def test_fairseq_train_finetune_from_model_refuses_payload(cli, booby):
    _assert_refused_cli(cli["finetune-booby"], booby, SYSTEM)


def test_in_process_loaders_refuse_payload(booby, data_bin):
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    with pytest.raises(UnsafeCheckpointError, match=re.escape(SYSTEM)) as info:
        checkpoint_utils.load_model_ensemble_and_task(
            [str(booby)], arg_overrides={"data": str(data_bin)}
        )
    assert str(booby) in str(info.value)
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)
    with pytest.raises(UnsafeCheckpointError, match=re.escape(SYSTEM)):
        TransformerModel.from_pretrained(
            str(booby.parent), checkpoint_file=booby.name, data_name_or_path=str(data_bin)
        )


@pytest.mark.parametrize(
    "payload, offending",
    [
        (collections.deque([1, 2]), "collections.deque"),
        (Harmless(), Harmless.__qualname__),
        (subprocess.check_output, "subprocess.check_output"),
    ],
    ids=["deque", "custom-class", "function"],
)
def test_globals_outside_the_allow_list_are_refused(work, state, payload, offending):
    from fairseq import checkpoint_utils

    path = _variant(work, state, f"odd-{offending}.pt", odd=payload)
    with pytest.raises(UnsafeCheckpointError, match=re.escape(offending)) as info:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert "fairseq checkpoints never contain" in str(info.value)


def test_numpy_object_pointer_forgery_is_refused(tmp_path):
    # numpy.ndarray((1,), numpy.dtype("O"), b"AAAAAAAA"): an object array over forged
    # pointers. torch's usual numpy allow-list accepts this; our stand-ins must not.
    forged = (b"\x80\x02cnumpy\nndarray\nK\x01\x85"
              b"cnumpy\ndtype\nX\x01\x00\x00\x00O\x89\x88\x87R"
              b"c_codecs\nencode\nX\x08\x00\x00\x00AAAAAAAAX\x06\x00\x00\x00latin1\x86R"
              b"\x87R.")
    buffer = io.BytesIO()
    torch.save({"x": 1}, buffer)
    path = tmp_path / "forged.pt"
    with zipfile.ZipFile(buffer) as src, zipfile.ZipFile(path, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, forged if item.filename.endswith("data.pkl")
                         else src.read(item.filename))
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)
    from fairseq import checkpoint_utils

    with pytest.raises(UnsafeCheckpointError, match="numpy"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


def _with_cfg(work, state, name, section, field, value):
    cfg = dict(state["cfg"])
    if isinstance(cfg[section], argparse.Namespace):
        cfg[section] = argparse.Namespace(**{**vars(cfg[section]), field: value})
    else:
        cfg[section] = {**cfg[section], field: value}
    path = work / "variants" / name
    path.parent.mkdir(exist_ok=True)
    torch.save(dict(state, cfg=cfg), path)
    return path


def test_code_in_config_strings_is_refused_before_fairseq_evals_it(work, state, data_bin,
                                                                    marker):
    # TransformerDecoder passes cfg.adaptive_softmax_cutoff to utils.eval_str_list,
    # i.e. eval(); the string is plain data, so only the config check can stop it
    code = f"__import__('os').system('touch {marker}') or [10]"
    path = _with_cfg(work, state, "eval.pt", "model", "adaptive_softmax_cutoff", code)
    from fairseq import checkpoint_utils

    with pytest.raises(UnsafeCheckpointError, match="cfg.model.adaptive_softmax_cutoff"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(path)], arg_overrides={"data": str(data_bin)}
        )


@pytest.mark.parametrize(
    "section, field, value, refused",
    [
        ("checkpoint", "save_dir", "runs (old)", False),  # a call-like path is fine
        ("common", "wandb_project", "nmt(baseline)", False),
        ("model", "adam_betas", "(0.9, 0.98)", False),  # a literal, as fairseq writes
        ("common", "wandb_project", "os.system('id')", True),
        ("checkpoint", "save_dir", "__builtins__", True),
        ("model", "encoder_layers", "nmt(baseline)", True),  # eval()ed by fconv
    ],
)
def test_config_string_check(work, state, section, field, value, refused):
    from fairseq import checkpoint_utils

    path = _with_cfg(work, state, f"cfg-{section}-{field}-{refused}.pt", section, field, value)
    if refused:
        with pytest.raises(UnsafeCheckpointError, match=f"cfg.{section}.{field}"):
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
    else:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


# --------------------------------------------------------------------------------------
# Unreadable files give one clear sentence naming the file
# --------------------------------------------------------------------------------------


def test_unreadable_files(cli, truncated, tmp_path):
    from fairseq import checkpoint_utils

    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    text = tmp_path / "text.pt"
    text.write_text("not a checkpoint\n")
    for path in (truncated, empty, text, tmp_path / "missing.pt"):
        with pytest.raises(CheckpointFileError) as info:
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        message = str(info.value)
        assert message.startswith(f"cannot read checkpoint {path}: ") and "\n" not in message
    with pytest.raises(CheckpointFileError, match="no such file"):
        checkpoint_utils.load_model_ensemble_and_task([str(tmp_path / "missing.pt")])

    proc = cli["generate-truncated"]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"realformer_nmt: error: cannot read checkpoint {truncated}" in proc.stderr


# --------------------------------------------------------------------------------------
# The allow-list and the wrapper themselves
# --------------------------------------------------------------------------------------


def test_allow_list_holds_only_data_types():
    import builtins
    import inspect

    forbidden_modules = {"os", "posix", "nt", "sys", "subprocess", "importlib", "pickle",
                         "functools", "operator", "pydoc", "runpy", "shutil", "io"}
    for entry in FAIRSEQ_CHECKPOINT_GLOBALS:
        obj, name = entry if isinstance(entry, tuple) else (entry, None)
        assert not inspect.ismodule(obj), entry
        module = (name or getattr(obj, "__module__", "") or "").split(".")[0]
        assert module not in forbidden_modules, entry
        if getattr(obj, "__module__", None) == "builtins":
            assert obj in (dict, list, int), entry  # never eval/exec/getattr/...
    real_numpy = {np.ndarray, np.dtype, np.lib.stride_tricks.as_strided}
    assert not real_numpy & {e[0] if isinstance(e, tuple) else e
                             for e in FAIRSEQ_CHECKPOINT_GLOBALS}
    assert not {builtins.eval, builtins.exec, builtins.getattr} & set(
        e[0] if isinstance(e, tuple) else e for e in FAIRSEQ_CHECKPOINT_GLOBALS)


def test_install_is_idempotent():
    from fairseq import checkpoint_utils

    from realformer_tools import fairseq_fixes as fairseq_patches

    before = checkpoint_utils.load_checkpoint_to_cpu
    count = len(torch.serialization.get_safe_globals())
    install_safe_checkpoint_loading()
    fairseq_patches.install_for_good()
    assert checkpoint_utils.load_checkpoint_to_cpu is before
    assert before.__realformer_safe__
    assert not getattr(before.__wrapped__, "__realformer_safe__", False)  # wrapped once
    assert len(torch.serialization.get_safe_globals()) == count  # nothing allow-listed process-wide


def test_nothing_in_the_repo_disables_weights_only():
    unsafe = re.compile(
        r"weights_only\s*=\s*False"

        r"|pickle_module\s*="
        r"|TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD['\"]?\s*\]?\s*="
        r"|(export|setdefault\(|putenv\()\s*['\"]?TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    )
    roots = [REPO / "realformer_nmt", REPO / "realformer_tools", REPO / "scripts"]
    files = [p for root in roots if root.exists() for p in root.rglob("*")
             if p.suffix in {".py", ".sh", ".cfg", ".toml", ".yaml", ".yml"}]
    files += [p for p in (REPO / "Makefile", REPO / "setup.py") if p.exists()]
    offenders = [f"{p}: {m.group(0)}" for p in files
                 for m in unsafe.finditer(p.read_text(errors="replace"))]
    assert not offenders
