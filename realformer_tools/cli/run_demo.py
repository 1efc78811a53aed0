#!/usr/bin/env python
"""CPU demo: synthetic En->De corpus -> small RealFormer -> beam search -> sacreBLEU.

Steps: (1) the synthetic corpus is prepared in --data unless it is there with the same
settings; (2) fairseq-train (2+2 layers, d=128 by default) for --max-update updates, a
progress line with an ETA every --log-interval updates; (3) fairseq-generate on the test
split with checkpoint_best.pt; (4) sacreBLEU of the detokenized output against the raw
references, a few example translations, and --json (default runs/demo/demo.json).

A slow or busy machine: --max-minutes caps this run's training time (fairseq
--stop-time-hours). A run the cap stops before --max-update is still translated and
scored, labelled UNDERTRAINED, with the command that finishes it (--max-minutes 0: no cap;
it continues from checkpoint_last.pt) and an estimate of the time left; the JSON file
records "stopped_early": true. Running the demo again with the same settings continues
such a run; a finished run, or one with other settings, starts from scratch (--fresh
always does, --resume always continues).

--vanilla trains fairseq's plain transformer with the same sizes and no residual-attention
flags (a baseline). Exit status: 0 with a BLEU printed, 1 when a step failed, 2 for a bad
flag. The logs of fairseq-train and fairseq-generate go next to the JSON file.
"""

import argparse
import json
import os
import shlex
import sys

