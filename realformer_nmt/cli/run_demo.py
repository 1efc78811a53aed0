#!/usr/bin/env python
"""CPU demo: synthetic En->De corpus -> small RealFormer -> beam search -> sacreBLEU.

Steps: (1) ``prepare("synthetic", --data)`` unless already prepared with the same
settings; (2) ``fairseq-train`` (3+3 layers, d=256) from scratch for ``--max-update``
updates (capped by ``--max-minutes``); (3) ``fairseq-generate`` on the test split with
``checkpoint_best.pt``; (4) sacreBLEU of the detokenized hypotheses against the raw
references, a few example translations, and ``--json`` (default runs/demo/demo.json).

``--vanilla`` trains fairseq's plain ``transformer`` with the same sizes and no
residual-attention flags (a baseline). Logs of both subprocesses go next to the JSON file.
"""

import argparse
import glob
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time

from ._common import user_dir

corpora = None  # realformer_nmt.data.corpora, imported by main() after parsing: fairseq loads slowly

DEMO_DATA = dict(vocab_size=1000, seed=1)
MODEL_FLAGS = (
    "--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 "
    "--encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 "
    "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings"
)
TRAIN_FLAGS = (
    "--optimizer adam --adam-betas (0.9,0.98) --lr {lr} --lr-scheduler inverse_sqrt "
    "--warmup-updates {warmup} --dropout 0.1 --criterion label_smoothed_cross_entropy "
    "--label-smoothing 0.1 --max-tokens {max_tokens} --cpu --no-epoch-checkpoints --seed {seed} "
    "--max-update {max_update} --stop-time-hours {hours} "
    "--log-format simple --log-interval 25"
)


