"""``DeviceRun``: the sections in priority order, each within its own deadline and the whole
within a budget; each section's record written as it ends (``<out>/<section>.json``, and
``summary.md`` rewritten); a section finished in an earlier call with the same work folder is
kept (a second call goes on where the first stopped). The command."""

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
        if os.path.abspath(path) != os.path.abspath(os.path.join(self.out, name)):
            shutil.copyfile(path, os.path.join(self.out, name))

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
        start = time.time()
        records = {}
        for name in [s for s in SECTIONS if s in sections]:
            kept = os.path.join(self.work, "sections", f"{name}.json")
            record = None if self.force else fairseq_runs.read_json(kept)
            if record is not None and record.get("dry_run") == self.dry_run:
                self.log(f"{name}: done in an earlier call ({record['status']}), kept ({kept}; --force runs it again)")
            else:
                deadline = min(time.time() + self.sizes.deadlines[name], start + budget)
                self.log(f"{name}: running (deadline in {deadline - time.time():.0f}s)")
                t0 = time.time()
                if time.time() > deadline - 5:
                    checks = [dict(name=name, status="failed", reason="not run: the budget was spent")]
                else:
                    checks = RUNNERS[name](self, deadline)
                record = dict(section=name, status=step_status(checks), dry_run=self.dry_run,
                              device=self.device_description(), seconds=round(time.time() - t0, 1),
                              deadline_seconds=self.sizes.deadlines[name],
                              finished=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              checks=checks)
                if not any("not run" in (c.get("reason") or "") for c in checks):
                    fairseq_runs.write_json(kept, fairseq_runs.finite_or_none(record))
                self.log(f"{name}: {record['status']} in {record['seconds']:.0f}s")
            fairseq_runs.write_json(os.path.join(self.out, f"{name}.json"), fairseq_runs.finite_or_none(record))
            records[name] = record
            with open(os.path.join(self.out, "summary.md"), "w", encoding="utf-8") as f:
                f.write(summary_markdown(records, self.dry_run, command))
        return records


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m realformer_tools.experiments.gpu_check",
                                description=sys.modules[__package__].__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma list of {', '.join(SECTIONS)} (default: all, in that order: the priority)")
    p.add_argument("--budget", type=float, default=BUDGET_SECONDS,
                   help="seconds for the whole command; each section also has its own deadline "
                        "(default: %(default)s)")
    p.add_argument("--out", default=None, help=f"section JSON, summary.md, kernel_rule.json and the speed JSON "
                                               f"(default: {DEFAULT_OUT}; with --dry-run {DRY_RUN_OUT})")
    p.add_argument("--work", default=None, help="checkpoints, logs, finished sections (default: <out>/../work)")
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
