"""The ``ddp`` step: two ranks of ``fairseq-train`` (``distributed_runs``' recipe, gloo)
per DDP backend, inside the step's time cap: on the one GPU with ``--fp16``, or (dry run)
on the CPU in fp32."""

import math
import os
import time

from .. import distributed_runs, fairseq_runs
from .records import _clear_run, check, portable, rel
from .settings import DDP_BACKENDS, DDP_MARGIN_SECONDS, STEP_SECONDS


class DdpStep:
    """``GpuCheck``'s ``ddp`` step (uses its ``train_command``, ``ensure_data``, ``env``)."""

    def step_ddp(self):
        return self.ddp_checks(DDP_BACKENDS, self.sizes.ddp_updates, STEP_SECONDS, "ddp")

    def ddp_checks(self, backends, updates, cap_seconds, group):
        """Two ranks per backend, one backend after the other, all within ``cap_seconds``:
        each run gets an equal share of what is left (less a margin to load its checkpoint
        and write the JSON); a run that overstays is killed and reported as a failed check."""
        from fairseq import checkpoint_utils

        self.ensure_data()
        deadline = time.time() + cap_seconds - DDP_MARGIN_SECONDS
        precision = "fp32" if self.dry_run else "fp16"
        checks = []
        for i, backend in enumerate(backends):
            name = f"{backend} x2 ({precision}, gloo)"
            share = (deadline - time.time()) / (len(backends) - i)
            if share < 1:
                checks.append(check(name, "failed", f"no time left in the step's {cap_seconds}-second cap",
                                    backend=backend, precision=precision))
                continue
            run_dir = os.path.join(self.work, group, backend)
            _clear_run(run_dir)
            cmd = self.train_command(run_dir, precision, "auto", updates, extra=["--ddp-backend", backend])
            self.log(f"ddp: {name}: two ranks of {portable(cmd)} + {' '.join(distributed_runs.rank_flags(0, 2))}"
                     f" (at most {share:.0f}s)")
            result = distributed_runs.train_ranks(cmd, 2, run_dir, env=self.env(), timeout=share)
            lines = fairseq_runs.read_log(result["logs"][0])
            train = [(r["update"], r["loss"]) for r in fairseq_runs.parse_log(lines)["train"]]
            details = dict(backend=backend, precision=precision, returncodes=result["returncodes"],
                           devices=result["devices"], seconds=result["seconds"], train_losses=train,
                           time_limit=round(share, 1),
                           command=portable(cmd) + " " + " ".join(distributed_runs.rank_flags("R", 2)),
                           logs=[rel(p) for p in result["logs"]])
            problems = []
            if result["seconds"] >= share and any(code != 0 for code in result["returncodes"]):
                problems.append(f"killed after {share:.0f}s (its share of the step's {cap_seconds}-second cap): "
                                f"a rank hung or trained too slowly; exit codes {result['returncodes']}")
            elif result["returncodes"] != [0, 0]:
                tails = [fairseq_runs.read_log(p)[-1:] for p in result["logs"]]
                problems.append(f"exit codes {result['returncodes']}: {tails}")
            elif result["devices"] != 2:
                problems.append(f"rank 0 trained on {result['devices']} devices, not 2")
            if not problems:
                losses = [loss for _, loss in train]
                if len(losses) < 2 or not all(math.isfinite(x) for x in losses) or not losses[-1] < losses[0]:
                    problems.append(f"training loss not finite and falling: {losses}")
                try:
                    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(run_dir, "checkpoint_last.pt"))
                    done = state["optimizer_history"][-1]["num_updates"]
                    details["checkpoint_updates"] = done
                    if done != updates:
                        problems.append(f"checkpoint after {done} updates, not {updates}")
                except Exception as exc:  # any load failure is what this check reports
                    problems.append(f"checkpoint does not load: {exc}")
            self.log(f"ddp: {name}: {'failed: ' + '; '.join(problems) if problems else 'passed'}")
            checks.append(check(name, "failed" if problems else "passed", "; ".join(problems) or None, **details))
        if self.dry_run:
            checks.append(check("--fp16 ranks", "skipped", "--fp16 trains on CUDA only (dry run on CPU)"))
        return checks
