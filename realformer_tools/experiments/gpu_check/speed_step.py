"""The ``speed`` step: ``scripts/benchmark_kernels.py`` (a kernel rule for ``auto`` on
CUDA, ``<out>/kernel_rule.json``: ``auto`` applies the one shipped in the package, so a
measured rule takes effect when it is committed there, or given to
``use_cuda_kernel_rule``) and ``scripts/benchmark_speed.py`` per dtype."""

import os
import subprocess
import sys
import threading

from realformer_nmt.modules.residual_attention import PACKAGED_KERNEL_RULE

from .records import check, portable, rel
from .settings import REPO


class SpeedStep:
    """``GpuCheck``'s ``speed`` step and ``run_echoed`` (a command with its output shown)."""

    def speed_path(self, dtype):
        return os.path.join(self.out, f"speed_{dtype}.json")

    def rule_path(self):
        return os.path.join(self.out, "kernel_rule.json")

    def step_speed(self):
        """The kernel benchmark (a rule for ``auto``), then the speed benchmark per dtype
        (its ``auto`` runs the packaged rule, which its log names)."""
        device = ["--device", self.device]
        cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_kernels.py")), *device,
               "--dtype", "float16", *self.sizes.kernel_args,
               "--json", os.path.join(self.work, "kernel_timing_float16.json"), "--rule", self.rule_path()]
        benchmarks = [("benchmark_kernels float16 -> kernel rule", cmd, self.rule_path())]
        for dtype in self.sizes.speed_dtypes:
            cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_speed.py")), *device,
                   "--dtype", dtype, *self.sizes.speed_args, "--variants", ",".join(["vanilla"] + self.kernels),
                   "--json", self.speed_path(dtype)]
            benchmarks.append((f"benchmark_speed {dtype}", cmd, self.speed_path(dtype)))
        checks = []
        for name, cmd, result_path in benchmarks:
            if not self.force and os.path.exists(result_path):
                self.log(f"speed: {name}: done earlier, kept ({result_path})")
                checks.append(check(name, "passed", None, command=portable(cmd), result=rel(result_path)))
                continue
            log_path = os.path.join(self.work, os.path.basename(result_path).replace(".json", ".log"))
            self.log(f"speed: {name}: {portable(cmd)}")
            # dry run: toy models, where one thread is fastest on a shared CPU
            threads = 1 if self.dry_run else os.cpu_count()
            code, lines = self.run_echoed(cmd, log_path, f"[{name}] ", self.env(threads=threads))
            if code != 0:
                tail = [line for line in lines[-5:] if line.strip()]
                checks.append(check(name, "failed", f"exit code {code}: {tail[-1] if tail else ''}",
                                    command=portable(cmd), log=rel(log_path)))
            else:
                checks.append(check(name, "passed", None, command=portable(cmd), result=rel(result_path),
                                    log=rel(log_path)))
        if not self.dry_run and os.path.isfile(self.rule_path()):
            self.log(f"speed: kernel rule measured: {self.rule_path()}; auto applies the packaged rule "
                     f"({rel(PACKAGED_KERNEL_RULE)}): to ship this one, commit it there")
        if not self.dry_run or not checks:
            return checks
        checks.append(check("peak CUDA memory", "skipped", "torch.cuda.max_memory_allocated needs CUDA (dry run)"))
        return checks

    def run_echoed(self, cmd, log_path, label, env, timeout=None):
        """Run ``cmd``, its output to ``log_path`` and, line by line, to the log (progress);
        with ``timeout`` (seconds) it is killed then (returncode -9)."""
        lines = []
        with open(log_path, "w", encoding="utf-8", buffering=1) as out:
            proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, encoding="utf-8", errors="replace", env=env)
            timer = threading.Timer(timeout, proc.kill) if timeout is not None else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                for line in proc.stdout:
                    out.write(line)
                    lines.append(line.rstrip("\n"))
                    if " | INFO | " not in line:  # fairseq's import-time chatter
                        self.log(label + lines[-1])
            finally:
                proc.wait()
                if timer is not None:
                    timer.cancel()
        return proc.returncode, lines
