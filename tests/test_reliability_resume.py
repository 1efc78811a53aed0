"""Killed training resumes, checkpoint copies are atomic, and CPU training is deterministic.

All CLI tests go through the real ``fairseq-train`` with ``--arch realformer_transformer``:
a run to be killed in a process of its own, the runs that are not (the uninterrupted
reference, each resume) in the test process (``inprocess.run_in_process``: the launcher's
``main``, the same command line).

What fairseq 0.12 guarantees when a run is resumed from ``checkpoint_last.pt`` with the
same command line (measured here: on CPU the resumed run is bit-identical to an
uninterrupted one, whether it resumes at update 5 or at a random kill point):

* data order: batches are shuffled with ``seed + epoch`` (``EpochBatchIterator``), so an
  epoch's batch order does not depend on when the process started. What each batch holds is
  drawn once, with ``seed +`` the epoch the process created its iterator in: fairseq alone
  builds a run resumed in epoch 2 or later other batches, and the data fix
  ``resume_batches`` builds them as in epoch 1
  (``tests/test_compare_backbones.py::test_resumed_run_is_bit_identical_to_an_uninterrupted_one``).
  The tests here resume within the first epoch (400 sentences, one per update, 40 updates);
* iterator position: ``extra_state["train_iterator"]`` stores the epoch and
  ``iterations_in_epoch``; the resumed iterator skips the batches already consumed, so a
  mid-epoch checkpoint continues with the next batch;
* randomness: ``Trainer._set_seed`` reseeds torch with ``seed + num_updates`` before every
  update, so dropout masks depend on the update number only (validation and saving,
  which happen at different times in different runs, do not shift them);
* optimizer (Adam moments, step) and lr-scheduler state, the update counter and the
  best validation loss are restored from the checkpoint.

What it does not guarantee:

* GPU runs: non-deterministic CUDA kernels (atomics in scatter/index_add, cuDNN/cuBLAS
  algorithm choice) make even two uninterrupted runs differ slightly;
* a different batching or world size (``--max-tokens``, ``--batch-size``,
  ``--update-freq``, number of GPUs) changes the batches: the iterator position is an
  index into the new batch list, so data is skipped or repeated;
* ``--reset-optimizer`` / ``--reset-lr-scheduler`` / ``--reset-dataloader`` /
  ``--reset-meters`` deliberately discard the corresponding state;
* a different thread count or BLAS library may change float summation order (these
  tests pin ``OMP_NUM_THREADS=1``, which also keeps them fast on a shared 2-core box).

Kills at any moment, including during checkpoint saves, must leave a loadable
``checkpoint_last.pt``: fairseq renames its first checkpoint into place atomically but
copies it onto ``checkpoint_last.pt``/``checkpoint_best.pt`` in place;
``realformer_tools.fairseq_fixes.atomic_checkpoint_copies`` (one of the fixes
the launcher installs; these runs go through it) makes those copies
atomic. The copy is killed at a known moment through a test-only ``sitecustomize``
(``tests/pause_copy``: the copy announces itself in the log and waits); the kill times of
the other tests come from seeded random generators.
"""

import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from cli_helpers import TINY_FLAGS, command
from conftest import USER_DIR, cli_env, trains
from fairseq import file_io
from fairseq.file_io import PathManager
from inprocess import run_in_process
from pause_copy.sitecustomize import FOLDER as PAUSE_FOLDER
from pause_copy.sitecustomize import PAUSE_ENV, PAUSE_MARKER

from realformer_tools import fairseq_fixes as fairseq_patches
from realformer_tools.fairseq_fixes import atomic_checkpoint_copies as atomic_checkpoints
from realformer_tools.fairseq_fixes import safe_checkpoint_loading

# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")

MAX_UPDATE = 40
# Bigger than TINY_FLAGS' model (8 MB checkpoints) and one sentence per update, so that
# a good part of each cycle is spent writing checkpoints; validation in one batch.
RESUME_FLAGS = [
    *TINY_FLAGS,
    "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
    "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
    "--batch-size", "1", "--batch-size-valid", "40", "--max-update", str(MAX_UPDATE),
]
# Measured: 0.0 (bit-identical parameters and validation loss) on CPU. The margin only
# allows for a platform whose kernels are not run-to-run reproducible.
RESUME_TOLERANCE = 1e-6
LOADED = re.compile(r"Loaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)")