from . import _demo
from ._common import run_command


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None,
                   help="fairseq architecture (default: realformer_transformer; transformer with --vanilla)")
    p.add_argument("--vanilla", action="store_true",
                   help="baseline: fairseq's plain 'transformer' arch with the same sizes, no residual-attention flags")
    p.add_argument("--residual-attention-paths", default="encoder,decoder,cross",
                   help="passed to fairseq-train (default: %(default)s)")
    p.add_argument("--residual-attention-mode", default="sum", help="passed to fairseq-train (default: %(default)s)")
    # the model and its training: (flag, type, default, help), each help ending in the default
    for flag, kind, default, text in (
            ("--layers", int, 2, "encoder and decoder layers"),
            ("--embed-dim", int, 128, "model dim; the FFN is twice as wide, 4 heads"),
            ("--max-update", int, 300, "training updates (the README gives the time they take)"),
            ("--max-minutes", float, 10.0, "cap on this run's training time (fairseq --stop-time-hours; 0 = "
                                           "none); a run it stops early is scored as it is, labelled undertrained"),
            ("--lr", float, 4e-3, "peak learning rate"),
            ("--warmup-updates", int, 60, "inverse_sqrt warmup"),
            ("--max-tokens", int, 1024, "tokens per batch"),
            ("--log-interval", int, 20, "a progress line with an ETA every N updates"),
            ("--threads", int, 1, "OMP_NUM_THREADS of fairseq-train and fairseq-generate: on a busy machine two "
                                  "threads each run several times slower than one"),
            ("--seed", int, 1, "training seed"),
            ("--num-examples", int, 5, "example translations to print")):
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default: %(default)s)")
    p.add_argument("--data", default=os.path.join("data-bin", "demo_en_de"),
                   help="binarized synthetic corpus, prepared here if missing (default: %(default)s)")
    p.add_argument("--save-dir", default=os.path.join("runs", "demo", "checkpoints"),
                   help="checkpoint directory (default: %(default)s)")
    p.add_argument("--json", default=os.path.join("runs", "demo", "demo.json"),
                   help="summary file; train.log and generate.txt go next to it (default: %(default)s)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--fresh", action="store_true",
                       help="delete checkpoint*.pt in --save-dir and train from scratch (the default "
                            "unless the last run with the same settings was stopped early)")
    group.add_argument("--resume", action="store_true",
                       help="keep --save-dir checkpoints: fairseq continues from checkpoint_last.pt "
                            "(the default after a run with the same settings was stopped early)")
    p.add_argument("--train-args", default="",
                   help="extra fairseq-train flags, one shell-quoted string (e.g. \"--dropout 0.2\")")
    args = p.parse_args(argv)
    args.arch = args.arch or ("transformer" if args.vanilla else "realformer_transformer")
    for flag in ("max_update", "layers", "embed_dim", "log_interval", "threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.embed_dim % 4:
        p.error("--embed-dim must be a multiple of 4 (the demo's 4 attention heads)")
    if args.max_minutes < 0:
        p.error("--max-minutes must be 0 (no cap) or more")
    try:
        args.train_args = shlex.split(args.train_args)
    except ValueError as exc:
        p.error(f"--train-args: {exc}")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def log(message):
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def continue_command(args):
    """The command that finishes a run its cap stopped: the same one, no --fresh, no cap."""
    words, skip = [], False
    for word in args.argv:
        if skip or word == "--fresh" or word.startswith("--max-minutes="):
            skip = False
        elif word == "--max-minutes":
            skip = True
        else:
            words.append(word)
    words += ["--max-minutes", "0"]
    if os.environ.get("MAKELEVEL"):  # started by `make demo`
        value = shlex.join(words)
        return f'make demo DEMO_ARGS="{value}"' if not set('"$`\\') & set(value) else \
            f"make demo DEMO_ARGS={shlex.quote(value)}"
    started = sys.argv[0] if sys.argv and sys.argv[0] else "realformer-demo"
    if not started.endswith(".py"):  # the installed console command
        return shlex.join([os.path.basename(started), *words])
    python, script = (os.path.relpath(p) for p in (sys.executable, os.path.abspath(started)))
    return shlex.join([sys.executable if python.startswith("..") else python, script, *words])


def run(args):
    """All steps; returns the report, also written to --json."""
    out_dir = os.path.dirname(os.path.abspath(args.json))
    os.makedirs(out_dir, exist_ok=True)
    prepared = _demo.ensure_data(args.data, log)
    state = _demo.train(args, out_dir, log)
    scored = _demo.decode_and_score(args, prepared, out_dir, log)
    report = {
        "bleu": scored["bleu"],
        "undertrained": state["stopped_early"],
        **{key: state[key] for key in ("stopped_early", "num_updates", "max_update", "stop_reason",
                                       "minutes_left_estimate", "train_seconds", "train_cpu_seconds",
                                       "train_seconds_total", "final_valid_loss")},
        "finish_command": continue_command(args) if state["stopped_early"] else None,
        "train_runs": state["runs"],
        "arch": args.arch,
        "vanilla": args.vanilla,
        "residual_attention_paths": None if args.vanilla else args.residual_attention_paths,
        "residual_attention_mode": None if args.vanilla else args.residual_attention_mode,
        # the plugin's data fixes (docs/reliability.md), as fairseq-train and fairseq-generate had them
        "environment": {"REALFORMER_NMT_DATA_FIXES": os.environ.get("REALFORMER_NMT_DATA_FIXES", "")},
        "generate_seconds": scored["seconds"],
        "num_test_sentences": scored["sentences"],
        "sacrebleu": scored["sacrebleu"],
        "sacrebleu_signature": scored["signature"],
        "data": os.path.abspath(args.data),
        "checkpoint": scored["checkpoint"],
        "examples": scored["examples"],
    }
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    return report


def print_report(report):
    for ex in report["examples"]:
        print(f"  EN:  {ex['src']}\n  REF: {ex['ref']}\n  HYP: {ex['hyp']}\n")
    print(f"arch={report['arch']} updates={report['num_updates']} of {report['max_update']} "
          f"train={report['train_seconds_total']}s generate={report['generate_seconds']}s "
          f"test sentences={report['num_test_sentences']}")
    print(f"{report['sacrebleu']}  ({report['sacrebleu_signature']})")
    if report["undertrained"]:
        left = report["minutes_left_estimate"]
        print(f"UNDERTRAINED: training stopped early, after {report['num_updates']} of {report['max_update']} "
              f"updates ({report['stop_reason']}); the BLEU above is that checkpoint's. To finish it "
              f"(continues from checkpoint_last.pt"
              + (f", about {left:g} more minutes at this run's pace" if left is not None else "")
              + f"): {report['finish_command']}")


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("REALFORMER_NMT_DATA_FIXES", "1")  # train on and score every sentence (docs/reliability.md)

    def show(report):
        print_report(report)
        log(f"summary written to {args.json}")

    return run_command("run_demo.py", lambda: run(args), show=show, status=1)


if __name__ == "__main__":
    sys.exit(main())
