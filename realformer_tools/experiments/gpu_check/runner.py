"""``GpuCheck``: one check's settings and folders, running the chosen steps resumably
(each step's JSON kept), and ``summary.md`` rewritten after each. The steps themselves
and ``--quick`` live in one module each (the classes this one combines)."""

import dataclasses
import datetime
import os
import sys
import threading
import time
from typing import Dict, Optional

from realformer_nmt.errors import ConfigError
from realformer_nmt.modules.residual_attention import KERNELS

from ...fairseq_fixes import with_data_fixes
from .. import fairseq_runs
from .ddp_step import DdpStep
from .quick import QuickCheck
from .records import rel, step_status
from .report import quick_markdown, summary_markdown
from .settings import DEFAULT_OUT, DRY, DRY_RUN_OUT, DRY_SEEDS, FULL_SEEDS, PRECISIONS, REAL, REPO, STEPS
from .speed_step import SpeedStep
from .tests_step import TestsStep
from .train_step import TrainStep


class GpuCheck(TestsStep, TrainStep, DdpStep, SpeedStep, QuickCheck):
    def __init__(self, out=None, work=None, dry_run=False, jobs=None, force=False, log=None,
                 kernels=None, precisions=None, seeds=None):
        self.dry_run = dry_run
        self.out = rel(out or (DRY_RUN_OUT if dry_run else DEFAULT_OUT))
        if dry_run and os.path.abspath(self.out) == os.path.abspath(os.path.join(REPO, DEFAULT_OUT)):
            raise ConfigError(f"--dry-run writes CPU results: give it another --out than {DEFAULT_OUT} "
                              "(its kernel_rule.json is what auto reads on CUDA)")
        default_work = os.path.join(self.out, "gpu_check_work") if dry_run else os.path.join("runs", "gpu_check")
        self.work = rel(work or default_work)
        self.sizes = dataclasses.replace(DRY if dry_run else REAL)
        if self.sizes.data is None:
            self.sizes.data = os.path.join(self.work, "toy_en_de")
        self.force = force
        self.device = "cpu" if dry_run else "cuda"
        self.jobs = jobs or (4 if not dry_run else 2)
        self._log = log or (lambda m: print(m, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self.kernels = list(kernels or KERNELS)
        self.precisions = list(precisions or PRECISIONS)
        self.seeds = list(seeds or (DRY_SEEDS if dry_run else FULL_SEEDS))
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)

    def log(self, message):
        with self._lock:
            self._log(f"[gpu-check] {message}")

    # ------------------------------------------------------------------------------
    # running steps
    # ------------------------------------------------------------------------------

    def step_path(self, step):
        return os.path.join(self.out, f"{step}.json")

    def done(self, step) -> Optional[dict]:
        record = fairseq_runs.read_json(self.step_path(step))
        if record is not None and record.get("dry_run") == self.dry_run:
            return record
        return None

    def run(self, steps) -> Dict[str, dict]:
        import torch

        if not self.dry_run and not torch.cuda.is_available():
            raise ConfigError("no CUDA device here: run gpu_check on a GPU machine, or add --dry-run "
                              "(CPU, toy sizes)")
        results = {}
        for step in steps:
            record = None if self.force else self.done(step)
            if record is not None:
                self.log(f"{step}: done earlier ({record['status']}), kept ({self.step_path(step)}; "
                         "--force runs it again)")
            else:
                self.log(f"{step}: running")
                start = time.time()
                checks = getattr(self, f"step_{step}")()
                record = {
                    "step": step, "status": step_status(checks), "ran": self.what_ran(step, checks),
                    "dry_run": self.dry_run,
                    "device": self.device_description(), "seconds": round(time.time() - start, 1),
                    "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "command": "python -m realformer_tools.experiments.gpu_check --steps " + step
                               + (" --dry-run" if self.dry_run else "") + f" --out {rel(self.out)}",
                    "checks": checks,
                }
                fairseq_runs.write_json(self.step_path(step), fairseq_runs.finite_or_none(record))
                self.log(f"{step}: {record['status']} in {record['seconds']:.0f}s -> {self.step_path(step)}")
            results[step] = record
            self.write_summary()
        return results

    def what_ran(self, part, checks, quick=None) -> str:
        """What a step (or, with ``quick``'s sizes, a ``--quick`` section) ran, in words:
        written beside its status, so a dry run on the CPU never reads as a GPU result."""
        where = "the CPU (dry run, toy sizes)" if self.dry_run else "one CUDA GPU"
        sizes = quick or self.sizes
        if part == "tests":
            return "tests/test_gpu.py on " + (f"{where} (its CUDA cases skipped)" if self.dry_run else where)
        if part == "exactness":
            d = quick.exact
            return (f"{d['layers']}+{d['layers']} layers, d = {d['embed']}, on {where}: every kernel against "
                    "materialized in float64; in float32 against a float64 reference beside materialized's and "
                    "fairseq's own attention's distance (peaked sum and mean, plain, plain gelu); float16 / bfloat16 "
                    "distances; one bias layer's mask gradient and SDPA backend")
        if part == "train":
            trained = [c["name"] for c in checks if "/" in c["name"] and c["status"] != "skipped"]
            evaluated = "; fp32 checkpoints evaluated in fp16 and bf16" if quick is not None else ""
            return (f"fairseq-train, {sizes.train_updates} updates on {where}: {', '.join(trained) or 'none'}; "
                    f"decoded with fairseq-generate {'--cpu' if self.dry_run else '--fp16'}{evaluated}")
        if part == "ddp":
            ran = [c for c in checks if c.get("backend")]
            precision = ran[0]["precision"] if ran else ("fp32" if self.dry_run else "fp16")
            return (f"two fairseq-train ranks on {where} over gloo, {precision}, "
                    f"{', '.join(c['backend'] for c in ran) or 'none'}, {sizes.ddp_updates} updates")
        lengths = sizes.speed_args[sizes.speed_args.index("--lengths") + 1]
        if quick is not None:
            return f"scripts/benchmark_speed.py --dtype float16 on {where}, T = {lengths}"
        return (f"scripts/benchmark_kernels.py (float16) and scripts/benchmark_speed.py "
                f"({', '.join(self.sizes.speed_dtypes)}) on {where}, T = {lengths}")

    def device_description(self) -> str:
        import torch

        if self.dry_run:
            return f"cpu (dry run), torch {torch.__version__}"
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"

    def env(self, threads=None):
        # checkpoint loading stays weights-only under any environment: the plugin's
        # safe_checkpoint_loading patch refuses a full unpickle itself; the data fixes on, so that
        # fairseq-generate decodes every test sentence (each run is checked for all of them)
        return with_data_fixes(fairseq_runs.cli_env(threads or max(1, (os.cpu_count() or 1) // self.jobs)))

    # ------------------------------------------------------------------------------
    # summary
    # ------------------------------------------------------------------------------

    def write_summary(self):
        records = {s: fairseq_runs.read_json(self.step_path(s)) for s in STEPS}
        quick = fairseq_runs.read_json(self.quick_path())
        text = quick_markdown(quick) if quick is not None and quick.get("dry_run") == self.dry_run else ""
        if text and not any(records.values()):
            return self._write_summary_text(text)
        text = text + ("\n" if text else "") + summary_markdown(records, self)
        self._write_summary_text(text)

    def _write_summary_text(self, text):
        with open(os.path.join(self.out, "summary.md"), "w", encoding="utf-8") as f:
            f.write(text)
