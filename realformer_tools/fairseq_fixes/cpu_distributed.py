"""Multi-process training on CPU: ``--ddp-backend pytorch_ddp`` (fairseq's default) and
``fairseq-train --cpu --distributed-world-size N`` work; a rank set-up that cannot
work on CPU is refused with one sentence giving the recipe.

Bugs (fairseq 0.12.2; the same code is on fairseq's main branch):

1. ``fairseq.models.DistributedFairseqModel`` wraps the model in PyTorch's
   ``DistributedDataParallel(module, device_ids=[device_id], output_device=device_id)``
   whatever the device, and PyTorch refuses ``device_ids`` for a CPU module: every CPU
   rank with ``--ddp-backend pytorch_ddp`` (or its alias ``c10d``) dies at its first
   step with "DistributedDataParallel device_ids and output_device arguments only work
   with single-device/multiple-device GPU modules or CPU modules". Only ``legacy_ddp``
   (fairseq's own all-reduce) trained on CPU.
2. ``fairseq.distributed.utils.call_main`` counts CUDA devices to start ranks:
   ``fairseq-train --cpu --distributed-world-size 2`` stops on
   ``AssertionError: world size is 2 but have 0 available devices``, ``torchrun`` on CPU
   divides by ``torch.cuda.device_count()`` (``ZeroDivisionError``), and the default
   ``--distributed-backend nccl`` cannot run on CPU at all.

Fixes, each at one seam, no fairseq function copied:

1. The ``DistributedDataParallel`` that ``fairseq.models.distributed_fairseq_model``
   calls is replaced by a subclass that passes ``device_ids=None, output_device=None``
   for a module whose parameters are all on the CPU (what PyTorch asks for a CPU
   module), and fairseq's arguments unchanged otherwise (CUDA: no change at all).
2. ``call_main`` is wrapped, for runs that train on CPU (``--cpu``, or no CUDA) with
   no ``--distributed-init-method``:

   * under ``torchrun`` (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` > 1, ``RANK``
     set; any ``--distributed-world-size``): ``env://`` with the rank and world size from
     the environment (fairseq alone trains each rank alone there: its world size counts
     CUDA devices);
   * ``--distributed-world-size`` N > 1 without ``--distributed-no-spawn``: a free local
     port and N processes started by ``torch.multiprocessing.spawn`` running fairseq's
     own ``distributed_main``, as fairseq does for GPUs;
   * N > 1 with ``--distributed-no-spawn`` and nothing else: a
     :class:`~realformer_nmt.errors.ConfigError` giving the recipe (:data:`RECIPE`).

   On CPU the backend is ``gloo`` (``nccl``, fairseq's default, needs CUDA).

When it is no longer needed (how to tell): with the patch uninstalled (``uninstall()``),
two CPU ranks with ``--ddp-backend pytorch_ddp`` train, and ``fairseq-train --cpu
--distributed-world-size 2`` starts two ranks
(``tests/test_distributed_cpu.py::test_fairseq_alone_cannot_run_pytorch_ddp_on_cpu``
checks what fairseq does alone and fails once fairseq is fixed).
"""

import functools
import logging
import os
import socket

import torch
from fairseq.distributed import utils as distributed_utils
from fairseq.models import distributed_fairseq_model
from torch.nn.parallel import DistributedDataParallel

from realformer_nmt.errors import ConfigError

logger = logging.getLogger(__name__)

_FIXED = "__realformer_fixed__"
_LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")

RECIPE = (
    "--distributed-no-spawn on CPU needs each rank started by you: set MASTER_ADDR, "
    "MASTER_PORT and WORLD_SIZE, and run one fairseq-train per rank with --cpu "
    "--distributed-backend gloo --distributed-init-method env:// --distributed-world-size N "
    "--distributed-rank R --distributed-no-spawn (or use torchrun --nproc-per-node N --no-python "
    "fairseq-train --cpu ..., or drop --distributed-no-spawn and fairseq-train starts the N ranks)"
)


class CpuAwareDistributedDataParallel(DistributedDataParallel):
    """PyTorch's DDP; ``device_ids``/``output_device`` dropped for a CPU module."""

    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        devices = {p.device.type for p in module.parameters()}
        if devices == {"cpu"}:
            device_ids = output_device = None
        super().__init__(module, device_ids, output_device, *args, **kwargs)


setattr(CpuAwareDistributedDataParallel, _FIXED, True)


def _trains_on_cpu(common) -> bool:
    """fairseq's own rule for where the Trainer puts the model: CUDA unless --cpu/--tpu."""
    return not common.tpu and (common.cpu or not torch.cuda.is_available())


def _under_torchrun() -> bool:
    """torchrun (or torch.distributed.launch) started this process as one of several ranks."""
    return all(var in os.environ for var in _LAUNCH_VARS) and int(os.environ["WORLD_SIZE"]) > 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ranks(call_main):
    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        dist = cfg.distributed_training
        if not _trains_on_cpu(cfg.common):
            return call_main(cfg, main, **kwargs)
        if dist.distributed_init_method is None and _under_torchrun():
            dist.distributed_init_method = "env://"
            dist.distributed_world_size = int(os.environ["WORLD_SIZE"])
            dist.distributed_rank = int(os.environ["RANK"])
            dist.device_id = 0
            dist.distributed_no_spawn = True
        elif dist.distributed_init_method is None and dist.distributed_world_size > 1:
            if dist.distributed_no_spawn:
                raise ConfigError(RECIPE)
            _gloo(dist)
            dist.distributed_init_method = f"tcp://127.0.0.1:{_free_port()}"
            kwargs["start_rank"] = dist.distributed_rank
            dist.distributed_rank = None  # distributed_main numbers the spawned ranks
            logger.info("starting %d CPU ranks (%s, gloo)", dist.distributed_world_size,
                        dist.distributed_init_method)
            torch.multiprocessing.spawn(
                fn=distributed_utils.distributed_main, args=(main, cfg, kwargs),
                nprocs=dist.distributed_world_size, join=True,
            )
            return None
        if dist.distributed_init_method is not None:
            _gloo(dist)
        return call_main(cfg, main, **kwargs)

    setattr(wrapper, _FIXED, True)
    return wrapper


def _gloo(dist):
    if dist.distributed_backend == "nccl":
        logger.info("--distributed-backend nccl needs CUDA: using gloo for CPU ranks")
        dist.distributed_backend = "gloo"


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.models.distributed_fairseq_model:DistributedDataParallel",
    "fairseq.distributed.utils:call_main",
    "fairseq.distributed_utils:call_main",
)
CHANGES = ("CPU ranks: pytorch_ddp without device_ids, --cpu --distributed-world-size N starts N gloo "
           "ranks, torchrun's ranks train together")


def install():
    if not getattr(distributed_fairseq_model.DistributedDataParallel, _FIXED, False):
        distributed_fairseq_model.DistributedDataParallel = CpuAwareDistributedDataParallel
    if not getattr(distributed_utils.call_main, _FIXED, False):
        distributed_utils.call_main = cpu_ranks(distributed_utils.call_main)


def uninstall():
    """Restore fairseq's own (tests use this to see what fairseq does alone)."""
    if getattr(distributed_fairseq_model.DistributedDataParallel, _FIXED, False):
        distributed_fairseq_model.DistributedDataParallel = DistributedDataParallel
    if getattr(distributed_utils.call_main, _FIXED, False):
        distributed_utils.call_main = distributed_utils.call_main.__wrapped__
