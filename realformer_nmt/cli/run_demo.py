#!/usr/bin/env python
"""CPU demo: synthetic En->De corpus -> small RealFormer -> beam search -> sacreBLEU.

Steps: (1) ``prepare("synthetic", --data)`` unless already prepared with the same
settings; (2) ``fairseq-train`` (3+3 layers, d=256) for ``--max-update`` updates, with
progress and an ETA every 25 updates; (3) ``fairseq-generate`` on the test split with
``checkpoint_best.pt``; (4) sacreBLEU of the detokenized hypotheses against the raw
references, a few example translations, and ``--json`` (default runs/demo/demo.json).

A slow or busy machine: ``--max-minutes`` caps this run's training time (fairseq
``--stop-time-hours``). A run the cap stops before ``--max-update`` is not scored: it says
so in one line (updates done and planned, and the command that finishes it), records
``"stopped_early": true`` in the JSON file and exits with status 3. Running the same
command again continues from ``checkpoint_last.pt`` (another ``--max-minutes`` of
training) until every update is done, then scores; ``--max-minutes 0`` removes the cap.
A finished run, or one with other settings, starts from scratch (``--fresh`` always does,
``--resume`` always continues).

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


# idle 2-core CPU, 3+3 layers d=256, --max-tokens 2048: 600 updates in 3.5-7 minutes (428.6 s, 2026-11-25)
SECONDS_PER_UPDATE = (0.35, 0.72)
STATE_FILE = "demo_state.json"  # in --save-dir: the recipe of its checkpoints and whether it finished
EXIT_STOPPED_EARLY = 3


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
                   help="cap on this run's training time (fairseq --stop-time-hours; 0 = none); a run "
                        "it stops early is not scored, exits with status 3, and the same command "
                        "continues it (default: %(default)s)")
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
                       help="delete checkpoint*.pt in --save-dir and train from scratch (the default "
                            "unless the last run with the same settings was stopped early)")
    group.add_argument("--resume", action="store_true",
                       help="keep --save-dir checkpoints: fairseq continues from checkpoint_last.pt "
                            "(the default after a run with the same settings was stopped early)")
    p.add_argument("--num-examples", type=int, default=5, help="example translations to print (default: %(default)s)")
    p.add_argument("--train-args", default="",
                   help="extra fairseq-train flags, one shell-quoted string (e.g. \"--dropout 0.2\")")
    args = p.parse_args(argv)
    args.arch = args.arch or ("transformer" if args.vanilla else "realformer_transformer")
    if args.max_update < 1:
        p.error("--max-update must be at least 1")
    if args.max_minutes < 0:
        p.error("--max-minutes must be 0 (no cap) or more")
    args.argv = list(sys.argv[1:] if argv is None else argv)
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


def train_command(args, hours=None):
    hours = args.max_minutes / 60 if hours is None else hours
    flags = TRAIN_FLAGS.format(lr=args.lr, warmup=args.warmup_updates, max_tokens=args.max_tokens,
                               seed=args.seed, max_update=args.max_update, hours=hours)
    return ([fairseq_cli("fairseq-train"), args.data, "--arch", args.arch, "--save-dir", args.save_dir]
            + MODEL_FLAGS.split() + flags.split() + user_dir_flags() + residual_flags(args)
            + shlex.split(args.train_args))


def recipe(cmd):
    """What makes two training commands the same run: all but the tool's path, --user-dir
    and the time cap (a run stopped by the cap continues under any cap)."""
    out, skip = [], False
    for word in cmd[1:]:
        if skip:
            skip = False
        elif word in ("--user-dir", "--stop-time-hours"):
            skip = True
        else:
            out.append(str(word))
    return out


def generate_command(args):
    return [fairseq_cli("fairseq-generate"), args.data, "--path", os.path.join(args.save_dir, "checkpoint_best.pt"),
            "--gen-subset", "test", "--beam", "5", "--batch-size", "128", "--remove-bpe", "sentencepiece",
            # German output is about as long as the English input: bound runaway hypotheses
            "--max-len-a", "1.5", "--max-len-b", "10",
            "--scoring", "sacrebleu", "--cpu"] + user_dir_flags()


def run_step(name, cmd, log_path):
    """Run ``cmd``, write its output to ``log_path``; return (seconds, output lines)."""
    log(f"{name}: {' '.join(shlex.quote(c) for c in cmd)}")
    start, lines = time.time(), []
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # progress arrives as it happens
    with open(log_path, "w", encoding="utf-8", buffering=1) as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                encoding="utf-8", errors="replace", env=env)
        for line in proc.stdout:
            out.write(line)
            lines.append(line.rstrip("\n"))
        proc.wait()
    seconds = time.time() - start
    if proc.returncode != 0:
        tail = "\n".join(lines[-25:])
        raise DemoError(f"{name} failed with exit code {proc.returncode} (full log: {log_path}); last lines:\n{tail}")
    return seconds, lines


def read_state(save_dir):
    try:
        with open(os.path.join(save_dir, STATE_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_state(save_dir, state):
    with open(os.path.join(save_dir, STATE_FILE), "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)


def checkpoint_progress(path):
    """(updates, fairseq's cumulative training seconds) stored in a checkpoint, or (0, 0.0)."""
    if not os.path.exists(path):
        return 0, 0.0
    from realformer_nmt.fairseq_patches.safe_checkpoint_loading import safe_load_checkpoint_to_cpu

    try:
        state = safe_load_checkpoint_to_cpu(path)
    except Exception as exc:  # noqa: BLE001 - reported as one line
        raise DemoError(f"{exc}; or run with --fresh") from None
    history = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    return int(history[-1].get("num_updates", 0)), float(extra.get("previous_training_time", 0.0))


def train(args, out_dir):
    """Train, resuming when the last run with these settings was stopped early; returns
    ``(seconds, lines of this run, state)`` where ``state`` (also --save-dir/demo_state.json)
    has the updates done and whether the run stopped before --max-update."""
    from realformer_nmt.experiments import fairseq_runs

    os.makedirs(args.save_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "train.log")
    last = os.path.join(args.save_dir, "checkpoint_last.pt")
    this_recipe = recipe(train_command(args))
    previous = read_state(args.save_dir)
    resume = args.resume or (not args.fresh and os.path.exists(last) and previous is not None
                             and previous.get("stopped_early") and previous.get("recipe") == this_recipe)
    if not resume:
        if previous is not None and previous.get("stopped_early") and not args.fresh:
            log(f"the checkpoints in {args.save_dir} are from a run with other settings: training from scratch")
        clear_checkpoints(args.save_dir)
        if os.path.exists(log_path):
            os.remove(log_path)
        previous = None
    done, used = checkpoint_progress(last) if resume else (0, 0.0)
    # fairseq's --stop-time-hours counts all training time stored in the checkpoint, so
    # this run's cap is added to what earlier runs used
    hours = (used + args.max_minutes * 60) / 3600 if args.max_minutes > 0 else 0
    cmd = train_command(args, hours)
    left = max(0, args.max_update - done)
    low, high = (left * s / 60 for s in SECONDS_PER_UPDATE)
    cap = f"; capped at {args.max_minutes:g} minutes (--max-minutes)" if args.max_minutes > 0 else ""
    log(f"{'resuming at update ' + str(done) + ' of ' if done else 'training '}{args.max_update} updates: "
        f"{left} to go, about {low:.1f}-{high:.1f} minutes on 2 idle CPU cores, longer on a busy "
        f"machine{cap}; progress with an ETA every 25 updates")
    log(f"fairseq-train: {fairseq_runs.quote(cmd)}")
    start = time.time()
    returncode, lines = fairseq_runs.run_logged(cmd, log_path, log=log, max_update=args.max_update)
    seconds = time.time() - start
    if returncode != 0:
        tail = "\n".join(lines[-25:])
        raise DemoError(f"fairseq-train failed with exit code {returncode} (full log: {log_path}); "
                        f"last lines:\n{tail}")
    _, updates = train_stats(lines)
    updates = updates if updates is not None else done
    capped = any("Stopping training due to cumulative_training_time" in line for line in lines)
    state = {
        "recipe": this_recipe,
        "stopped_early": updates < args.max_update,
        "num_updates": updates,
        "max_update": args.max_update,
        "runs": (previous or {}).get("runs", 0) + 1,
        "train_seconds_total": round((previous or {}).get("train_seconds_total", 0.0) + seconds, 1),
        "stop_reason": None,
    }
    if state["stopped_early"]:
        state["stop_reason"] = (f"the --max-minutes {args.max_minutes:g} cap on training time was reached"
                                if capped else f"fairseq-train stopped before --max-update (see {log_path})")
    write_state(args.save_dir, state)
    return seconds, lines, state


def finish_command(args):
    """The command that continues a run stopped early: the same one (a --fresh dropped)."""
    words = [w for w in args.argv if w != "--fresh"]
    if os.environ.get("MAKELEVEL"):  # started by `make demo`
        return "make demo" + (f" DEMO_ARGS={shlex.quote(shlex.join(words))}" if words else "")
    started = sys.argv[0] if sys.argv and sys.argv[0] else "realformer-demo"
    if not started.endswith(".py"):  # the installed console command
        return shlex.join([os.path.basename(started), *words])
    python, script = (os.path.relpath(p) for p in (sys.executable, os.path.abspath(started)))
    return shlex.join([sys.executable if python.startswith("..") else python, script, *words])


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
    train_seconds, train_lines, state = train(args, out_dir)
    valid_loss, updates = train_stats(train_lines)
    common = {
        "stopped_early": state["stopped_early"],
        "num_updates": state["num_updates"],
        "max_update": args.max_update,
        "stop_reason": state["stop_reason"],
        "train_runs": state["runs"],
        "train_seconds": round(train_seconds, 1),
        "train_seconds_total": state["train_seconds_total"],
        "arch": args.arch,
        "vanilla": args.vanilla,
        "residual_attention_paths": None if args.vanilla else args.residual_attention_paths,
        "residual_attention_mode": None if args.vanilla else args.residual_attention_mode,
        "final_valid_loss": valid_loss,
    }
    if state["stopped_early"]:
        report = dict(common, bleu=None, finish_command=finish_command(args),
                      checkpoint=os.path.abspath(os.path.join(args.save_dir, "checkpoint_last.pt")))
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, ensure_ascii=False)
        return report
    gen_seconds, gen_lines = run_step("fairseq-generate", generate_command(args),
                                      os.path.join(out_dir, "generate.txt"))
    hyps, fairseq_bleu = parse_generation(gen_lines)
    result, signature, examples = score(hyps, summary["raw_dir"])
    report = dict(
        common,
        bleu=round(result.score, 2),
        generate_seconds=round(gen_seconds, 1),
        num_test_sentences=len(hyps),
        sacrebleu=str(result),
        sacrebleu_signature=signature,
        fairseq_bleu_line=fairseq_bleu,
        data=os.path.abspath(args.data),
        checkpoint=os.path.abspath(os.path.join(args.save_dir, "checkpoint_best.pt")),
        examples=[dict(src=s, ref=r, hyp=h) for s, r, h in examples[:args.num_examples]],
    )
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    return report


