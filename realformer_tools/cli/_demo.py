"""The steps of ``run_demo``: the corpus, training that continues a run its time cap
stopped (progress with an ETA from the first line on), and decoding plus sacreBLEU.

What makes a run "the same" (and so continued rather than restarted) is its
``fairseq-train`` command minus the tool's path, ``--user-dir`` and the time cap; it is
kept in ``--save-dir/demo_state.json`` with the updates done and whether the run stopped
before ``--max-update``.
"""

import glob
import json
import os
import re
import resource
import shlex
import subprocess
import time

from realformer_nmt.errors import RealFormerError

from ._common import user_dir

DEMO_DATA = dict(vocab_size=1000, seed=1)
MODEL_FLAGS = (
    "--encoder-layers {layers} --decoder-layers {layers} --encoder-embed-dim {dim} --decoder-embed-dim {dim} "
    "--encoder-ffn-embed-dim {ffn} --decoder-ffn-embed-dim {ffn} "
    "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings"
)
TRAIN_FLAGS = (
    "--optimizer adam --adam-betas (0.9,0.98) --lr {lr} --lr-scheduler inverse_sqrt "
    "--warmup-updates {warmup} --dropout 0.1 --criterion label_smoothed_cross_entropy "
    "--label-smoothing 0.1 --max-tokens {max_tokens} --cpu --no-epoch-checkpoints --seed {seed} "
    "--max-update {max_update} --stop-time-hours {hours} "
    "--log-format simple --log-interval {log_interval}"
)

STATE_FILE = "demo_state.json"

_BEGIN = re.compile(r"begin training epoch|Start iterating over samples")
_LOADED = re.compile(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)")
_UPDATES = re.compile(r"num_updates[= ](\d+)")
_LOSS = re.compile(r"\bloss[= ]([\d.]+)")


class DemoError(RealFormerError):
    """A step failed; the message is printed as one line (plus a log tail) and exit is 1."""


def ensure_data(data, log):
    """Prepare the synthetic corpus in ``data`` unless it is there with the demo settings;
    returns its prepare.json."""
    from realformer_tools.data import corpora

    if corpora.prepared_settings(data) == corpora.prepare_settings("synthetic", **DEMO_DATA):
        log(f"corpus already prepared in {data}")
    else:
        log(f"preparing the synthetic corpus in {data} (about a minute)")
        corpora.prepare("synthetic", data, **DEMO_DATA)
    with open(os.path.join(data, "prepare.json"), encoding="utf-8") as f:
        return json.load(f)


def fairseq_cli(name):
    """The launcher's command line for the fairseq tool ``name`` (the fixes to fairseq 0.12)."""
    from realformer_tools.experiments import fairseq_runs

    return fairseq_runs.fairseq_cli(name)


def train_command(args, hours):
    """fairseq-train for ``args``; ``--user-dir`` also lets fairseq load its own checkpoints
    under torch >= 2.6 (weights_only), so ``--vanilla`` passes it too."""
    model = MODEL_FLAGS.format(layers=args.layers, dim=args.embed_dim, ffn=2 * args.embed_dim)
    flags = TRAIN_FLAGS.format(lr=args.lr, warmup=args.warmup_updates, max_tokens=args.max_tokens,
                               seed=args.seed, max_update=args.max_update, hours=hours,
                               log_interval=args.log_interval)
    residual = [] if args.vanilla else ["--residual-attention-paths", args.residual_attention_paths,
                                        "--residual-attention-mode", args.residual_attention_mode]
    return ([*fairseq_cli("fairseq-train"), args.data, "--arch", args.arch, "--save-dir", args.save_dir]
            + model.split() + flags.split() + ["--user-dir", user_dir()] + residual
            + args.train_args)


def recipe(cmd):
    """What makes two training commands the same run: all but the tool's path (and the
    launcher's words), --user-dir and the time cap (a run stopped by the cap continues under
    any cap)."""
    from realformer_tools.experiments import fairseq_runs

    out, skip = [], False
    for word in fairseq_runs.fairseq_part(cmd)[1:]:
        if skip:
            skip = False
        elif word in ("--user-dir", "--stop-time-hours"):
            skip = True
        else:
            out.append(str(word))
    return out