def train_args(data_bin, save_dir, *extra):
    return [data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer", "--save-dir", save_dir,
            *RESUME_FLAGS, *extra]


def train_cmd(data_bin, save_dir, *extra):
    """fairseq-train through the launcher with its data fixes (the resumed batches of resume_batches)."""
    return command("fairseq-train", *train_args(data_bin, save_dir, *extra), data_fixes=True)


def train_here(data_bin, save_dir, *extra):
    """The same command in this process (tests/inprocess.py: the launcher's main, its data fixes): a
    run that is not killed needs no process of its own. Its log is stdout and stderr."""
    return run_in_process("fairseq-train", *train_args(data_bin, save_dir, *extra), data_fixes=True, check=False)


def start(cmd, log_path, env=None):
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**cli_env(), **(env or {})})
    log.close()  # the child keeps its own descriptor
    return proc


def wait_for_line(proc, log_path, marker, timeout=300):
    """Wait until the running ``proc`` has written a line containing ``marker`` to its log."""
    deadline = time.time() + timeout
    while marker not in log_path.read_text():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.time() < deadline, f"no {marker!r} in the log after {timeout} s"
        time.sleep(0.01)


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "training ended before it was killed"


def num_updates(state):
    return state["optimizer_history"][-1]["num_updates"]


def load(path):
    with safe_checkpoint_loading.fairseq_checkpoint_types():  # weights-only, fairseq's types allowed
        return torch.load(path)


def compare(a, b):
    """(max abs parameter difference, |val_loss difference|) of two checkpoints."""
    assert a["model"].keys() == b["model"].keys()
    param = max((a["model"][k].double() - b["model"][k].double()).abs().max().item()
                for k in a["model"])
    val = abs(a["extra_state"]["val_loss"] - b["extra_state"]["val_loss"])
    return param, val


@pytest.fixture(scope="module")
@trains
def reference(data_bin, tmp_path_factory):
    """An uninterrupted run with the resume tests' flags (in this process), run when first asked for."""
    save = tmp_path_factory.mktemp("reference")
    done = []

    def result():
        if not done:
            proc = train_here(data_bin, save, "--save-interval-updates", 10)
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
            done.append(True)
        state = load(save / "checkpoint_last.pt")
        assert num_updates(state) == MAX_UPDATE
        return state

    return result


# --------------------------------------------------------------------------------------
# Unit level: the atomic copy
# --------------------------------------------------------------------------------------


def _two_checkpoints(tmp_path):
    old, new = tmp_path / "checkpoint_last.pt", tmp_path / "checkpoint_1_5.pt"
    torch.save({"tag": "old", "w": torch.zeros(50_000)}, old)
    torch.save({"tag": "new", "w": torch.ones(200_000)}, new)
    return new, old


def test_copy_replaces_destination_and_leaves_no_temp_file(tmp_path):
    src, dst = _two_checkpoints(tmp_path)
    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
    assert load(dst)["tag"] == "new"
    assert {p.name for p in tmp_path.iterdir()} == {dst.name, src.name}


