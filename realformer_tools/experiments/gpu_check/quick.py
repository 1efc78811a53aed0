"""``--quick``: the main answers in one short command, section by section (exactness,
mixed-precision training, speed and memory, two DDP ranks), each in a time reserved for it
up front (``QUICK_REAL.reserve``, within the 9-minute budget); ``quick.json`` rewritten
after each."""

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
    QUICK_DRY,
    QUICK_DRY_KERNELS,
    QUICK_KERNELS,
    QUICK_PRECISIONS,
    QUICK_REAL,
    QUICK_SECONDS,
    QUICK_SECTIONS,
    REPO,
    SPEED_MIN_ALTERNATIONS,
)
from .targets import speed_summary, speed_targets

EVAL_SECONDS = 25  # of the train section's time, kept for evaluating the fp32 checkpoints in fp16 / bf16


class QuickCheck:
    """``GpuCheck``'s ``--quick`` (uses the steps' ``train_one``, ``ddp_checks``, ``run_echoed``)."""

    def quick_path(self):
        return os.path.join(self.out, "quick.json")

    def run_quick(self) -> dict:
        """Every section of ``--quick`` in order, each within its reserved time,
        ``quick.json`` and ``summary.md`` rewritten after each (a command cut off still
        leaves what it answered)."""
        import torch

        if not self.dry_run and not torch.cuda.is_available():
            raise ConfigError("no CUDA device here: run gpu_check --quick on a GPU machine, or add --dry-run "
                              "(CPU, toy sizes)")
        q = QUICK_DRY if self.dry_run else QUICK_REAL
        start = time.time()
        record = {
            "quick": True, "dry_run": self.dry_run, "device": self.device_description(), "status": None,
            "seconds": None, "budget_seconds": QUICK_SECONDS, "reserved_seconds": dict(q.reserve),
            "command": "make gpu-check GPU_CHECK_ARGS=\"--quick" + (" --dry-run" if self.dry_run else "")
                       + f" --out {rel(self.out)}\"",
            "sections": {},
        }
        for section in QUICK_SECTIONS:
            reserve = q.reserve[section]
            self.log(f"quick: {section} (reserved {reserve:.0f}s)")
            t0 = time.time()
            checks = getattr(self, f"quick_{section}")(q, t0 + reserve)
            spent = time.time() - t0
            self.log(f"quick: {section}: {step_status(checks)} in {spent:.0f}s of its {reserve:.0f}s")
            record["sections"][section] = {"status": step_status(checks), "ran": self.what_ran(section, checks, q),
                                           "seconds": round(spent, 1), "reserved_seconds": reserve, "checks": checks}
            record["seconds"] = round(time.time() - start, 1)
            record["status"] = step_status([c for sec in record["sections"].values() for c in sec["checks"]])
            record["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            fairseq_runs.write_json(self.quick_path(), fairseq_runs.finite_or_none(record))
            self.write_summary()
        return record

    def quick_exactness(self, q, deadline):
        from .. import exactness

        checks = exactness.run(self.device, q.exact, log=self.log, deadline=deadline)
        if not self.dry_run:
            import torch

            torch.cuda.empty_cache()
        return checks

    def quick_train(self, q, deadline):
        from .precision import checkpoint_shift_checks

        summary = self.ensure_data()
        sentences = summary["counts"]["test"]
        jobs = [(p, k) for p in QUICK_PRECISIONS for k in QUICK_KERNELS]
        train_deadline = deadline - EVAL_SECONDS

        def train(job):
            precision, kernel = job
            if self.dry_run and kernel not in QUICK_DRY_KERNELS:
                return check(f"{precision}/{kernel}", "skipped", "dry run: CI trains "
                             f"{' and '.join(QUICK_DRY_KERNELS)} only (the same command with another kernel)",
                             precision=precision, kernel=kernel)
            return self.train_one(precision, kernel, sentences, updates=q.train_updates, group="quick_train",
                                  deadline=train_deadline)

        with concurrent.futures.ThreadPoolExecutor(max(self.jobs, q.train_jobs)) as pool:
            checks = list(pool.map(train, jobs))
        checkpoints = {c["kernel"]: os.path.join(self.work, "quick_train", f"fp32-{c['kernel']}", "checkpoint_last.pt")
                       for c in checks if c.get("precision") == "fp32" and c["status"] == "passed"}
        if checkpoints:
            # judged in the dry run too: the same arithmetic on the CPU (bf16 and fp16 casts of a toy model)
            checks += checkpoint_shift_checks(checkpoints, self.sizes.data, self.device, judged=True, log=self.log)
        missing = [k for k in QUICK_KERNELS if k not in checkpoints
                   and not (self.dry_run and k not in QUICK_DRY_KERNELS)]
        for kernel in missing:
            checks.append(check(f"fp16/bf16 evaluation of the fp32 checkpoint ({kernel})", "failed",
                                "its fp32 run did not pass: nothing to evaluate", kernel=kernel))
        return checks + self.precision_agreement(checks)

    def precision_agreement(self, checks):
        """fp16 / bf16 trained runs' valid loss against fp32's, per kernel: reported, not
        judged (one seed of 300 updates cannot judge 1%: fairseq's own transformer ended
        6.28% from fp32 in bf16 on the H100). The judged precision cost is the evaluation
        of the fp32 checkpoint in fp16 / bf16 against vanilla's (``precision.py``)."""
        runs = {(c.get("precision"), c.get("kernel")): c for c in checks}
        out = []
        for precision in ("fp16", "bf16"):
            for kernel in QUICK_KERNELS:
                run, ref = runs.get((precision, kernel), {}), runs.get(("fp32", kernel), {})
                name = f"{precision} trained: valid loss against fp32's ({kernel})"
                loss, base = run.get("valid_loss"), ref.get("valid_loss")
                if run.get("status") == "skipped" or ref.get("status") == "skipped":
                    out.append(check(name, "skipped", run.get("reason") or ref.get("reason"), precision=precision,
                                     kernel=kernel))
                    continue
                if loss is None or not base:
                    out.append(check(name, "reported", "a valid loss is missing (the run failed: see its check)",
                                     precision=precision, kernel=kernel))
                    continue
                diff = abs(loss - base) / base
                vanilla = runs.get((precision, "vanilla"), {}).get("valid_loss")
                vanilla_base = runs.get(("fp32", "vanilla"), {}).get("valid_loss")
                beside = (f"; vanilla's {100 * abs(vanilla - vanilla_base) / vanilla_base:.2f}%"
                          if vanilla and vanilla_base and kernel != "vanilla" else "")
                where = f"after {QUICK_DRY.train_updates} toy updates on CPU" if self.dry_run else "one seed"
                out.append(check(name, "reported", f"{100 * diff:.2f}% from fp32{beside} ({where}: reported, not "
                                 "judged; the judged cost is the fp32 checkpoint evaluated in half precision)",
                                 precision=precision, kernel=kernel, valid_loss=loss, fp32_valid_loss=base,
                                 relative=diff))
        return out

    def quick_speed(self, q, deadline):
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
            code, lines = self.run_echoed(cmd, log_path, "[speed] ", self.env(threads=1 if self.dry_run else None),
                                          timeout=max(1.0, deadline - time.time()))
            if code != 0:
                tail = [line for line in lines[-5:] if line.strip()]
                why = "stopped at its reserved time" if code == -9 else f"exit code {code}"
                return [check("benchmark_speed float16", "failed", f"{why}: {tail[-1] if tail else ''}",
                              command=portable(cmd), log=rel(log_path))]
        result = fairseq_runs.read_json(result_path) or {}
        return speed_checks(result, portable(cmd), self.dry_run)

    def quick_ddp(self, q, deadline):
        step = self.measured_step_seconds("quick_train", q.ddp_updates)
        return self.ddp_checks(("pytorch_ddp",), q.ddp_updates, max(10.0, deadline - time.time()), "quick_ddp",
                               step_seconds=step, log_interval=q.ddp_log_interval)


def speed_table(result):
    """One row per (size, length, variant): the median per-round train speed ratio with its
    range, and the peak memory ratio."""
    table = []
    for config in result.get("configs", []):
        for variant, r in config["variants"].items():
            s = speed_summary(config, variant)
            table.append(dict(size=config["size"], length=config["length"], variant=variant,
                              train_tokens_per_second=r.get("train_tokens_per_second"),
                              train_speed_ratio=s["median"], train_speed_low=s["low"], train_speed_high=s["high"],
                              rounds=s["rounds"], peak_memory_mib=r.get("peak_memory_mib"),
                              peak_memory_ratio=r.get("peak_memory_ratio")))
    return table


def speed_checks(result, command, dry_run):
    checks = [check("benchmark_speed float16", "passed", None, command=command, table=speed_table(result),
                    gpu=result.get("gpu") or result.get("device"), torch=result.get("torch"))]
    for row in speed_targets(result):
        name = (f"{row['variant']} at T = {row['length']}: train >= {row['min_speed']:.2f}x vanilla, "
                f"peak memory <= {row['max_memory']:.2f}x")
        measured = (f"median {row['speed_ratio']:.2f}x ({row['speed_low']:.2f}-{row['speed_high']:.2f} over "
                    f"{row['rounds']} rounds), memory {row['memory_ratio']:.2f}x"
                    if row["speed_ratio"] is not None and row["memory_ratio"] is not None else "not measured")
        if dry_run:
            checks.append(check(name, "skipped", "dry run: CPU toy sizes, not the target's conditions", **row))
        elif row["speed_ratio"] is None or row["memory_ratio"] is None:
            checks.append(check(name, "failed", "not measured", **row))
        elif row["met"] is None:
            verdict = "met" if row["median_met"] else "not met"
            checks.append(check(name, "reported", f"{measured}: {verdict} on the median, but fewer than "
                                f"{SPEED_MIN_ALTERNATIONS} rounds cannot judge it", **row))
        else:
            checks.append(check(name, "passed" if row["met"] else "failed",
                                None if row["met"] else f"target not met: {measured}", **row))
    if dry_run:
        checks.append(check("speed targets", "skipped", "dry run: CPU toy lengths (the targets are fp16 on "
                                                          "CUDA at T = 128 and 512)"))
    return checks