def duration(seconds):
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Turns fairseq-train's output into short progress lines with this run's pace and an
    ETA. The pace counts from the moment training began (after the model is built and the
    data loaded), so the first progress line already has an ETA."""

    def __init__(self, max_update, cap_seconds, log, clock=time.time):
        self.max_update, self.cap_seconds, self.log, self.clock = max_update, cap_seconds, log, clock
        self.resumed_at, self.origin = 0, None

    def eta(self, update):
        start, first = self.origin or (self.clock(), update)
        elapsed = self.clock() - start
        if update <= first or elapsed <= 0:
            return ""
        rate = (update - first) / elapsed
        text = f" | {rate:.2f} upd/s, eta {duration((self.max_update - update) / rate)}"
        cap_left = self.cap_seconds - elapsed if self.cap_seconds else None
        if cap_left is not None and (self.max_update - update) / rate > cap_left:
            text += (f"; the time cap stops it in about {duration(cap_left)} near update "
                     f"{update + round(rate * cap_left)}, which is then scored (undertrained)")
        return text

    def __call__(self, line):
        loaded = _LOADED.search(line)
        if loaded:
            self.resumed_at = int(loaded.group(1))
            self.log(f"fairseq-train loaded {loaded.group(0).split()[2]}: continuing at update {self.resumed_at}")
        if self.origin is None and _BEGIN.search(line):
            self.origin = (self.clock(), self.resumed_at)
        update, loss = _UPDATES.search(line), _LOSS.search(line)
        if "| train_inner |" in line and update:
            n = int(update.group(1))
            self.log(f"update {n} of {self.max_update}, loss {loss.group(1) if loss else '?'}{self.eta(n)}")
        elif "| valid on '" in line and update:
            self.log(f"validation at update {update.group(1)}: loss {loss.group(1) if loss else '?'}")
        elif "Stopping training due to cumulative_training_time" in line:
            self.log("the time cap (--max-minutes) is reached: training stops here")


def tool_env(args):
    """The fairseq tools' environment (they run through the launcher: the fixes to fairseq
    0.12): unbuffered (progress arrives as it happens), the data fixes as ``run_demo`` set
    them, and ``--threads`` threads each (OMP_NUM_THREADS)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(args.threads))


def run_tool(cmd, log_path, env, on_line=None):
    """Run ``cmd``, its output appended to ``log_path`` and each line handed to ``on_line``;
    returns (return code, seconds, CPU seconds, lines). The CPU seconds (user + system of
    the tool) are what the wall time would be on an idle core with one thread: the
    measure of a run that does not depend on how busy the machine was."""
    start, cpu, lines = time.time(), _children_cpu(), []
    with open(log_path, "a", encoding="utf-8", buffering=1) as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf-8", errors="replace", env=env)
        try:
            for line in proc.stdout:
                out.write(line)
                lines.append(line.rstrip("\n"))
                if on_line:
                    on_line(lines[-1])
        finally:
            proc.wait()
    return proc.returncode, time.time() - start, _children_cpu() - cpu, lines


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def failed(name, returncode, log_path, lines):
    tail = "\n".join(lines[-25:])
    return DemoError(f"{name} failed with exit code {returncode} (full log: {log_path}); last lines:\n{tail}")


