"""Everything a GPU must prove, in steps that each fit a short GPU lease.

    python -m realformer_tools.experiments.gpu_check [--steps tests,train,ddp,speed] [--out results/gpu]
    python -m realformer_tools.experiments.gpu_check --quick [--out results/gpu]   # first (sized for 9 minutes)
    python -m realformer_tools.experiments.gpu_check --dry-run      # CPU, toy sizes (CI)
    python -m realformer_tools.experiments.gpu_check --quick --dry-run

Steps (each writes ``<out>/<step>.json``; ``<out>/summary.md`` is rewritten after each):

* ``tests``: ``pytest -m gpu``: every kernel in fp16/bf16/amp against a float32
  reference of the same weights, forward and backward; cached decoding against the full
  pass; 48-layer finiteness (``tests/test_gpu.py``).
* ``train``: ``fairseq-train`` on the demo corpus with every precision (fp32,
  ``--fp16``, ``--bf16``, ``--amp``, ``--memory-efficient-fp16``) and every kernel: loss
  finite and falling, the checkpoint decodes with ``fairseq-generate --fp16``; fp32, fp16
  and bf16 also with the other ``--seeds`` (and vanilla ``transformer``): each kernel's
  fp16 / bf16 gap to fp32 at most vanilla's plus two standard errors.
* ``ddp``: two ranks on the one GPU (gloo: NCCL refuses two ranks on one device) with
  ``--fp16``, for ``--ddp-backend pytorch_ddp`` and ``legacy_ddp``, every rank saving its
  checkpoint: both at ``--max-update``, parameters equal bit for bit; a slow exit after
  training is reported apart.
* ``speed``: ``scripts/benchmark_speed.py`` in fp16 and bf16 (vanilla and every
  kernel; T = 128, 512, 1024; base and big), and ``scripts/benchmark_kernels.py``, which
  writes ``<out>/kernel_rule.json`` (a rule for ``auto`` on CUDA: ``auto`` applies the one
  shipped in the package, ``modules/residual_attention/kernel_rule.json``).

``--quick`` (run it first): one command that answers the main questions in 9 minutes on one
H100, each section in a time reserved for it up front, and writes ``<out>/quick.json`` and
``<out>/summary.md`` (small enough to copy back from a remote machine):

* exactness (``exactness.py``): a 6+6 model with every path on; every kernel against
  ``materialized`` in float64 (relative error <= 1e-10); in float32 each kernel's distance
  to a float64 reference within 2x the larger of two yardsticks measured in the same run
  (``materialized``'s, fairseq's own attention's) + 1e-6, per parameter tensor, on a peaked
  model (sum, mean), a plain one and a GELU one, with ReLU flips counted; float16 / bfloat16
  distances reported; the ``bias`` layer's mask gradient and its SDPA backend;
* mixed precision: 300 updates of the demo model in fp32, ``--fp16`` and ``--bf16`` for
  vanilla ``transformer``, ``materialized``, ``bias`` and ``auto``: loss finite and
  falling, the checkpoint decodes with ``fairseq-generate --fp16``; each fp32 checkpoint
  evaluated in fp16 / bf16: its valid nll's shift within max(0.5%, 1.5x vanilla's);
* speed and memory: base size, fp16, T = 128 and 512, 11 rounds, each kernel's train
  tokens/s (median of the per-round ratios, with its range) and peak memory as a ratio to
  vanilla in the same process, against the targets;
* two ranks on the one GPU, ``--fp16``, ``pytorch_ddp``, 30 updates, in their own time.

``--rejudge FILE`` judges a committed ``quick.json`` again by today's yardsticks (no GPU).

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
    QUICK_REAL,
    QUICK_SECONDS,
    QUICK_SECTIONS,
    REAL,
    SPEED_MIN_ALTERNATIONS,
    SPEED_TARGETS,
    STEP_SECONDS,
    STEPS,
    TESTS_SECONDS,
    TRITON_SPEED_TARGETS,
)

__all__ = ["DDP_BACKENDS", "DDP_MARGIN_SECONDS", "DRY", "FP16_LOSS_TOLERANCE", "QUICK_DRY", "QUICK_DRY_KERNELS",
           "QUICK_KERNELS", "QUICK_REAL", "QUICK_SECONDS", "QUICK_SECTIONS", "REAL", "SPEED_MIN_ALTERNATIONS",
           "SPEED_TARGETS", "TRITON_SPEED_TARGETS", "STEP_SECONDS", "STEPS", "TESTS_SECONDS", "GpuCheck", "check",
           "main", "parse_args", "quick_markdown", "step_status"]
