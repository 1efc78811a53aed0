"""Several fairseq-train ranks on one machine, started the way docs/distributed.md says.

``train_ranks`` runs the documented recipe: one ``fairseq-train`` process per rank, each
with ``--distributed-backend gloo --distributed-init-method env:// --distributed-rank R
--distributed-no-spawn`` and ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE`` in the
environment. gloo works where NCCL cannot: on CPU, and for several ranks sharing one
GPU (NCCL refuses two ranks on one device). The tests and ``gpu_check``'s ``ddp`` step
both call it.
"""

import os
import re
import socket
import subprocess
import time

from .fairseq_runs import cli_env, read_log

TRAINING_ON = re.compile(r"training on (\d+) devices")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_flags(rank: int, world_size: int, backend: str = "gloo"):
    """The per-rank flags of the recipe."""
    return ["--distributed-backend", backend, "--distributed-init-method", "env://",
            "--distributed-world-size", str(world_size), "--distributed-rank", str(rank),
            "--distributed-no-spawn"]


def rank_env(port: int, world_size: int, base=None):
    env = dict(base if base is not None else cli_env())
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size))
    for var in ("RANK", "LOCAL_RANK"):  # torchrun's: they would override the recipe's flags
        env.pop(var, None)
    if "GLOO_SOCKET_IFNAME" not in env and os.path.exists("/sys/class/net/lo"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # the ranks talk over loopback, whatever the hostname resolves to
    return env


def train_ranks(cmd, world_size, log_dir, backend="gloo", env=None, timeout=1800):
    """Run ``cmd`` (a fairseq-train command without distributed flags) as ``world_size``
    ranks; rank R's output goes to ``log_dir/rank{R}.log``.

    Returns ``{"returncodes", "logs", "seconds", "devices"}``; ``devices`` is the
    number of devices rank 0 says it trains on (fairseq's "training on N devices" line).
    A rank still running after ``timeout`` seconds is killed (returncode -9).
    """
    os.makedirs(log_dir, exist_ok=True)
    port = free_port()
    env = rank_env(port, world_size, env)
    logs = [os.path.join(log_dir, f"rank{r}.log") for r in range(world_size)]
    start = time.time()
    procs = []
    for rank, log in enumerate(logs):
        with open(log, "w", encoding="utf-8") as out:
            procs.append(subprocess.Popen([str(c) for c in cmd] + rank_flags(rank, world_size, backend),
                                          stdout=out, stderr=subprocess.STDOUT, env=env))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout - (time.time() - start))))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    found = [int(m.group(1)) for line in read_log(logs[0]) for m in [TRAINING_ON.search(line)] if m]
    return {"returncodes": codes, "logs": logs, "seconds": round(time.time() - start, 1),
            "devices": found[-1] if found else None}