class DemoError(Exception):
    """A step failed; the message is printed as one line (plus a log tail) and exit is 1."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None,
                   help="fairseq architecture (default: realformer_transformer; transformer with --vanilla)")
    p.add_argument("--vanilla", action="store_true",
                   help="baseline: fairseq's plain 'transformer' arch with the same sizes, no residual-attention flags")
    p.add_argument("--residual-attention-paths", default="encoder,decoder,cross",
                   help="passed to fairseq-train (default: %(default)s)")
    p.add_argument("--residual-attention-mode", default="sum", help="passed to fairseq-train (default: %(default)s)")
    p.add_argument("--max-update", type=int, default=600,
                   help="training updates; 600 take about 4-5 minutes on 2 idle CPU cores (default: %(default)s)")
    p.add_argument("--max-minutes", type=float, default=10.0,
                   help="wall-clock cap on training (fairseq --stop-time-hours; 0 = none); a slow or "
                        "busy machine stops early with a lower BLEU (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup-updates", type=int, default=200, help="inverse_sqrt warmup (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=2048,
                   help="tokens per batch; on this corpus 2048 learns much faster per CPU second "
                        "than 4096 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="training seed (default: %(default)s)")
    p.add_argument("--data", default=os.path.join("data-bin", "demo_en_de"),
                   help="binarized synthetic corpus, prepared here if missing (default: %(default)s)")
    p.add_argument("--save-dir", default=os.path.join("runs", "demo", "checkpoints"),
                   help="checkpoint directory (default: %(default)s)")
    p.add_argument("--json", default=os.path.join("runs", "demo", "demo.json"),
                   help="summary file; train.log and generate.txt go next to it (default: %(default)s)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--fresh", action="store_true",
                       help="delete checkpoint*.pt in --save-dir and train from scratch (the default)")
    group.add_argument("--resume", action="store_true",
                       help="keep --save-dir checkpoints: fairseq continues from checkpoint_last.pt")
    p.add_argument("--num-examples", type=int, default=5, help="example translations to print (default: %(default)s)")
    p.add_argument("--train-args", default="",
                   help="extra fairseq-train flags, one shell-quoted string (e.g. \"--dropout 0.2\")")
    args = p.parse_args(argv)
    args.arch = args.arch or ("transformer" if args.vanilla else "realformer_transformer")
    if args.max_update < 1:
        p.error("--max-update must be at least 1")
    return args


def log(message):
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def fairseq_cli(name):
    """Path of a fairseq console script installed next to this interpreter."""
    from realformer_nmt.experiments import fairseq_runs  # after main() has imported the package

    try:
        return fairseq_runs.fairseq_cli(name)
    except fairseq_runs.RunError as exc:
        raise DemoError(str(exc)) from None


def ensure_data(data):
    """Prepare the synthetic corpus in ``data`` unless it is there with the demo settings."""
    if corpora.prepared_settings(data) == corpora.prepare_settings("synthetic", **DEMO_DATA):
        log(f"corpus already prepared in {data}")
    else:
        log(f"preparing the synthetic corpus in {data}")
        corpora.prepare("synthetic", data, **DEMO_DATA)
    with open(os.path.join(data, "prepare.json"), encoding="utf-8") as f:
        return json.load(f)


def user_dir_flags():
    """--user-dir realformer_nmt: registers the model and, under torch >= 2.6, is what lets
    fairseq load its own checkpoints with ``weights_only`` (so --vanilla needs it too)."""
    return ["--user-dir", user_dir()]


def residual_flags(args):
    if args.vanilla:
        return []
    return ["--residual-attention-paths", args.residual_attention_paths,
            "--residual-attention-mode", args.residual_attention_mode]


def train_command(args):
    flags = TRAIN_FLAGS.format(lr=args.lr, warmup=args.warmup_updates, max_tokens=args.max_tokens,
                               seed=args.seed, max_update=args.max_update, hours=args.max_minutes / 60)
    return ([fairseq_cli("fairseq-train"), args.data, "--arch", args.arch, "--save-dir", args.save_dir]
            + MODEL_FLAGS.split() + flags.split() + user_dir_flags() + residual_flags(args)
            + shlex.split(args.train_args))


def generate_command(args):
    return [fairseq_cli("fairseq-generate"), args.data, "--path", os.path.join(args.save_dir, "checkpoint_best.pt"),
            "--gen-subset", "test", "--beam", "5", "--batch-size", "128", "--remove-bpe", "sentencepiece",
            # German output is about as long as the English input: bound runaway hypotheses
            "--max-len-a", "1.5", "--max-len-b", "10",
            "--scoring", "sacrebleu", "--cpu"] + user_dir_flags()


def run_step(name, cmd, log_path, echo=None):
    """Run ``cmd``, tee its output to ``log_path``, echo matching lines; return (seconds, output)."""
    log(f"{name}: {' '.join(shlex.quote(c) for c in cmd)}")
    start, lines = time.time(), []
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # progress arrives as it happens
    with open(log_path, "w", encoding="utf-8", buffering=1) as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                encoding="utf-8", errors="replace", env=env)
        for line in proc.stdout:
            out.write(line)
            lines.append(line.rstrip("\n"))
            if echo and echo.search(line):
                log(line.strip().split(" | ", 2)[-1])
        proc.wait()
    seconds = time.time() - start
    if proc.returncode != 0:
        tail = "\n".join(lines[-25:])
        raise DemoError(f"{name} failed with exit code {proc.returncode} (full log: {log_path}); last lines:\n{tail}")
    return seconds, lines


def clear_checkpoints(save_dir):
    for path in glob.glob(os.path.join(save_dir, "checkpoint*.pt")):
        os.remove(path)


def parse_generation(lines):
    """Hypotheses (``D-`` lines, detokenized) by sentence id and fairseq's own BLEU line."""
    hyps, bleu_line = {}, None
    for line in lines:
        match = re.match(r"D-(\d+)\t[^\t]*\t(.*)$", line)
        if match:
            hyps[int(match.group(1))] = match.group(2)
        elif "Generate test with beam=" in line:
            bleu_line = line.split(" | ")[-1].strip()
    return hyps, bleu_line