def print_stopped_early(report):
    print(f"TRAINING STOPPED EARLY: {report['num_updates']} of {report['max_update']} updates done "
          f"({report['stop_reason']}), so the model is not scored; to finish it (it continues from "
          f"checkpoint_last.pt) run: {report['finish_command']}  (with --max-minutes 0: no cap)")


def print_report(report):
    for ex in report["examples"]:
        print(f"  EN:  {ex['src']}\n  REF: {ex['ref']}\n  HYP: {ex['hyp']}\n")
    print(f"arch={report['arch']} updates={report['num_updates']} train={report['train_seconds_total']}s "
          f"generate={report['generate_seconds']}s test sentences={report['num_test_sentences']}")
    print(f"{report['sacrebleu']}  ({report['sacrebleu_signature']})")


def main(argv=None):
    global corpora
    args = parse_args(argv)
    os.environ.setdefault("REALFORMER_NMT_DATA_FIXES", "1")  # train on and score every sentence (docs/reliability.md)
    logging.basicConfig(format="%(message)s", level=logging.WARNING)  # quiets fairseq's import-time INFO
    from realformer_nmt.data import corpora

    try:
        report = run(args)
    except (DemoError, corpora.DataError) as exc:
        print(f"run_demo.py: error: {exc}", file=sys.stderr)
        return 1
    if report["stopped_early"]:
        print_stopped_early(report)
        log(f"summary (no BLEU: training stopped early) written to {args.json}")
        return EXIT_STOPPED_EARLY
    print_report(report)
    log(f"summary written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