def read_state(save_dir):
    try:
        with open(os.path.join(save_dir, STATE_FILE), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def checkpoint_progress(path):
    """(updates, fairseq's cumulative training seconds) stored in a checkpoint, or (0, 0.0)."""
    if not os.path.exists(path):
        return 0, 0.0
    from realformer_tools.fairseq_fixes.safe_checkpoint_loading import safe_load_checkpoint_to_cpu

    try:
        state = safe_load_checkpoint_to_cpu(path)
    except Exception as exc:  # noqa: BLE001 - reported as one line
        raise DemoError(f"{exc}; or run with --fresh") from None
    history = state.get("optimizer_history") or [{}]
    extra = state.get("extra_state") or {}
    return int(history[-1].get("num_updates", 0)), float(extra.get("previous_training_time", 0.0))


def last_match(pattern, lines, cast):
    found = [cast(m.group(1)) for m in map(re.compile(pattern).search, lines) if m]
    return found[-1] if found else None


def train(args, out_dir, log):
    """Train, continuing the last run when it had these settings and was stopped early.
    Returns the state (also in --save-dir/demo_state.json): updates done, whether the run
    stopped before --max-update and why, this run's seconds and pace, the last valid loss."""
    os.makedirs(args.save_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "train.log")
    last = os.path.join(args.save_dir, "checkpoint_last.pt")
    this_recipe = recipe(train_command(args, 0))
    previous = read_state(args.save_dir)
    resume = args.resume or (not args.fresh and os.path.exists(last) and previous is not None
                             and previous.get("stopped_early") and previous.get("recipe") == this_recipe)
    if not resume:
        if previous is not None and previous.get("stopped_early") and not args.fresh:
            log(f"the checkpoints in {args.save_dir} are from a run with other settings: training from scratch")
        for path in glob.glob(os.path.join(args.save_dir, "checkpoint*.pt")) + [log_path]:
            if os.path.exists(path):
                os.remove(path)
        previous = None
    done, used = checkpoint_progress(last) if resume else (0, 0.0)
    cap = args.max_minutes * 60
    # fairseq's --stop-time-hours counts all training time stored in the checkpoint, so
    # this run's cap is added to what earlier runs used
    cmd = train_command(args, round((used + cap) / 3600, 6) if cap else 0)
    left = max(0, args.max_update - done)
    log(f"{'resuming at update ' + str(done) + ' of ' if done else 'training '}{args.max_update} updates: "
        f"{left} to go"
        + (f"; capped at {args.max_minutes:g} minutes (--max-minutes), then the model it has is scored"
           if cap else "") + f"; a progress line with an ETA every {args.log_interval} updates")
    log(f"fairseq-train: {shlex.join(map(str, cmd))} (log: {log_path})")
    returncode, seconds, cpu, lines = run_tool(cmd, log_path, tool_env(args), Progress(args.max_update, cap, log))
    if returncode != 0:
        raise failed("fairseq-train", returncode, log_path, lines)
    updates = last_match(r"num_updates[= ](\d+)", lines, int) or done
    state = {
        "recipe": this_recipe,
        "stopped_early": updates < args.max_update,
        "num_updates": updates,
        "max_update": args.max_update,
        "runs": (previous or {}).get("runs", 0) + 1,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu, 1),
        "train_seconds_total": round((previous or {}).get("train_seconds_total", 0.0) + seconds, 1),
        "final_valid_loss": last_match(r"\| valid on 'valid' subset \| loss ([\d.]+)", lines, float),
        "stop_reason": None,
        "minutes_left_estimate": None,
    }
    if state["stopped_early"]:
        capped = any("Stopping training due to cumulative_training_time" in line for line in lines)
        state["stop_reason"] = (f"the --max-minutes {args.max_minutes:g} cap on training time was reached"
                                if capped else f"fairseq-train stopped before --max-update (see {log_path})")
        if updates > done:  # at this run's pace, start-up and validation included
            state["minutes_left_estimate"] = round((args.max_update - updates) * seconds / (updates - done) / 60, 1)
    with open(os.path.join(args.save_dir, STATE_FILE), "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)
    return state


def decode_and_score(args, prepared, out_dir, log):
    """fairseq-generate on the test split with the best checkpoint there is, then sacreBLEU
    (13a, cased) of the detokenized output against the raw references: fairseq_runs'
    scoring, which the comparisons use too. Returns its dict plus ``checkpoint`` and
    ``examples`` (source, reference, hypothesis)."""
    from realformer_tools.data.pipeline import read_lines
    from realformer_tools.experiments import fairseq_runs

    best = os.path.join(args.save_dir, "checkpoint_best.pt")
    checkpoint = best if os.path.exists(best) else os.path.join(args.save_dir, "checkpoint_last.pt")
    out_path = os.path.join(out_dir, "generate.txt")
    flags = ["--beam", "5", "--batch-size", "128", "--remove-bpe", "sentencepiece", "--cpu",
             # German output is about as long as the English input: bound runaway hypotheses
             "--max-len-a", "1.5", "--max-len-b", "10", "--user-dir", user_dir()]
    log(f"translating the {prepared['counts']['test']} test sentences with {checkpoint} (beam 5)")
    try:
        scored = fairseq_runs.generate_and_score(args.data, checkpoint, prepared["test_files"]["tgt"], out_path,
                                                 flags, log=log, env=tool_env(args))
    except RealFormerError as exc:
        raise DemoError(str(exc)) from None
    hyps = fairseq_runs.parse_generate_output(fairseq_runs.read_log(out_path))
    pairs = zip(read_lines(prepared["test_files"]["src"]), read_lines(prepared["test_files"]["tgt"]))
    examples = [dict(src=s, ref=r, hyp=hyps[i]) for i, (s, r) in enumerate(pairs) if i < args.num_examples]
    return dict(scored, checkpoint=os.path.abspath(checkpoint), examples=examples)
