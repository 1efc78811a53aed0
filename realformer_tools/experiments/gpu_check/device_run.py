"""``DeviceRun``: the sections in priority order, each within its own deadline and the whole
within a budget; each section's record written as it ends (``<out>/gpu_check.json`` holds them
all, ``summary.md`` is rewritten; everything else goes to the work folder, which the device
script packs into ``<out>/logs.tgz``); a section finished in an earlier call with the same work
folder is kept (a second call goes on where the first stopped). The dry run counts the budget on
a clock that charges each section its real deadline: a schedule that would not reach every
section on the GPU does not reach it in the dry run either. The command."""

import argparse
import datetime
import json
import os
import shutil
import sys
import threading
import time

from .. import fairseq_runs
from .records import rel, step_status
from .report import summary_markdown
from .sections import speed_section, tests_section
from .settings import BUDGET_SECONDS, DEFAULT_OUT, DRY, DRY_RUN_OUT, REAL, SECTIONS
from .training import ddp_section, train_section

RESULT = "gpu_check.json"  # with summary.md, the device script's logs.tgz and steps.txt: all of $OUT


def exactness_section(run, deadline):
    from .. import exactness

    return exactness.run(run.device, run.sizes.exact, log=run.log, deadline=deadline)


RUNNERS = dict(tests=tests_section, speed=speed_section, exactness=exactness_section, train=train_section,
               ddp=ddp_section)


