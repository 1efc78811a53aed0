"""The command: ``python -m realformer_tools.experiments.gpu_check`` (``make gpu-check``)."""

import argparse
import os
import sys

from realformer_nmt.errors import ConfigError
from realformer_nmt.fairseq_fixes_switch import install_fairseq_fixes
from realformer_nmt.modules.residual_attention import KERNELS

from .runner import GpuCheck
from .settings import DEFAULT_OUT, DRY_RUN_OUT, PRECISIONS, STEPS


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m realformer_tools.experiments.gpu_check",
                                description=sys.modules[__package__].__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default=",".join(STEPS),
                   help=f"comma list of {', '.join(STEPS)} (default: all, in that order)")
    p.add_argument("--out", default=None,
                   help=f"step JSON, summary.md, kernel_rule.json and the speed JSON go here "
                        f"(default: {DEFAULT_OUT}; with --dry-run {DRY_RUN_OUT})")
    p.add_argument("--work", default=None,
                   help="checkpoints and logs (default: runs/gpu_check; with --dry-run <out>/gpu_check_work)")
    p.add_argument("--quick", action="store_true",
                   help="the main answers in one short command (sized for 9 minutes on one H100): exactness per "
                        "parameter tensor, fp16/bf16 training, speed and memory at T = 128 and 512, two DDP ranks; "
                        "writes <out>/quick.json and <out>/summary.md (run it first, then the full check)")
    p.add_argument("--dry-run", action="store_true",
                   help="every step on the CPU at toy sizes (CUDA-only parts reported as skipped)")
    p.add_argument("--force", "--redo", action="store_true", dest="force",
                   help="run the chosen steps again even where their results exist")
    p.add_argument("--kernels", default=None,
                   help=f"comma list of kernels the train and speed steps run (default: {', '.join(KERNELS)})")
    p.add_argument("--precisions", default=None,
                   help=f"comma list of precisions the train step runs (default: {', '.join(PRECISIONS)})")
    p.add_argument("--jobs", type=int, default=None,
                   help="fairseq-train runs at a time in the train step (default: 4 on CUDA, 2 dry)")
    p.add_argument("--seeds", default=None,
                   help="comma list of seeds the train step runs fp32 / fp16 / bf16 with, for the precision "
                        "judgement over seeds (default: 1,2,3; dry run 1,2)")
    p.add_argument("--rejudge", metavar="FILE", default=None,
                   help="judge a committed quick.json again by today's yardsticks (no GPU needed): writes "
                        "rejudged.json and rejudged.md next to it (or into --out); float64-diag.md, "
                        "speed_float16.json and logs/ beside it are used where present")
    args = p.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        p.error(f"--steps: unknown {', '.join(unknown) or '(empty)'} (choose from {', '.join(STEPS)})")
    if args.jobs is not None and args.jobs < 1:
        p.error("--jobs must be at least 1")
    args.steps = steps
    if args.seeds is not None:
        try:
            args.seeds = [int(w) for w in args.seeds.split(",") if w.strip()]
        except ValueError:
            p.error(f"--seeds: {args.seeds!r} is not a comma list of integers")
        if not args.seeds:
            p.error("--seeds: empty")
    for flag, choices in (("kernels", KERNELS), ("precisions", tuple(PRECISIONS))):
        value = getattr(args, flag)
        if value is not None:
            words = [w.strip() for w in value.split(",") if w.strip()]
            bad = [w for w in words if w not in choices]
            if bad or not words:
                p.error(f"--{flag}: unknown {', '.join(bad) or '(empty)'} (choose from {', '.join(choices)})")
            setattr(args, flag, words)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.rejudge:
        from .rejudge import rejudge

        if not os.path.isfile(args.rejudge):
            print(f"gpu_check: error: --rejudge: {args.rejudge} does not exist", file=sys.stderr)
            return 2
        try:
            record, path = rejudge(args.rejudge, args.out)
        except ValueError as exc:
            print(f"gpu_check: error: {exc}", file=sys.stderr)
            return 2
        print(f"rejudged: {record['rejudged']['original_status']} -> {record['status']} ({os.path.relpath(path)})")
        return 1 if record["status"] == "failed" else 0
    install_fairseq_fixes()  # the ddp step loads checkpoints in this process
    try:
        ctx = GpuCheck(args.out, args.work, args.dry_run, args.jobs, args.force,
                       kernels=args.kernels, precisions=args.precisions, seeds=args.seeds)
        if args.quick:
            record = ctx.run_quick()
        else:
            results = ctx.run(args.steps)
    except ConfigError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    if args.quick:
        print(f"summary: {os.path.join(ctx.out, 'summary.md')}")
        print(f"quick: {record['status']} ({ctx.quick_path()})")
        return 1 if record["status"] == "failed" else 0
    print(f"summary: {os.path.join(ctx.out, 'summary.md')}")
    for step, record in results.items():
        print(f"{step}: {record['status']}")
    return 1 if any(r["status"] == "failed" for r in results.values()) else 0
