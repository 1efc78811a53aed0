"""Everything a GPU must prove, in steps that each fit a short GPU lease.

    python -m realformer_tools.experiments.gpu_check [--steps tests,train,ddp,speed] [--out results/gpu]
    python -m realformer_tools.experiments.gpu_check --quick [--out results/gpu]   # first (sized for 7 minutes)
    python -m realformer_tools.experiments.gpu_check --dry-run      # CPU, toy sizes (CI)
    python -m realformer_tools.experiments.gpu_check --quick --dry-run

Steps (each writes ``<out>/<step>.json``; ``<out>/summary.md`` is rewritten after each):

* ``tests``: ``pytest -m gpu``: every kernel in fp16/bf16/amp against a float32
  reference of the same weights, forward and backward; cached decoding against the full
  pass; 48-layer finiteness (``tests/test_gpu.py``).
* ``train``: ``fairseq-train`` on the demo corpus with every precision (fp32,
  ``--fp16``, ``--bf16``, ``--amp``, ``--memory-efficient-fp16``) and every kernel: loss
  finite and falling, the checkpoint decodes with ``fairseq-generate --fp16``; the fp16
  loss is compared with fp32 (target: within 1% after 300 updates).
* ``ddp``: two ranks on the one GPU (gloo: NCCL refuses two ranks on one device) with
  ``--fp16``, for ``--ddp-backend pytorch_ddp`` and ``legacy_ddp``.
* ``speed``: ``scripts/benchmark_speed.py`` in fp16 and bf16 (vanilla and every
  kernel; T = 128, 512, 1024; base and big), and ``scripts/benchmark_kernels.py``, which
  writes ``<out>/kernel_rule.json`` (the rule ``auto`` applies on CUDA) and copies it to the
  user's rule, ``~/.cache/realformer_nmt/kernel_rule.json`` (``$XDG_CACHE_HOME`` honoured).

``--quick`` (run it first): one command that answers the main questions, sized for under
7 minutes on one H100 (not yet timed on a GPU), and writes ``<out>/quick.json`` and
``<out>/summary.md`` (small enough to copy back from a remote machine):

* exactness, float32: a 6+6 model with every path on, sum and mean, each kernel (``bias``,
  ``fused``, ``auto``) against ``materialized``, per parameter tensor (relative error <=
  1e-4), the ``bias`` layer's mask gradient, and the SDPA backend ``torch.profiler`` saw
  run for the ``bias`` layer, forward and backward (``exactness.py``);
* mixed precision: 300 updates of the demo model in fp32, ``--fp16`` and ``--bf16`` for
  vanilla ``transformer``, ``materialized``, ``bias`` and ``auto``: loss finite and
  falling, fp16 / bf16 valid loss within 1% of fp32's, the checkpoint decodes with
  ``fairseq-generate --fp16``;
* speed and memory: base size, fp16, T = 128 and 512, each kernel's train tokens/s and
  peak memory as a ratio to vanilla in the same process, against the targets;
* two ranks on the one GPU, ``--fp16``, ``pytorch_ddp``, 50 updates.

The full check (the steps above) is the second call.

Resumable: a step whose JSON is in ``--out`` (from a run of the same kind, dry or
not) is not run again (``--force`` runs it again); inside ``train`` and ``speed`` every
finished run / benchmark is kept too, so a step cut off by a time limit goes on where
it stopped. ``--dry-run`` runs every step on the CPU at toy sizes through the same
code (what needs CUDA, fp16 and amp training, is reported as skipped), so CI proves the
command works. Paths in the JSON are relative to the working directory.
"""

# The docstring above is the command's --help. Where each part lives: settings (steps,
# precisions, sizes), records (a check's record and statuses), runner (GpuCheck: running
# steps resumably), one module per step (tests_step, train_step, ddp_step, speed_step),
# quick (--quick), targets (what is judged against), report (summary.md), cli (the command).

from .cli import main, parse_args
from .records import check, step_status
from .report import quick_markdown
from .runner import GpuCheck
from .settings import (
    DDP_BACKENDS,
    DDP_MARGIN_SECONDS,
    DRY,
    FP16_LOSS_TOLERANCE,
    QUICK_DRY,
    QUICK_DRY_KERNELS,
    QUICK_KERNELS,
    QUICK_SECTIONS,
    REAL,
    SPEED_TARGETS,
    STEP_SECONDS,
    STEPS,
)

__all__ = ["DDP_BACKENDS", "DDP_MARGIN_SECONDS", "DRY", "FP16_LOSS_TOLERANCE", "QUICK_DRY", "QUICK_DRY_KERNELS",
           "QUICK_KERNELS", "QUICK_SECTIONS", "REAL", "SPEED_TARGETS", "STEP_SECONDS", "STEPS", "GpuCheck", "check",
           "main", "parse_args", "quick_markdown", "step_status"]
