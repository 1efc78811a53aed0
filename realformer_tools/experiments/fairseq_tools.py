"""Starting fairseq's command-line tools: through the launcher (the fixes to fairseq 0.12
installed), their environment, running one with its output logged and its progress
echoed, and running several at once."""

import concurrent.futures
import os
import shlex
import subprocess
import sys
import threading
import time

from realformer_nmt.errors import ConfigError, RealFormerError

from ..launch import DATA_FIXES_ENV
from .fairseq_logs import progress_line, stats_record


class RunError(RealFormerError):
    """A fairseq tool failed for a reason other than divergence (the message names the log)."""


LAUNCHER = "realformer_tools.launch"  # python -m LAUNCHER = the realformer-fairseq command


def fairseq_cli(name):
    """The start of the command line that runs the fairseq tool ``name`` (``fairseq-train``
    ...) with the fixes to fairseq 0.12, through the launcher in this interpreter (a list:
    ``[*fairseq_cli("fairseq-train"), data, ...]``). The data fixes follow
    ``REALFORMER_NMT_DATA_FIXES`` in the tool's environment (:func:`with_data_fixes`)."""
    return [sys.executable, "-m", LAUNCHER, name]


def fairseq_part(cmd):
    """``cmd`` from the fairseq tool's name on: a launched command without its launcher
    words (``python -m realformer_tools.launch``, ``realformer-fairseq`` and their options);
    a plain ``fairseq-train ...`` (how older results recorded their runs) as it is."""
    cmd = [str(c) for c in cmd]
    for i, word in enumerate(cmd):
        if word == LAUNCHER or os.path.basename(word) == "realformer-fairseq":
            rest = cmd[i + 1:]
            while rest and rest[0].startswith("--"):
                rest = rest[1:]
            return rest
    return cmd


def resolve_fp16(device, fp16):
    """``--device`` checked; ``fp16`` None means on with cuda, off on cpu."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, not {device!r}")
    fp16 = device == "cuda" if fp16 is None else fp16
    if fp16 and device == "cpu":
        raise ConfigError("--fp16 needs --device cuda (fairseq's fp16 trainer is GPU-only)")
    return fp16


def quote(cmd):
    """A command as one copy-pasteable shell line."""
    return " ".join(shlex.quote(str(c)) for c in cmd)


def cli_env(threads=None):
    """Environment for the child tools: unbuffered output (the data fixes as the caller's
    environment has them); ``threads`` sets OMP_NUM_THREADS."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def with_data_fixes(env):
    """A copy of the environment ``env`` for launched fairseq tools, with the data fixes on
    (``REALFORMER_NMT_DATA_FIXES=1``, which the launcher reads)."""
    return dict(env, **{DATA_FIXES_ENV: "1"})


def threads_per_job(threads, jobs):
    """OMP_NUM_THREADS for each of ``jobs`` concurrent runs: ``threads`` if given, else the
    machine's cores shared out (one each on a 2-core machine with ``--jobs 2``)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, not {jobs}")
    if threads:
        return threads
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None


def run_parallel(tasks, jobs=1, log=print):
    """Run ``tasks`` (``[(key, callable), ...]``, each one fairseq run or more) ``jobs`` at a
    time, in the given order; returns ``{key: result}``.

    Threads are enough: every task waits on fairseq subprocesses. Log lines of concurrent
    tasks are serialized. If a task fails, the tasks not yet started are cancelled, the
    running ones finish (their results are kept on disk, so a re-run reuses them) and the
    first error is raised.
    """
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, not {jobs}")
    if jobs == 1:
        return {key: task() for key, task in tasks}
    results, error = {}, None
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(task): key for key, task in tasks}
        for future in concurrent.futures.as_completed(futures):
            try:
                results[futures[future]] = future.result()
            except concurrent.futures.CancelledError:
                continue
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the running tasks end
                if error is None:
                    error = exc
                    for other in futures:
                        other.cancel()
    if error is not None:
        raise error
    return {key: results[key] for key, _ in tasks}


def serialized(log):
    """``log`` made safe to call from several threads (one line at a time)."""
    lock = threading.Lock()

    def locked(message):
        with lock:
            log(message)
    return locked


# lines echoed besides the stats lines
_ECHOED = ("done training", "Stopping training", "Loaded checkpoint", "Error")


def _eta(first, update, max_update):
    """`` | x upd/s, eta ..`` from ``first`` = (time, update) of this attempt's first logged update."""
    start, first_update = first
    if not max_update or update <= first_update:
        return ""
    rate = (update - first_update) / max(time.time() - start, 1e-6)
    left = max(0, max_update - update) / rate
    return f" | {rate:.2f} upd/s, eta {int(left // 60)}m{int(left % 60):02d}s"


def run_logged(cmd, log_path, label="", log=print, max_update=None, env=None, timeout=None):
    """Run ``cmd``, append its output to ``log_path`` and echo progress lines with an ETA.
    With ``timeout`` (seconds), a run still going then is killed (returncode -9).

    Returns ``(returncode, lines of this attempt)``.
    """
    lines, first = [], None
    with open(log_path, "a", encoding="utf-8", buffering=1) as out:
        out.write(f"### {time.strftime('%Y-%m-%d %H:%M:%S')} running: {quote(cmd)}\n")
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf-8", errors="replace", env=env or cli_env())
        timer = None
        if timeout is not None:
            timer = threading.Timer(max(0.0, timeout), proc.kill)
            timer.daemon = True
            timer.start()
        try:
            for line in proc.stdout:
                out.write(line)
                line = line.rstrip("\n")
                lines.append(line)
                stats = stats_record(line)
                if stats is not None and "." in stats[0]:
                    stats = None  # fairseq-validate's per-batch lines (logger fairseq.logging.progress_bar)
                if stats is None and not any(marker in line for marker in _ECHOED):
                    continue
                shown, eta = line.split(" | ", 3)[-1], ""
                if shown.startswith("{"):  # --log-format json
                    shown = progress_line(line)
                if stats is not None and "num_updates" in stats[1]:
                    update = int(stats[1]["num_updates"])
                    first = first or (time.time(), update)
                    eta = _eta(first, update, max_update)
                log(f"{label}{shown}{eta}")
        finally:
            proc.wait()
            if timer is not None:
                timer.cancel()
    return proc.returncode, lines