def score(hyps, raw_dir):
    """sacreBLEU (13a, cased) of the hypotheses against the untouched raw test references."""
    import sacrebleu

    from realformer_nmt.data.pipeline import read_lines

    sources = read_lines(os.path.join(raw_dir, "test.en"))
    refs = read_lines(os.path.join(raw_dir, "test.de"))
    if sorted(hyps) != list(range(len(refs))):
        raise DemoError(f"fairseq-generate returned {len(hyps)} hypotheses for {len(refs)} test sentences")
    ordered = [hyps[i] for i in range(len(refs))]
    bleu = sacrebleu.metrics.BLEU()
    result = bleu.corpus_score(ordered, [refs])
    return result, str(bleu.get_signature()), list(zip(sources, refs, ordered))


def train_stats(lines):
    """Last validation loss and last update count in a fairseq-train log."""
    valid = re.compile(r"\| valid on 'valid' subset \| loss ([\d.]+)")
    losses = [float(m.group(1)) for m in map(valid.search, lines) if m]
    updates = [int(m.group(1)) for m in (re.search(r"num_updates (\d+)", line) for line in lines) if m]
    return (losses[-1] if losses else None), (updates[-1] if updates else None)


def run(args):
    out_dir = os.path.dirname(os.path.abspath(args.json))
    os.makedirs(out_dir, exist_ok=True)
    summary = ensure_data(args.data)
    os.makedirs(args.save_dir, exist_ok=True)
    if not args.resume:
        clear_checkpoints(args.save_dir)
    echo = re.compile(r"\| (train_inner|valid) \||done training|Stopping training")
    train_seconds, train_lines = run_step("fairseq-train", train_command(args),
                                          os.path.join(out_dir, "train.log"), echo)
    gen_seconds, gen_lines = run_step("fairseq-generate", generate_command(args),
                                      os.path.join(out_dir, "generate.txt"))
    hyps, fairseq_bleu = parse_generation(gen_lines)
    result, signature, examples = score(hyps, summary["raw_dir"])
    valid_loss, updates = train_stats(train_lines)
    report = {
        "bleu": round(result.score, 2),
        "train_seconds": round(train_seconds, 1),
        "generate_seconds": round(gen_seconds, 1),
        "arch": args.arch,
        "vanilla": args.vanilla,
        "residual_attention_paths": None if args.vanilla else args.residual_attention_paths,
        "residual_attention_mode": None if args.vanilla else args.residual_attention_mode,
        "max_update": args.max_update,
        "num_updates": updates,
        "final_valid_loss": valid_loss,
        "num_test_sentences": len(hyps),
        "sacrebleu": str(result),
        "sacrebleu_signature": signature,
        "fairseq_bleu_line": fairseq_bleu,
        "data": os.path.abspath(args.data),
        "checkpoint": os.path.abspath(os.path.join(args.save_dir, "checkpoint_best.pt")),
        "examples": [dict(src=s, ref=r, hyp=h) for s, r, h in examples[:args.num_examples]],
    }
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    return report


def print_report(report):
    for ex in report["examples"]:
        print(f"  EN:  {ex['src']}\n  REF: {ex['ref']}\n  HYP: {ex['hyp']}\n")
    print(f"arch={report['arch']} updates={report['num_updates']} train={report['train_seconds']}s "
          f"generate={report['generate_seconds']}s test sentences={report['num_test_sentences']}")
    print(f"{report['sacrebleu']}  ({report['sacrebleu_signature']})")


def main(argv=None):
    global corpora
    args = parse_args(argv)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)  # quiets fairseq's import-time INFO
    from realformer_nmt.data import corpora

    try:
        report = run(args)
    except (DemoError, corpora.DataError) as exc:
        print(f"run_demo.py: error: {exc}", file=sys.stderr)
        return 1
    print_report(report)
    log(f"summary written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
