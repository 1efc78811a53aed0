"""``--quick``: the main answers in one short command, section by section (exactness,
mixed-precision training, speed and memory, two DDP ranks), ``quick.json`` rewritten after
each."""

import concurrent.futures
import datetime
import os
import sys
import time

from realformer_nmt.errors import ConfigError
from realformer_nmt.modules.residual_attention import KERNELS

from .. import fairseq_runs
from .records import check, portable, rel, step_status
from .settings import (
    FP16_LOSS_TOLERANCE,
    QUICK_DRY,
    QUICK_DRY_KERNELS,
    QUICK_KERNELS,
    QUICK_PRECISIONS,
    QUICK_REAL,
    QUICK_SECONDS,
    QUICK_SECTIONS,
    REPO,
    STEP_SECONDS,
)
from .targets import speed_targets


class QuickCheck:
    """``GpuCheck``'s ``--quick`` (uses the steps' ``train_one``, ``ddp_checks``, ``run_echoed``)."""

    def quick_path(self):
        return os.path.join(self.out, "quick.json")

    def run_quick(self) -> dict:
        """Every section of ``--quick`` in order, ``quick.json`` and ``summary.md`` rewritten
        after each (a command cut off still leaves what it answered). A section that would
        start after the 7-minute budget is reported as failed, not run."""
        import torch

        if not self.dry_run and not torch.cuda.is_available():
            raise ConfigError("no CUDA device here: run gpu_check --quick on a GPU machine, or add --dry-run "
                              "(CPU, toy sizes)")
        q = QUICK_DRY if self.dry_run else QUICK_REAL
        start = time.time()
        record = {
            "quick": True, "dry_run": self.dry_run, "device": self.device_description(), "status": None,
            "seconds": None, "budget_seconds": QUICK_SECONDS,
            "command": "make gpu-check GPU_CHECK_ARGS=\"--quick" + (" --dry-run" if self.dry_run else "")
                       + f" --out {rel(self.out)}\"",
            "sections": {},
        }
        for section in QUICK_SECTIONS:
            spent = time.time() - start
            if spent > QUICK_SECONDS and not self.dry_run:
                checks = [check(section, "failed", f"not run: the quick check had spent {spent:.0f}s of its "
                                                   f"{QUICK_SECONDS}s budget")]
            else:
                self.log(f"quick: {section}")
                t0 = time.time()
                checks = getattr(self, f"quick_{section}")(q, max(60.0, QUICK_SECONDS - spent))
                self.log(f"quick: {section}: {step_status(checks)} in {time.time() - t0:.0f}s")
            record["sections"][section] = {"status": step_status(checks), "ran": self.what_ran(section, checks, q),
                                           "seconds": round(time.time() - start - spent, 1), "checks": checks}
            record["seconds"] = round(time.time() - start, 1)
            record["status"] = step_status([c for sec in record["sections"].values() for c in sec["checks"]])
            record["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            fairseq_runs.write_json(self.quick_path(), fairseq_runs.finite_or_none(record))
            self.write_summary()
        return record

    def quick_exactness(self, q, budget):
        from .. import exactness

        checks = exactness.run(self.device, q.exact, log=self.log)
        if not self.dry_run:
            import torch

            torch.cuda.empty_cache()
        return checks

    def quick_train(self, q, budget):
        summary = self.ensure_data()
        sentences = summary["counts"]["test"]
        jobs = [(p, k) for p in QUICK_PRECISIONS for k in QUICK_KERNELS]

        def train(job):
            precision, kernel = job
            if self.dry_run and kernel not in QUICK_DRY_KERNELS:
                return check(f"{precision}/{kernel}", "skipped", "dry run: CI trains "
                             f"{' and '.join(QUICK_DRY_KERNELS)} only (the same command with another kernel)",
                             precision=precision, kernel=kernel)
            return self.train_one(precision, kernel, sentences, updates=q.train_updates, group="quick_train")

        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            checks = list(pool.map(train, jobs))
        return checks + self.precision_agreement(checks)

    def precision_agreement(self, checks):
        """fp16 and bf16 valid loss within 1% of fp32's, per kernel (on CUDA a failed check;
        the dry run's few updates on CPU are reported, not judged)."""
        runs = {(c.get("precision"), c.get("kernel")): c for c in checks}
        out = []
        for precision in ("fp16", "bf16"):
            for kernel in QUICK_KERNELS:
                run, ref = runs.get((precision, kernel), {}), runs.get(("fp32", kernel), {})
                name = f"{precision} valid loss within 1% of fp32 ({kernel})"
                loss, base = run.get("valid_loss"), ref.get("valid_loss")
                if run.get("status") == "skipped" or ref.get("status") == "skipped":
                    out.append(check(name, "skipped", run.get("reason") or ref.get("reason"), precision=precision,
                                     kernel=kernel))
                    continue
                if loss is None or not base:
                    out.append(check(name, "failed", "a valid loss is missing", precision=precision, kernel=kernel))
                    continue
                diff = abs(loss - base) / base
                status, reason = ("passed", None) if diff <= FP16_LOSS_TOLERANCE else (
                    "failed", f"{100 * diff:.2f}% from fp32")
                if self.dry_run:
                    status, reason = "reported", (f"dry run: {100 * diff:.2f}% after {QUICK_DRY.train_updates} toy "
                                                  "updates on CPU, reported, not judged")
                out.append(check(name, status, reason, precision=precision, kernel=kernel, valid_loss=loss,
                                 fp32_valid_loss=base, relative=diff))
        return out

    def quick_speed(self, q, budget):
        result_path = os.path.join(self.work, "quick_speed_float16.json")
        log_path = os.path.join(self.work, "quick_speed_float16.log")
        kernels = [k for k in KERNELS]
        cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_speed.py")), "--device", self.device,
               "--dtype", "float16", *q.speed_args, "--variants", ",".join(["vanilla"] + kernels),
               "--json", result_path]
        if self.force and os.path.exists(result_path):
            os.remove(result_path)
        if not os.path.exists(result_path):
            self.log(f"speed: {portable(cmd)}")
            code, lines = self.run_echoed(cmd, log_path, "[speed] ", self.env(threads=1 if self.dry_run else None))
            if code != 0:
                tail = [line for line in lines[-5:] if line.strip()]
                return [check("benchmark_speed float16", "failed", f"exit code {code}: {tail[-1] if tail else ''}",
                              command=portable(cmd), log=rel(log_path))]
        result = fairseq_runs.read_json(result_path) or {}
        table = []
        for config in result.get("configs", []):
            for variant, r in config["variants"].items():
                table.append(dict(size=config["size"], length=config["length"], variant=variant,
                                  train_tokens_per_second=r.get("train_tokens_per_second"),
                                  train_speed_ratio=r.get("train_speed_ratio"),
                                  peak_memory_mib=r.get("peak_memory_mib"),
                                  peak_memory_ratio=r.get("peak_memory_ratio")))
        checks = [check("benchmark_speed float16", "passed", None, command=portable(cmd), table=table,
                        gpu=result.get("gpu") or result.get("device"), torch=result.get("torch"))]
        for row in speed_targets(result):
            name = (f"{row['variant']} at T = {row['length']}: train >= {row['min_speed']:.2f}x vanilla, "
                    f"peak memory <= {row['max_memory']:.2f}x")
            if self.dry_run:
                checks.append(check(name, "skipped", "dry run: CPU toy sizes, not the target's conditions", **row))
            elif row["met"] is None:
                checks.append(check(name, "failed", "not measured", **row))
            else:
                checks.append(check(name, "passed" if row["met"] else "failed",
                                    None if row["met"] else "target not met", **row))
        if self.dry_run:
            checks.append(check("speed targets", "skipped", "dry run: CPU toy lengths (the targets are fp16 on "
                                                              "CUDA at T = 128 and 512)"))
        return checks

    def quick_ddp(self, q, budget):
        return self.ddp_checks(("pytorch_ddp",), q.ddp_updates, int(min(budget, STEP_SECONDS)), "quick_ddp")
