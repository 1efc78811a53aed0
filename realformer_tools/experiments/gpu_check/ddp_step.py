"""The ``ddp`` step (and ``--quick``'s two ranks): two ranks of ``fairseq-train`` (gloo,
``distributed_runs``' recipe) per DDP backend, in a time of their own: start-up plus a few
times the step time a single-GPU run measured, then a short allowance for the exit.

Every rank saves its own checkpoint (``experiments/every_rank_saves.py``), so the check
passes when both ranks reached ``--max-update`` and their final parameters are equal bit
for bit (and rank 0 trained on 2 devices with a finite, falling loss). A rank still running
``DDP_EXIT_SECONDS`` after rank 0 logged "done training" is a slow exit: it is sent SIGABRT
(``PYTHONFAULTHANDLER=1``: Python prints every thread's stack into the rank's log), then
killed, and reported as such, apart from the training check. A run killed before "done
training" is reported with the update its rank 0 reached."""

import math
import os
import signal
import subprocess
import sys
import time

from .. import distributed_runs, fairseq_runs
from .records import _clear_run, check, portable, rel
from .settings import (
    DDP_BACKENDS,
    DDP_DEFAULT_STEP_SECONDS,
    DDP_EXIT_SECONDS,
    DDP_MARGIN_SECONDS,
    DDP_STARTUP_SECONDS,
    DDP_STEP_FACTOR,
    REPO,
    STEP_SECONDS,
)

DONE = "done training"


def step_seconds_from_log(log_path, updates):
    """Seconds per update of a single-GPU run over its first ``updates`` updates (fairseq's
    ``wall`` at the first logged update at or past ``updates``), or None."""
    records = [r for r in fairseq_runs.parse_log(fairseq_runs.read_log(log_path))["train"] if r.get("wall")]
    if not records:
        return None
    rec = next((r for r in records if r["update"] >= updates), records[-1])
    return rec["wall"] / max(rec["update"], 1)


def ddp_time_limit(step_seconds, updates, reserve=None):
    """Seconds the ranks get to reach "done training": start-up plus ``DDP_STEP_FACTOR``
    times the measured step time per update, within ``reserve`` (less the exit allowance
    and the margin to read the checkpoints)."""
    limit = DDP_STARTUP_SECONDS + DDP_STEP_FACTOR * (step_seconds or DDP_DEFAULT_STEP_SECONDS) * updates
    if reserve is not None:
        limit = min(limit, reserve - DDP_EXIT_SECONDS - 5)
    return max(limit, 10.0)


def run_ranks(commands, logs, env, train_limit, exit_seconds=DDP_EXIT_SECONDS, poll=0.2, clock=time.time,
              popen=subprocess.Popen):
    """Start every rank; stop them as the module docstring says. Returns ``{"returncodes",
    "seconds", "done_at" (seconds from the start to rank 0's "done training", or None),
    "exit_seconds" (from then to the last rank's exit, or None), "stopped" (None,
    ``"slow exit"`` or ``"training limit"``)}``."""
    start = clock()
    procs = []
    for cmd, log in zip(commands, logs):
        with open(log, "w", encoding="utf-8") as out:
            procs.append(popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env))
    done_at, stopped, ended = None, None, None
    while True:
        now = clock()
        if all(p.poll() is not None for p in procs):
            ended = now
            break
        if done_at is None and _logged(logs[0], DONE):
            done_at = now
        late = done_at is not None and now - done_at > exit_seconds
        over = done_at is None and now - start > train_limit
        if late or over:
            stopped = "slow exit" if late else "training limit"
            _stop(procs)
            ended = clock()
            break
        time.sleep(poll)
    codes = [p.wait() for p in procs]
    return {"returncodes": codes, "seconds": round(ended - start, 1),
            "done_at": None if done_at is None else round(done_at - start, 1),
            "exit_seconds": None if done_at is None or stopped else round(ended - done_at, 1),
            "stopped": stopped}


def _logged(path, text):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return text in f.read()
    except OSError:
        return False