def test_copy_failing_midway_keeps_the_old_destination(tmp_path, monkeypatch):
    src, dst = _two_checkpoints(tmp_path)
    before = dst.read_bytes()

    def half_then_disk_full(fsrc, fdst, length=0):
        fdst.write(fsrc.read(src.stat().st_size // 2))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", half_then_disk_full)
    with pytest.raises(OSError, match="No space left"):
        PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == before
    assert load(dst)["tag"] == "old"
    assert {p.name for p in tmp_path.iterdir()} == {dst.name, src.name}


@pytest.mark.skipif(not getattr(shutil, "_USE_CP_SENDFILE", False), reason="needs sendfile")
def test_fairseqs_own_copy_failing_midway_truncates_the_destination(tmp_path, monkeypatch):
    """The control: the same fault under fairseq's original copy destroys the old file."""
    src, dst = _two_checkpoints(tmp_path)
    real_sendfile, calls = os.sendfile, []

    def half_then_disk_full(out_fd, in_fd, offset, count):
        if calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        calls.append(count)
        return real_sendfile(out_fd, in_fd, offset, min(count, src.stat().st_size // 2))

    monkeypatch.setattr(os, "sendfile", half_then_disk_full)
    monkeypatch.setattr(file_io, "IOPathManager", None)  # fairseq's shutil.copyfile branch
    original = PathManager.copy.__wrapped__
    with pytest.raises(OSError, match="No space left"):
        original(str(src), str(dst), overwrite=True)
    assert 0 < dst.stat().st_size < src.stat().st_size
    with pytest.raises(RuntimeError, match="failed reading zip archive"):
        load(dst)


def test_install_is_idempotent():
    wrapped = PathManager.copy
    atomic_checkpoints.install_atomic_checkpoint_copy()
    fairseq_patches.install_for_good()
    assert PathManager.copy is wrapped
    assert wrapped.__realformer_atomic__
    assert not getattr(wrapped.__wrapped__, "__realformer_atomic__", False)  # no double wrap


def test_remote_paths_fall_through_to_fairseqs_copy(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(file_io, "IOPathManager", None)
    monkeypatch.setattr(PathManager, "path_requires_pathmanager",
                        staticmethod(lambda path: path.startswith("mem://")))
    monkeypatch.setattr(shutil, "copyfile", lambda s, d: calls.append((s, d)) or d)
    assert PathManager.copy("mem://a/checkpoint_1_5.pt", "mem://a/checkpoint_last.pt", True)
    assert calls == [("mem://a/checkpoint_1_5.pt", "mem://a/checkpoint_last.pt")]


def test_the_launcher_installs_the_atomic_copy_and_the_plugin_does_not():
    """A fresh interpreter: ``import realformer_nmt`` (what --user-dir does) leaves fairseq's own
    copy, whatever the environment; inside the launcher's ``fixes_installed`` the copy is atomic."""
    code = ("import sys, realformer_nmt; from fairseq.file_io import PathManager; "
            "from realformer_tools.launch import fixes_installed\n"
            "print(getattr(PathManager.copy, '__realformer_atomic__', False))\n"
            "with fixes_installed(quiet=True): print(getattr(PathManager.copy, '__realformer_atomic__', False))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(cli_env(), REALFORMER_NMT_FAIRSEQ_FIXES="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["False", "True"], proc.stdout


# --------------------------------------------------------------------------------------
# Through fairseq-train: kill -9, resume, compare with an uninterrupted run
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_training_resumes_and_matches_uninterrupted_run(data_bin, tmp_path, reference):
    cmd = train_cmd(data_bin, tmp_path, "--save-interval-updates", 5)
    proc = start(cmd, tmp_path / "killed.log")
    deadline = time.time() + 300
    while not (tmp_path / "checkpoint_last.pt").exists():
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(random.Random(5).uniform(0, 0.3))  # seeded: the same delay every run
    kill(proc)

    killed_at = num_updates(load(tmp_path / "checkpoint_last.pt"))
    assert 0 < killed_at < MAX_UPDATE

    # the very same command again, same save directory (in this process: it is not killed)
    resumed = train_here(data_bin, tmp_path, "--save-interval-updates", 5)
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    loaded = LOADED.search(log)
    assert loaded and loaded.group(1).endswith("checkpoint_last.pt"), log[-3000:]
    assert int(loaded.group(3)) == killed_at > 0

    final = load(tmp_path / "checkpoint_last.pt")
    assert num_updates(final) == MAX_UPDATE
    param_diff, val_diff = compare(final, reference())
    print(f"\nresumed at update {killed_at}: max |param diff| = {param_diff:.3g}, "
          f"|val_loss diff| = {val_diff:.3g}")
    assert param_diff <= RESUME_TOLERANCE
    assert val_diff <= RESUME_TOLERANCE


@pytest.mark.slow
def test_kill_during_the_copy_onto_checkpoint_last_keeps_the_previous_checkpoint(data_bin, tmp_path, reference):
    """Kill -9 exactly while fairseq copies a new checkpoint onto an existing
    ``checkpoint_last.pt`` (the copy fairseq's own ``PathManager.copy`` does in place,
    truncating the file first). The test-only hook (``tests/pause_copy``) announces that moment in the
    log -- the second save, at update 10, once the copy's data is written and before it
    is committed -- and waits there to be killed."""
    cmd = train_cmd(data_bin, tmp_path, "--save-interval-updates", 5)
    log_path = tmp_path / "killed.log"
    python_path = os.pathsep.join(p for p in (PAUSE_FOLDER, cli_env().get("PYTHONPATH")) if p)
    proc = start(cmd, log_path, env={PAUSE_ENV: "checkpoint_last.pt", "PYTHONPATH": python_path})
    try:
        wait_for_line(proc, log_path, PAUSE_MARKER)
    except BaseException:
        proc.kill()  # never leave a paused fairseq-train behind
        proc.wait()
        raise
    kill(proc)

    last = tmp_path / "checkpoint_last.pt"
    assert f"{PAUSE_MARKER} {last}" in log_path.read_text()
    # killed mid-copy: checkpoint_last.pt is the whole previous save, the new checkpoint it
    # was being replaced by is complete, and the copy's temporary file is what is left over
    assert num_updates(load(last)) == 5
    assert num_updates(load(tmp_path / "checkpoint_1_10.pt")) == 10
    assert (tmp_path / (last.name + atomic_checkpoints.TMP_SUFFIX)).exists()

    resumed = train_here(data_bin, tmp_path, "--save-interval-updates", 5)  # the same command, in this process
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    loaded = LOADED.search(log)
    assert loaded and loaded.group(1).endswith("checkpoint_last.pt") and int(loaded.group(3)) == 5, log[-3000:]
    final = load(last)
    assert num_updates(final) == MAX_UPDATE
    param_diff, val_diff = compare(final, reference())
    assert param_diff <= RESUME_TOLERANCE
    assert val_diff <= RESUME_TOLERANCE


def _temp_files(save_dir, since):
    """Temporary files (fairseq's ``.pt.tmp``, our ``.copy.tmp``) left by the killed process."""
    return sorted(p.name for p in save_dir.glob("*.tmp") if p.stat().st_mtime >= since)


def _save_phase(log_text):
    """Where the log says the process was: 'write' (state_dict + torch.save of the first
    checkpoint), 'copy' (copying it to checkpoint_best/last) or None (not saving)."""
    events = re.findall(r"(Preparing to save checkpoint|Finished saving checkpoint|"
                        r"Saved checkpoint)", log_text)
    last = events[-1] if events else None
    return {"Preparing to save checkpoint": "write", "Finished saving checkpoint": "copy"}.get(last)


SOAK_SEED = 18
SOAK_KILLS = 4


@pytest.mark.slow
def test_kills_at_seeded_random_moments_around_saves_leave_a_loadable_checkpoint(data_bin, tmp_path, reference):
    """A soak: kill -9 at random (seeded) moments of a run that saves after every update.

    Each kill waits for the 1st-3rd save of the process to start (fairseq's
    ``checkpoint_1_N.pt.tmp`` appears) and then either kills it 0-30 ms later (the write
    takes ~20-40 ms) or waits for that file to be renamed into place -- the moment fairseq
    starts copying it to ``checkpoint_best.pt`` / ``checkpoint_last.pt`` -- and kills it
    0-10 ms later. Where each kill lands depends on the machine's speed (the log says;
    the copy is killed deterministically by the test above); whatever it hits, no
    checkpoint may be truncated, and the run resumed after the last kill must end
    exactly where an uninterrupted run does.
    """
    rng = random.Random(SOAK_SEED)
    flags = ["--save-interval-updates", 1, "--keep-interval-updates", 1]
    cmd = train_cmd(data_bin, tmp_path, *flags)
    phases, with_temp, resumed_from = [], 0, []
    for kills in range(1, SOAK_KILLS + 1):
        log_path = tmp_path / f"run{kills}.log"
        t0 = time.time()
        proc = start(cmd, log_path)
        seen, wanted, target = [], rng.randint(1, 3), rng.choice(["write", "copy"])
        delay = rng.uniform(0, 0.03 if target == "write" else 0.01)
        deadline = t0 + 300
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.time() < deadline
            for p in tmp_path.glob("checkpoint_*_*.pt.tmp"):
                if p.name not in seen and p.stat().st_mtime >= t0:
                    seen.append(p.name)
            if len(seen) >= wanted and (
                    target == "write" or not (tmp_path / seen[wanted - 1]).exists()):
                break
            time.sleep(0.001)
        time.sleep(delay)
        kill(proc)

        log = log_path.read_text()
        phases.append(_save_phase(log))
        leftovers = _temp_files(tmp_path, t0)
        with_temp += bool(leftovers)
        loaded = LOADED.search(log)
        if loaded:
            resumed_from.append(int(loaded.group(3)))
        for ckpt in tmp_path.glob("*.pt"):  # the property under test: none truncated
            assert 0 < num_updates(load(ckpt)) < MAX_UPDATE, ckpt.name
        last, at = tmp_path / "checkpoint_last.pt", None
        if last.exists():
            at = num_updates(load(last))
        print(f"\nkill {kills} ({target}, +{delay * 1000:.1f} ms): phase {phases[-1]}, "
              f"temp files {leftovers or 'none'}, checkpoint_last at {at} updates")

    resumed = train_here(data_bin, tmp_path, *flags)  # the same command, in this process
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-3000:]
    assert LOADED.search(log), log[-3000:]
    final = load(tmp_path / "checkpoint_last.pt")
    assert num_updates(final) == MAX_UPDATE
    param_diff, val_diff = compare(final, reference())
    print(f"\n{SOAK_KILLS} kills: {phases.count('write')} while writing, {phases.count('copy')} "
          f"while copying, {with_temp} left a temp file; earlier runs resumed from updates "
          f"{resumed_from}; final max |param diff| vs uninterrupted = {param_diff:.3g}")
    assert param_diff <= RESUME_TOLERANCE
    assert val_diff <= RESUME_TOLERANCE


# --------------------------------------------------------------------------------------
# Determinism: same seed -> identical losses
# --------------------------------------------------------------------------------------

DETERMINISM_RUNS = {  # name: (residual mode, seed)
    "sum-a": ("sum", 1), "sum-b": ("sum", 1),
    "mean-a": ("mean", 1), "mean-b": ("mean", 1),
    "sum-seed2": ("sum", 2),
}
SEPARATE = ("sum-a", "mean-a")  # in processes of their own; their twins and the other seed in the test process


@pytest.fixture(scope="module")
@trains
def determinism_runs(data_bin, tmp_path_factory):
    """Five 10-update runs; per-update losses from the JSON log. Of each same-seed pair one
    runs in a process of its own and the other in the test process meanwhile (the launcher's
    main, tests/inprocess.py): two runs, two processes, one command line."""
    saves = {name: tmp_path_factory.mktemp(name) for name in DETERMINISM_RUNS}
    procs, here = {}, {}
    for name, (mode, seed) in DETERMINISM_RUNS.items():
        save = saves[name]
        args = [data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer", "--residual-attention-mode",
                mode, *TINY_FLAGS, "--seed", seed, "--max-tokens", 300, "--max-update", 10, "--log-interval", 1,
                "--log-format", "json", "--disable-validation", "--save-dir", save]
        if name in SEPARATE:
            procs[name] = (save, start([str(c) for c in command("fairseq-train", *args, data_fixes=True)],
                                       save / "train.log"))
        else:
            here[name] = (save, args)
    for save, args in here.values():
        proc = run_in_process("fairseq-train", *args, data_fixes=True, check=False)
        (save / "train.log").write_text(proc.stdout + proc.stderr)
        assert proc.returncode == 0, (save / "train.log").read_text()[-3000:]
    for save, proc in procs.values():
        assert proc.wait(timeout=600) == 0, (save / "train.log").read_text()[-3000:]
    return {name: (_train_inner(save / "train.log"), load(save / "checkpoint_last.pt")) for name, save in saves.items()}


def _train_inner(log_path):
    """[(num_updates, loss, gnorm)] from fairseq's ``--log-format json`` train_inner lines."""
    rows = []
    for line in log_path.read_text().splitlines():
        if "train_inner" in line and "{" in line:
            stats = json.loads(line[line.index("{"):])
            rows.append((int(stats["num_updates"]), stats["loss"], stats["gnorm"]))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_same_seed_gives_identical_losses(determinism_runs, mode):
    (losses_a, ckpt_a), (losses_b, ckpt_b) = (determinism_runs[f"{mode}-a"],
                                              determinism_runs[f"{mode}-b"])
    assert [row[0] for row in losses_a] == list(range(1, 11))
    assert losses_a == losses_b  # the logged (3-decimal) loss and gnorm of every update
    for k in ckpt_a["model"]:  # and bit-identical parameters after 10 updates
        assert torch.equal(ckpt_a["model"][k], ckpt_b["model"][k]), k


def test_different_seed_gives_different_losses(determinism_runs):
    seed1, _ = determinism_runs["sum-a"]
    seed2, _ = determinism_runs["sum-seed2"]
    assert len(seed1) == len(seed2) == 10
    assert [row[1] for row in seed1] != [row[1] for row in seed2]


def test_residual_mode_changes_the_losses(determinism_runs):
    """Sum and mean really are different models (the comparison above is not vacuous)."""
    assert determinism_runs["sum-a"][0] != determinism_runs["mean-a"][0]


# --------------------------------------------------------------------------------------
# A finished run exits cleanly (no SIGABRT from fairseq's batch-making thread)
# --------------------------------------------------------------------------------------

# fairseq's BufferedIterator left mid-epoch, its daemon thread inside a torch op (as when
# --max-update stops training while the next batch is being collated), with the race
# forced: the main thread exits only once the thread is inside the op (a 3000 x 3000
# matmul, about a second), and CPython's last flush of sys.stdout, which it makes after
# finalization has begun (after atexit, when a daemon thread that wakes up is ended with
# pthread_exit), waits until the op has returned. Without a fix the op returns into that
# ending and the process aborts; a fix must end the thread before finalization.
_EXIT_MID_EPOCH = """
import os, sys, threading, time, torch
if sys.argv[1] == "fixes":  # the fixes to fairseq, as the launcher installs them (batch_thread_exit)
    from realformer_tools.fairseq_fixes import install_for_good
    install_for_good()
from fairseq.data.iterators import BufferedIterator



in_op, op_done = threading.Event(), threading.Event()

class Batches:
    def __len__(self):
        return 3
    def __iter__(self):
        yield torch.zeros(2)
        x = torch.randn(3000, 3000, generator=torch.Generator().manual_seed(0))
        in_op.set()
        x = x @ x  # the GIL is released inside
        op_done.set()
        yield x

class StdoutHeldAtExit:
    def __init__(self, stream):
        self.stream, self.exiting = stream, False
    def write(self, text):
        return self.stream.write(text)
    def flush(self, clock=time.monotonic, sleep=time.sleep):
        if self.exiting and sys.is_finalizing():
            deadline = clock() + 60
            while not op_done.is_set() and clock() < deadline:
                sleep(0.01)
        self.stream.flush()

sys.stdout = held = StdoutHeldAtExit(sys.stdout)
batches = BufferedIterator(2, Batches())
assert next(batches).shape == (2,)
assert in_op.wait(60)
time.sleep(0.1)  # from in_op.set() into the matmul: microseconds
if op_done.is_set():
    sys.exit("the op ended before the main thread exited: the race was not set up")
print("done")
held.exiting = True
"""


def _exit_mid_epoch(variant):
    return subprocess.run([sys.executable, "-c", _EXIT_MID_EPOCH, variant], env=cli_env(),
                          capture_output=True, text=True, timeout=180)


def test_fairseq_alone_aborts_when_exiting_mid_epoch():
    # the bug the plugin fixes, shown on fairseq's own iterator
    proc = _exit_mid_epoch("vanilla")
    assert proc.stdout.strip() == "done", proc.stderr[-2000:]
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr[-2000:])
    assert "terminate called without an active exception" in proc.stderr


def test_the_fixes_exit_cleanly_mid_epoch():
    proc = _exit_mid_epoch("fixes")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "done"
    assert "terminate called" not in proc.stderr