class DeviceRun:
    def __init__(self, out=None, work=None, dry_run=False, force=False, log=None):
        self.dry_run, self.force = dry_run, force
        self.out = rel(out or (DRY_RUN_OUT if dry_run else DEFAULT_OUT))
        self.work = rel(work or os.path.join(os.path.dirname(self.out), "work"))
        self.sizes = DRY if dry_run else REAL
        if self.sizes.data is None:  # the dry run's own tiny corpus
            self.sizes = type(self.sizes)(**dict(vars(self.sizes), data=os.path.join(self.work, "toy_en_de")))
        self.device = "cpu" if dry_run else "cuda"
        self._log, self._lock = log or (lambda m: print(m, file=sys.stderr, flush=True)), threading.Lock()
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(os.path.join(self.work, "sections"), exist_ok=True)

    def log(self, message):
        with self._lock:
            self._log(f"[gpu-check] {message}")

    def env(self, threads=None):
        """The tools' environment: the data fixes on (fairseq-generate keeps every sentence)."""
        jobs = self.sizes.jobs
        return fairseq_runs.with_data_fixes(fairseq_runs.cli_env(threads or max(1, (os.cpu_count() or 1) // jobs)))

    def copy_out(self, path, name):
        """Keep ``path`` as ``name`` in the work folder (packed into the device script's logs.tgz)."""
        if os.path.abspath(path) != os.path.abspath(os.path.join(self.work, name)):
            shutil.copyfile(path, os.path.join(self.work, name))

    def ensure_data(self):
        """The demo corpus (``make demo``'s, ``data-bin/demo_en_de``; the dry run's is tiny), once."""
        from ...data import corpora

        s = self.sizes
        wanted = corpora.prepare_settings("synthetic", vocab_size=s.vocab, seed=1, synthetic_sizes=s.synthetic_sizes)
        with self._lock:
            if corpora.prepared_settings(s.data) != wanted:
                self._log(f"[gpu-check] preparing the demo corpus in {rel(s.data)}")
                corpora.prepare("synthetic", s.data, vocab_size=s.vocab, seed=1, synthetic_sizes=s.synthetic_sizes)
        with open(os.path.join(s.data, "prepare.json"), encoding="utf-8") as f:
            return json.load(f)

    def device_description(self):
        import torch

        if self.dry_run:
            return f"cpu (dry run, tiny shapes: not a measurement), torch {torch.__version__}"
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"

    def run(self, sections=SECTIONS, budget=BUDGET_SECONDS, command=""):
        clock = BudgetClock(budget, REAL.deadlines if self.dry_run else None)
        records = {}
        for name in [s for s in SECTIONS if s in sections]:
            kept = os.path.join(self.work, "sections", f"{name}.json")
            record = None if self.force else fairseq_runs.read_json(kept)
            if record is not None and record.get("dry_run") == self.dry_run:
                self.log(f"{name}: done in an earlier call ({record['status']}), kept ({kept}; --force runs it again)")
            else:
                started, room = clock.used(), clock.room(name)
                deadline = time.time() + min(self.sizes.deadlines[name], room)
                self.log(f"{name}: running (deadline in {deadline - time.time():.0f}s; budget clock {started:.0f}s "
                         f"of {budget:.0f}s)")
                t0 = time.time()
                if room < 5:
                    checks = [dict(name=name, status="failed", reason="not run: the budget was spent "
                                   f"({clock.what}: {started:.0f}s of {budget:.0f}s)")]
                else:
                    checks = RUNNERS[name](self, deadline)
                clock.charge(name)
                record = dict(section=name, status=step_status(checks), dry_run=self.dry_run,
                              device=self.device_description(), seconds=round(time.time() - t0, 1),
                              deadline_seconds=self.sizes.deadlines[name], budget_clock=dict(
                                  what=clock.what, start=round(started), end=round(clock.used()), budget=budget),
                              finished=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              checks=checks)
                if not any("not run" in (c.get("reason") or "") for c in checks):
                    fairseq_runs.write_json(kept, fairseq_runs.finite_or_none(record))
                self.log(f"{name}: {record['status']} in {record['seconds']:.0f}s")
            records[name] = record
            fairseq_runs.write_json(os.path.join(self.out, RESULT), fairseq_runs.finite_or_none(
                dict(command=command, dry_run=self.dry_run, budget=budget, sections=records)))
            with open(os.path.join(self.out, "summary.md"), "w", encoding="utf-8") as f:
                f.write(summary_markdown(records, self.dry_run, command))
        return records


class BudgetClock:
    """The budget spent so far: wall-clock seconds, or, with ``counted`` (the dry run), the real
    deadlines of the sections run so far, as if each had run to its deadline on the GPU."""

    def __init__(self, budget, counted=None):
        self.budget, self.counted, self.start, self.charged = budget, counted, time.time(), 0.0
        self.what = "the real deadlines counted" if counted else "wall clock"

    def used(self):
        return self.charged if self.counted else time.time() - self.start

    def room(self, name):
        """Seconds ``name`` may run: what is left of the budget (the dry run: 0 unless the section's
        real deadline fits in what is left)."""
        left = self.budget - self.used()
        if self.counted:
            return left if self.counted[name] <= left else 0.0
        return left

    def charge(self, name):
        if self.counted:
            self.charged += self.counted[name]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m realformer_tools.experiments.gpu_check",
                                description=sys.modules[__package__].__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma list of {', '.join(SECTIONS)} (default: all, in that order: the priority)")
    p.add_argument("--budget", type=float, default=BUDGET_SECONDS,
                   help="seconds for the whole command; each section also has its own deadline "
                        "(default: %(default)s)")
    p.add_argument("--out", default=None, help=f"{RESULT} (every section's record) and summary.md "
                                               f"(default: {DEFAULT_OUT}; with --dry-run {DRY_RUN_OUT})")
    p.add_argument("--work", default=None, help="checkpoints, logs, the speed JSON, kernel_rule.json, finished "
                                                "sections (default: <out>/../work)")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny shapes (CI)")
    p.add_argument("--force", action="store_true", help="run sections again that an earlier call finished")
    args = p.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in args.sections if s not in SECTIONS]
    if unknown or not args.sections:
        p.error(f"--sections: unknown {', '.join(unknown) or '(empty)'} (choose from {', '.join(SECTIONS)})")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch

    from ...fairseq_fixes import install_for_good

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: error: no CUDA device here: run it on a GPU machine, or add --dry-run (the same steps "
              "on the CPU, tiny shapes)", file=sys.stderr)
        return 2

    install_for_good()  # the fixes to fairseq in this process: the train and ddp sections load checkpoints
    run = DeviceRun(args.out, args.work, args.dry_run, args.force)
    shown = [rel(a) if os.path.isabs(a) else a for a in (sys.argv[1:] if argv is None else argv)]
    records = run.run(args.sections, args.budget, " ".join(shown))
    print(f"summary: {os.path.join(run.out, 'summary.md')}")
    for name, record in records.items():
        print(f"{name}: {record['status']}")
    return 1 if any(r["status"] == "failed" for r in records.values()) else 0
