"""What a GPU must show, in one command sized for a short GPU session (15 minutes, start-up included).

    bash scripts/gpu_device_run.sh                 # on the GPU machine: set-up, then this command
    python -m realformer_tools.experiments.gpu_check [--sections ...] [--budget 495] [--out DIR]
    python -m realformer_tools.experiments.gpu_check --dry-run     # the same steps on the CPU (CI)

Sections, in priority order, each with its own deadline (settings.REAL.deadlines, which add up to
no more than the budget) inside the budget; a section cut short says what it did not run, and a
second call with the same work folder keeps the sections an earlier call finished. The dry run
counts the budget on a clock that charges each section its real deadline:

* ``speed``: the rows that decide the default, ``scripts/benchmark_speed.py`` at 32k tokens per
  batch: the big arch (attention dropout 0.1) in fp16 and bf16, base size at T = 128 and 512 in
  fp16 and bf16, padded batches; vanilla, ``bias`` and ``triton`` with peak memory, a variant that
  fails leaving its row (said), the others going on. Each row has the GPU's busy share of a step;
  the CUDA rule for ``auto`` is derived from the GPU-bound rows; the targets of
  docs/performance.md are judged;
* ``exactness``: every kernel in float32 against float64 with float64's ReLU masks forced on
  both (``experiments/exactness.py``), the GELU twin as second judge, flips reported;
* ``train``: fairseq-train through the launcher in fp16 and bf16 (``--fp16`` / ``--bf16``, no
  other flag) with vanilla, ``bias`` and ``triton``, decoded with fairseq-generate; a run that
  trains in fp32 too (the dry run) has its checkpoint evaluated in fp16 / bf16 against vanilla's
  shift;
* ``ddp``: two ranks on the one GPU (gloo), parameters equal bit for bit;
* ``tests``: the triton kernel's tests on CUDA (float32 cases), then ``pytest -m gpu``.

Writes <out>/gpu_check.json (every section's record, the speed rows and the derived rule among
them) and <out>/summary.md; logs, the speed JSON and kernel_rule.json go to the work folder.
"""

# Where each part lives: settings (sections, deadlines, sizes, targets), records (a check's record
# and statuses), sections (tests, speed), training (train, ddp), rule (the CUDA rule from GPU-bound
# rows), report (summary.md), device_run (DeviceRun and the command).

from .device_run import DeviceRun, main, parse_args
from .records import check, step_status
from .settings import DRY, REAL, SECTIONS

__all__ = ["DRY", "REAL", "SECTIONS", "DeviceRun", "check", "main", "parse_args", "step_status"]
