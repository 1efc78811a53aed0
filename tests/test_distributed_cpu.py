"""Several CPU ranks: the documented two-rank recipe with both DDP backends,
``fairseq-train --cpu --distributed-world-size 2`` (fairseq_fixes.cpu_distributed), and
the multi-machine recipe with two "nodes" on localhost."""

import argparse
import sys

import pytest
import torch
import torch.distributed as dist
from cli_helpers import TINY_FLAGS, command, run
from conftest import BIN, REPO, USER_DIR, batch, build, cli_env, trains
from fairseq import checkpoint_utils
from fairseq.dataclass.configs import DistributedTrainingConfig
from fairseq.distributed import utils as distributed_utils
from fairseq.models import DistributedFairseqModel
from inprocess import run_in_process
from omegaconf import OmegaConf

from realformer_nmt.errors import ConfigError
from realformer_tools.experiments.distributed_runs import NODE_LAUNCHERS, free_port, train_nodes, train_ranks
from realformer_tools.fairseq_fixes import cpu_distributed

# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")

COMMON = ["--user-dir", USER_DIR, "--arch", "realformer_transformer", *TINY_FLAGS,
          "--max-tokens", "500", "--max-epoch", "1", "--log-format", "simple"]  # the last --max-tokens wins


def epoch_updates(log_text):
    line = [text for text in log_text.splitlines() if "| train | epoch 001" in text][-1]
    return int(line.split("num_updates ")[1].split()[0])


@pytest.fixture(scope="module")
@trains
def single_rank(data_bin, tmp_path_factory):
    """Updates in an epoch of one process (in this one: tests/inprocess.py, the launcher's main)."""
    save = tmp_path_factory.mktemp("single")
    proc = run_in_process("fairseq-train", data_bin, *COMMON, "--save-dir", save)
    return epoch_updates(proc.stdout + proc.stderr)


@pytest.fixture
def gloo_group():
    """A one-rank gloo process group in this process (what fairseq's ranks have)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
    yield dist.group.WORLD
    dist.destroy_process_group()


def ddp_args(backend):
    """fairseq's distributed defaults as the Trainer passes them (plain strings)."""
    cfg = OmegaConf.structured(DistributedTrainingConfig(ddp_backend=backend, distributed_world_size=1))
    args = OmegaConf.to_container(cfg, enum_to_str=True)
    args.update(tpu=False, fp16=False, memory_efficient_fp16=False)  # interpolations of common.* there
    return argparse.Namespace(**args)


def test_fairseq_alone_cannot_run_pytorch_ddp_on_cpu(gloo_group, dictionary):
    """Fails once fairseq passes no device_ids for a CPU model: the patch is then unneeded."""
    model = build(dictionary=dictionary)
    cpu_distributed.uninstall()
    try:
        with pytest.raises(ValueError, match="device_ids"):
            DistributedFairseqModel(ddp_args("pytorch_ddp"), model, gloo_group, torch.device("cpu"))
    finally:
        cpu_distributed.install()


def test_pytorch_ddp_wraps_a_cpu_model_and_computes_the_same_function(gloo_group, dictionary):
    model = build(dictionary=dictionary)
    src, lengths, tgt = batch(dictionary)
    with torch.no_grad():
        expected, _ = model(src, lengths, tgt)
    wrapped = DistributedFairseqModel(ddp_args("pytorch_ddp"), model, gloo_group, torch.device("cpu"))
    assert isinstance(wrapped.module, torch.nn.parallel.DistributedDataParallel)
    assert wrapped.module.device_ids is None
    with torch.no_grad():
        got, _ = wrapped(src, lengths, tgt)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("ddp_backend", ["legacy_ddp", "pytorch_ddp"])
def test_two_cpu_ranks_share_each_update_with_the_documented_recipe(data_bin, tmp_path, single_rank, ddp_backend):
    """Each update combines both ranks' batches, so an epoch takes half the updates of
    one process with the same --max-tokens; rank 0's checkpoint loads."""
    save = tmp_path / "dist"
    cmd = command("fairseq-train", data_bin, *COMMON, "--save-dir", save, "--ddp-backend", ddp_backend)  # launched
    result = train_ranks(cmd, 2, tmp_path / "logs", timeout=600)
    logs = [open(p).read() for p in result["logs"]]
    assert result["returncodes"] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert result["devices"] == 2
    assert "as rank 1" in logs[1]
    assert epoch_updates(logs[0]) * 2 in (single_rank - 1, single_rank, single_rank + 1)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(save / "checkpoint_last.pt")], arg_overrides={"data": str(data_bin)})

    assert cfg.distributed_training.ddp_backend == ddp_backend
    assert cfg.distributed_training.distributed_world_size == 2
    assert type(models[0]).__name__ == "RealFormerTransformerModel"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", NODE_LAUNCHERS)
