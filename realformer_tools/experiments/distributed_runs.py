"""Several fairseq-train ranks, started the way docs/distributed.md says: on one machine,
or as several "nodes" (one launcher per node, as on several machines).

``train_ranks`` runs the documented recipe: one ``fairseq-train`` process per rank, each
with ``--distributed-backend gloo --distributed-init-method env:// --distributed-rank R
--distributed-no-spawn`` and ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE`` in the
environment. gloo works where NCCL cannot: on CPU, and for several ranks sharing one
GPU (NCCL refuses two ranks on one device). The tests and ``gpu_check``'s ``ddp`` step
both call it.

``train_nodes`` runs the multi-machine recipe with every node on this machine: per node,
``torchrun --nnodes N --node-rank R --master-addr ADDR --master-port PORT`` in front of the
node's command, or fairseq's own ``--distributed-init-method tcp://ADDR:PORT
--distributed-world-size N --distributed-rank R --distributed-no-spawn`` (one process per
node). ``tests/test_distributed_cpu.py`` runs two CPU nodes over gloo with it.
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
    port = free_port()
    commands = [[str(c) for c in cmd] + rank_flags(rank, world_size, backend) for rank in range(world_size)]
    result = run_together(commands, log_dir, "rank", rank_env(port, world_size, env), timeout)
    found = [int(m.group(1)) for line in read_log(result["logs"][0]) for m in [TRAINING_ON.search(line)] if m]
    return {**result, "devices": found[-1] if found else None}


def run_together(commands, log_dir, name, env, timeout):
    """Start every command at once (process R's output in ``log_dir/<name>R.log``) and wait
    for all; one still running after ``timeout`` seconds is killed (returncode -9)."""
    os.makedirs(log_dir, exist_ok=True)
    logs = [os.path.join(log_dir, f"{name}{r}.log") for r in range(len(commands))]
    start = time.time()
    procs = []
    for cmd, log in zip(commands, logs):
        with open(log, "w", encoding="utf-8") as out:
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout - (time.time() - start))))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return {"returncodes": codes, "logs": logs, "seconds": round(time.time() - start, 1)}


NODE_LAUNCHERS = ("torchrun", "fairseq")


def node_command(cmd, node_rank, nnodes, master_addr, master_port, launcher="torchrun", torchrun="torchrun"):
    """Node ``node_rank``'s command of the multi-machine recipe (one process per node):
    ``cmd`` (a fairseq-train command without distributed flags) behind torchrun's node
    flags, or with fairseq's own distributed flags."""
    cmd = [str(c) for c in cmd]
    if launcher == "torchrun":
        return [str(torchrun), "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--nproc-per-node", "1",
                "--master-addr", master_addr, "--master-port", str(master_port), "--no-python", *cmd]
    if launcher == "fairseq":
        return cmd + ["--distributed-init-method", f"tcp://{master_addr}:{master_port}",
                      "--distributed-world-size", str(nnodes), "--distributed-rank", str(node_rank),
                      "--distributed-no-spawn"]
    raise ValueError(f"launcher: {launcher!r} is not one of {', '.join(NODE_LAUNCHERS)}")


def train_nodes(commands, log_dir, launcher="torchrun", env=None, timeout=1800, torchrun="torchrun"):
    """Run ``commands[R]`` as node R of ``len(commands)`` nodes, all on 127.0.0.1 (node R's
    output in ``log_dir/node{R}.log``). Returns ``{"returncodes", "logs", "seconds"}``; a
    node still running after ``timeout`` seconds is killed (returncode -9)."""
    port, nnodes = free_port(), len(commands)
    env = rank_env(port, nnodes, env)
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"):  # each node is told by its flags alone
        env.pop(var, None)
    commands = [node_command(cmd, rank, nnodes, "127.0.0.1", port, launcher, torchrun)
                for rank, cmd in enumerate(commands)]
    return run_together(commands, log_dir, "node", env, timeout)