def _stop(procs, grace=5.0):
    """SIGABRT (the faulthandler prints every thread's stack), then SIGKILL."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.send_signal(signal.SIGABRT)
        except OSError:
            pass
    deadline = time.time() + grace
    for p in alive:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()


class DdpStep:
    """``GpuCheck``'s ``ddp`` step (uses its ``train_command``, ``ensure_data``, ``env``)."""

    def step_ddp(self):
        cap = STEP_SECONDS - DDP_MARGIN_SECONDS
        return self.ddp_checks(DDP_BACKENDS, self.sizes.ddp_updates, cap, "ddp",
                               step_seconds=self.measured_step_seconds("train", self.sizes.ddp_updates),
                               log_interval=self.sizes.log_interval)

    def measured_step_seconds(self, group, updates):
        """The step time of this check's single-GPU ``fp16`` (dry run: ``fp32``) run of
        ``auto`` (any kernel if that one is missing), or None."""
        precision = "fp32" if self.dry_run else "fp16"
        root = os.path.join(self.work, group)
        names = [f"{precision}-auto"] + (sorted(os.listdir(root)) if os.path.isdir(root) else [])
        for name in names:
            if name.startswith(precision + "-"):
                found = step_seconds_from_log(os.path.join(root, name, "train.log"), updates)
                if found:
                    return found
        return None

    def ddp_checks(self, backends, updates, reserve, group, step_seconds=None, log_interval=None):
        """Two ranks per backend, one backend after the other, all within ``reserve`` seconds
        (each backend an equal share); see the module docstring."""
        self.ensure_data()
        precision = "fp32" if self.dry_run else "fp16"
        checks = []
        share = reserve / len(backends)
        for backend in backends:
            name = f"{backend} x2 ({precision}, gloo)"
            run_dir = os.path.join(self.work, group, backend)
            _clear_run(run_dir)
            limit = ddp_time_limit(step_seconds, updates, share)
            saves = [os.path.join(run_dir, f"rank{r}") for r in range(2)]
            for d in saves:
                _clear_run(d)
                os.makedirs(d, exist_ok=True)
            extra = ["--ddp-backend", backend] + (["--log-interval", str(log_interval)] if log_interval else [])
            cmd = self.train_command(saves[0], precision, "auto", updates, extra=extra)
            cmd = [sys.executable, "-m", "realformer_tools.experiments.every_rank_saves"] + cmd[1:]
            commands = [_with_save_dir(cmd, saves[r]) + distributed_runs.rank_flags(r, 2) for r in range(2)]
            shown = portable(_with_save_dir(cmd, os.path.join(run_dir, "rankR")))
            env = distributed_runs.rank_env(distributed_runs.free_port(), 2, self.env())
            env["PYTHONFAULTHANDLER"] = "1"  # a rank stopped with SIGABRT prints every thread's stack
            # python -m ...every_rank_saves: this checkout's package, installed or not
            env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
            logs = [os.path.join(run_dir, f"rank{r}.log") for r in range(2)]
            self.log(f"ddp: {name}: two ranks of {shown} (training limit {limit:.0f}s: "
                     f"start-up {self._startup()}s + {DDP_STEP_FACTOR:g} x "
                     f"{step_seconds or DDP_DEFAULT_STEP_SECONDS:.2f}s x {updates} updates; exit {DDP_EXIT_SECONDS}s)")
            result = run_ranks(commands, logs, env, limit)
            checks += self._judge_ranks(name, backend, precision, updates, result, saves, logs, limit, step_seconds,
                                        shown)
        if self.dry_run:
            checks.append(check("--fp16 ranks", "skipped", "--fp16 trains on CUDA only (dry run on CPU)"))
        return checks

    @staticmethod
    def _startup():
        return DDP_STARTUP_SECONDS

    def _judge_ranks(self, name, backend, precision, updates, result, saves, logs, limit, step_seconds, shown):
        import torch
        from fairseq import checkpoint_utils

        lines = fairseq_runs.read_log(logs[0])
        train = [(r["update"], r["loss"]) for r in fairseq_runs.parse_log(lines)["train"]]
        found = [int(m.group(1)) for line in lines for m in [distributed_runs.TRAINING_ON.search(line)] if m]
        details = dict(backend=backend, precision=precision, returncodes=result["returncodes"],
                       devices=found[-1] if found else None, seconds=result["seconds"], train_losses=train,
                       time_limit=round(limit, 1), step_seconds=step_seconds, done_training_at=result["done_at"],
                       exit_seconds=result["exit_seconds"], stopped=result["stopped"],
                       command=shown + " " + " ".join(distributed_runs.rank_flags("R", 2)),
                       logs=[rel(p) for p in logs])
        problems = []
        if result["stopped"] == "training limit":
            last = train[-1][0] if train else 0
            problems.append(f"stopped at its training limit ({limit:.0f}s) before rank 0 logged '{DONE}' "
                            f"(last logged update {last} of {updates}); stacks in the rank logs")
        if details["devices"] != 2:
            problems.append(f"rank 0 trained on {details['devices']} devices, not 2")
        losses = [loss for _, loss in train]
        if len(losses) < 2 or not all(math.isfinite(x) for x in losses) or not losses[-1] < losses[0]:
            problems.append(f"training loss not finite and falling: {losses}")
        states = []
        for r, save in enumerate(saves):
            try:
                state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(save, "checkpoint_last.pt"))
            except Exception as exc:  # any load failure is what this check reports
                problems.append(f"rank {r}: checkpoint does not load: {str(exc).splitlines()[0][:200]}")
                continue
            done = state["optimizer_history"][-1]["num_updates"]
            details[f"rank{r}_updates"] = done
            if done != updates:
                problems.append(f"rank {r}: checkpoint after {done} updates, not {updates}")
            states.append(state["model"])
        if len(states) == 2:
            differ = [n for n in states[0] if n not in states[1] or not torch.equal(states[0][n], states[1][n])]
            details["parameters_equal"] = not differ
            details["tensors_compared"] = len(states[0])
            if differ:
                problems.append(f"final parameters differ between the ranks in {len(differ)} of {len(states[0])} "
                                f"tensors (first: {differ[0]})")
        details["checkpoint_updates"] = details.get("rank0_updates")
        status = "failed" if problems else "passed"
        self.log(f"ddp: {name}: {status}" + (f": {'; '.join(problems)}" if problems else ""))
        out = [check(name, status, "; ".join(problems) or None, **details)]
        if result["done_at"] is not None:
            if result["stopped"] == "slow exit":
                text = (f"rank 0 logged '{DONE}' {result['done_at']:.0f}s after the start; a rank was still running "
                        f"{DDP_EXIT_SECONDS}s later and was stopped (SIGABRT: the stacks are in its log): a slow exit "
                        "after training, not a failure to train")
            else:
                text = f"both ranks exited {result['exit_seconds']:.1f}s after rank 0 logged '{DONE}'"
            out.append(check(f"{backend} x2: exit after training", "reported", text, exit_of=backend,
                             done_training_at=result["done_at"], exit_seconds=result["exit_seconds"],
                             stopped=result["stopped"]))
        return out


def _with_save_dir(cmd, save_dir):
    cmd = list(cmd)
    i = cmd.index("--save-dir")
    cmd[i + 1] = save_dir
    return cmd
