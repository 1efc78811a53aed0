"""What a GPU must show, in one command sized for a short GPU session (15 minutes, start-up included).

    bash scripts/gpu_device_run.sh                 # on the GPU machine: set-up, then this command
    python -m realformer_tools.experiments.gpu_check [--sections ...] [--budget 540] [--out DIR]
    python -m realformer_tools.experiments.gpu_check --dry-run     # the same steps on the CPU (CI)

Sections, in priority order, each with its own deadline (settings.REAL.deadlines) inside the
budget; a section cut short says what it did not run, and a second call with the same work
folder keeps the sections an earlier call finished:

* ``tests``: the triton kernel's tests on CUDA (float32 cases), then ``pytest -m gpu``;
* ``speed``: ``scripts/benchmark_speed.py`` rows: base size at 32k tokens per batch, T = 128
  and 512, fp16 and bf16, with peak memory; the big arch (attention dropout 0.1) at 16k; a
  host-bound 8k row; the first pass over 24 new lengths. Each row has the GPU's busy share of
  a step; the CUDA rule for ``auto`` is derived from the GPU-bound rows (<out>/kernel_rule.json);
  the targets of docs/performance.md are judged;
* ``exactness``: every kernel in float32 against float64 with float64's ReLU masks forced on
  both (``experiments/exactness.py``), the GELU twin as second judge, flips reported;
* ``train``: fairseq-train in fp32, fp16 and bf16 with vanilla and every kernel, decoded with
  fairseq-generate; each fp32 checkpoint evaluated in fp16 / bf16 against vanilla's shift;
* ``ddp``: two ranks on the one GPU (gloo), parameters equal bit for bit.

Writes <out>/<section>.json, <out>/summary.md, <out>/speed_*.json and <out>/kernel_rule.json.
"""

# Where each part lives: settings (sections, deadlines, sizes, targets), records (a check's record
# and statuses), sections (tests, speed), training (train, ddp), rule (the CUDA rule from GPU-bound
# rows), report (summary.md), device_run (DeviceRun and the command).

from .device_run import DeviceRun, main, parse_args
from .records import check, step_status
from .settings import DRY, REAL, SECTIONS

__all__ = ["DRY", "REAL", "SECTIONS", "DeviceRun", "check", "main", "parse_args", "step_status"]