def test_two_nodes_on_localhost_train_the_same_model(data_bin, tmp_path, single_rank, launcher):
    """docs/distributed.md's multi-machine recipe, both "nodes" on this machine (one process
    each, gloo, world size 2; torchrun's --nnodes/--node-rank/--master-addr or fairseq's
    --distributed-init-method tcp://): they train together (each update takes both nodes'
    batches: half the updates of one process per epoch) and end with the same model, bit for
    bit. Every rank saves its own checkpoint into its node's --save-dir (tests/every_rank_saves.py;
    fairseq saves on rank 0 only)."""
    saves = [tmp_path / f"node{r}" for r in range(2)]
    for save in saves:
        save.mkdir()
    commands = [[sys.executable, REPO / "tests" / "every_rank_saves.py", data_bin, *COMMON, "--save-dir", save]
                for save in saves]
    result = train_nodes(commands, tmp_path / "logs", launcher=launcher, env=cli_env(), timeout=600,
                         torchrun=BIN / "torchrun")
    logs = [open(p).read() for p in result["logs"]]
    assert result["returncodes"] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "training on 2 devices" in logs[0]
    assert epoch_updates(logs[0]) * 2 in (single_rank - 1, single_rank, single_rank + 1)
    states = [checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt")) for save in saves]
    for rank, state in enumerate(states):
        assert state["cfg"].distributed_training.distributed_world_size == 2
        assert state["cfg"].distributed_training.distributed_rank == rank
    updates = [state["optimizer_history"][-1]["num_updates"] for state in states]
    assert updates[0] == updates[1] == epoch_updates(logs[0])
    first, second = (state["model"] for state in states)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.slow
def test_cpu_world_size_2_starts_two_ranks_itself(data_bin, tmp_path):
    proc = run("fairseq-train", data_bin, *COMMON, "--max-update", 4, "--save-dir", tmp_path,
               "--distributed-world-size", 2)
    log = proc.stdout + proc.stderr
    assert "training on 2 devices" in log
    assert "distributed init (rank 1)" in log
    assert (tmp_path / "checkpoint_last.pt").exists()


@pytest.mark.slow
def test_torchrun_starts_two_cpu_ranks_that_train_together(data_bin, tmp_path):
    import subprocess

    from conftest import cli_env

    cmd = [BIN / "torchrun", "--nproc-per-node", 2, "--master-port", free_port(), "--no-python",
           *command("fairseq-train", data_bin, *COMMON, "--max-update", 4, "--save-dir", tmp_path)]
    env = {**cli_env(), "PATH": f"{BIN}:{cli_env().get('PATH', '')}"}
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "training on 2 devices" in log and "distributed init (rank 1): env://" in log


@pytest.mark.slow
def test_no_spawn_without_an_init_method_is_refused_with_the_recipe(data_bin, tmp_path):
    # refused before any rank or process group starts: the launcher's main in this process
    proc = run_in_process("fairseq-train", data_bin, *COMMON, "--save-dir", tmp_path, "--distributed-world-size", 2,
                          "--distributed-no-spawn", check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"realformer_nmt: error: {cpu_distributed.RECIPE}"
    assert "--distributed-init-method env://" in last and "Traceback" not in proc.stderr


def _cfg(**dist_overrides):
    from fairseq.dataclass.configs import FairseqConfig

    cfg = OmegaConf.structured(FairseqConfig())
    cfg.common.cpu = True
    for k, v in dist_overrides.items():
        setattr(cfg.distributed_training, k, v)
    return cfg


def test_torchrun_on_cpu_initializes_from_its_environment(monkeypatch):
    """torchrun sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK; fairseq alone trains
    every rank alone there (its default world size counts CUDA devices: 1 on CPU)."""
    for var, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", WORLD_SIZE="3", RANK="2").items():
        monkeypatch.setenv(var, value)
    seen = []
    wrapper = cpu_distributed.cpu_ranks(lambda cfg, main, **kw: seen.append(cfg.distributed_training))
    wrapper(_cfg(), main=None)
    (d,) = seen
    assert (d.distributed_init_method, d.distributed_world_size, d.distributed_rank) == ("env://", 3, 2)
    assert d.distributed_no_spawn and d.distributed_backend == "gloo"


def test_patch_leaves_single_process_and_explicit_init_runs_to_fairseq(monkeypatch):
    seen = []
    wrapper = cpu_distributed.cpu_ranks(lambda cfg, main, **kw: seen.append(cfg.distributed_training))
    wrapper(_cfg(distributed_world_size=1), main=None)
    wrapper(_cfg(distributed_world_size=2, distributed_init_method="tcp://127.0.0.1:1"), main=None)
    assert [d.distributed_init_method for d in seen] == [None, "tcp://127.0.0.1:1"]
    assert seen[1].distributed_backend == "gloo"  # nccl cannot run on CPU
    with pytest.raises(ConfigError, match="--distributed-init-method env://"):
        wrapper(_cfg(distributed_world_size=2, distributed_no_spawn=True), main=None)


def test_install_is_idempotent():
    cpu_distributed.install()
    wrapped = distributed_utils.call_main
    cpu_distributed.install()
    assert distributed_utils.call_main is wrapped
    assert not getattr(wrapped.__wrapped__, "__realformer_fixed__", False)
