"""Post-LN / Pre-LN / RealFormer BERT-style encoders on a masked-LM corpus: one shared
recipe and budget, MLM accuracy (the paper's metric) on validation as training goes.

The translation comparison's machinery (``fairseq_runs``: resumable ``fairseq-train``
runs, log parsing) with a masked-LM evaluation instead of BLEU:

* every backbone trains with the same ``fairseq-train`` flags (only the backbone flags
  differ; ``--max-positions`` is fixed so that ``roberta`` and ``realformer_bert`` start
  from identical weights), validating every ``validate_interval_updates`` updates on a
  fixed subset of the validation set (``--max-valid-steps``: the same blocks and masks
  for every backbone and every evaluation);
* the best checkpoint (by that validation loss) is then evaluated on the *whole*
  validation set with ``fairseq-validate``: the MLM accuracy (and NSP accuracy with
  ``--objective mlm_nsp``) reported in the table.

Runs live in ``out/<backbone>/seed<k>/``; a re-run with the same arguments reuses the
finished runs and resumes an interrupted one.
"""

import os
import statistics
from dataclasses import asdict, dataclass, field

from realformer_nmt.errors import ConfigError, DataError

from ..launch import DATA_FIXES_ENV as SWITCH
from . import fairseq_runs
from .translation.figures import COLORS as _COLORS
from .translation.figures import pyplot as _pyplot
from .translation.recipe import BACKBONES, USER_DIR
from .translation.report import SEED_PAIRED_NOTE, seed_paired_cell, spread, write_outputs
from .translation.report import fmt as _fmt
from .translation.report import seconds as _seconds
from .translation.runs import join_notes, machine_description, parallel_note
from .translation.stats import add_seed_paired

BACKBONE_DESCRIPTIONS = {
    "postln": "fairseq `roberta` (Post-LN BERT)",
    "preln": "fairseq `roberta` + `--encoder-normalize-before` (Pre-LN)",
    "realformer": "`realformer_bert` (Post-LN, residual attention on the encoder self-attention)",
}
OBJECTIVES = {  # name -> (task, criterion)
    "mlm": ("masked_lm", "masked_lm_acc"),
    "mlm_nsp": ("masked_lm_nsp", "masked_lm_nsp"),
}


def backbone_flags(name, residual_mode="sum"):
    """The only fairseq-train flags that differ between backbones."""
    if name == "postln":
        return ["--arch", "roberta"]
    if name == "preln":
        return ["--arch", "roberta", "--encoder-normalize-before"]
    if name == "realformer":
        return ["--arch", "realformer_bert", "--residual-attention-paths", "encoder",
                "--residual-attention-mode", residual_mode]
    raise ConfigError(f"--backbones: unknown backbone {name!r} (choose from {', '.join(BACKBONES)})")


@dataclass
class MLMRecipe:
    """Everything every backbone shares (dims always explicit)."""

    objective: str = "mlm"
    layers: int = 4
    embed_dim: int = 256
    ffn_dim: int = 1024
    heads: int = 4
    tokens_per_sample: int = 128
    batch_size: int = 16
    lr: float = 1e-3
    warmup_updates: int = 50
    max_update: int = 500
    dropout: float = 0.1
    attention_dropout: float = 0.1
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    validate_interval_updates: int = 50
    max_valid_steps: int = 20
    validate_batch_size: int = 64  # the final whole-valid evaluation (no gradients: larger batches)
    device: str = "cpu"
    fp16: bool = None
    log_interval: int = 10
    extra: list = field(default_factory=list)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}")
        self.fp16 = fairseq_runs.resolve_fp16(self.device, self.fp16)
        if self.max_update < 1:
            raise ConfigError("--max-update must be at least 1")
        if self.embed_dim % self.heads:
            raise ConfigError(f"--embed-dim {self.embed_dim} is not divisible by --heads {self.heads}")

    def task_flags(self):
        task, criterion = OBJECTIVES[self.objective]
        return ["--task", task, "--criterion", criterion, "--tokens-per-sample", str(self.tokens_per_sample)]

    def train_flags(self):
        flags = self.task_flags() + [
            "--encoder-layers", self.layers, "--encoder-embed-dim", self.embed_dim,
            "--encoder-ffn-embed-dim", self.ffn_dim, "--encoder-attention-heads", self.heads,
            "--max-positions", self.tokens_per_sample, "--batch-size", self.batch_size,
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6",
            "--weight-decay", self.weight_decay, "--clip-norm", self.clip_norm,
            "--lr", self.lr, "--lr-scheduler", "polynomial_decay", "--warmup-updates", self.warmup_updates,
            "--total-num-update", self.max_update, "--max-update", self.max_update,
            "--dropout", self.dropout, "--attention-dropout", self.attention_dropout,
            "--validate-interval-updates", self.validate_interval_updates,
            "--max-valid-steps", self.max_valid_steps, "--batch-size-valid", self.batch_size,
            "--num-workers", 0, "--no-epoch-checkpoints", "--log-format", "json",
            "--log-interval", self.log_interval,
        ]
        flags += ["--cpu"] if self.device == "cpu" else []
        flags += ["--fp16"] if self.fp16 else []
        return [str(f) for f in flags] + [str(e) for e in self.extra]

    def validate_flags(self):
        # the checkpoint's own task and criterion settings are used; --task satisfies the parser
        flags = self.task_flags() + ["--valid-subset", "valid", "--batch-size", self.validate_batch_size,
                                     "--num-workers", 0,
                 "--log-format", "json", "--user-dir", USER_DIR]
        flags += ["--cpu"] if self.device == "cpu" else []
        flags += ["--fp16"] if self.fp16 else []
        return [str(f) for f in flags]


def check_data(data):
    if not os.path.isfile(os.path.join(data, "dict.txt")):
        raise DataError(f"--data {data} has no dict.txt: prepare it with scripts/prepare_pretraining_data.py")


def train_command(data, backbone, recipe, seed, save_dir, residual_mode="sum"):
    return ([*fairseq_runs.fairseq_cli("fairseq-train"), data] + backbone_flags(backbone, residual_mode)
            + recipe.train_flags() + ["--seed", str(seed), "--save-dir", save_dir, "--user-dir", USER_DIR])


def validate_full(data, checkpoint, recipe, out_path, env=None, log=print, label=""):
    """``fairseq-validate`` on the whole validation set; returns its record (``mlm_accuracy``, ...)."""
    cmd = [*fairseq_runs.fairseq_cli("fairseq-validate"), data, "--path", checkpoint] + recipe.validate_flags()
    returncode, lines = fairseq_runs.run_logged(cmd, out_path, label, log, env=env)
    if returncode != 0:
        tail = "\n".join(lines[-20:])
        raise fairseq_runs.RunError(f"fairseq-validate failed with exit code {returncode} (log: {out_path}):\n{tail}")
    record = fairseq_runs.validate_record(lines)
    if not record:
        raise fairseq_runs.RunError(f"fairseq-validate printed no validation line (log: {out_path})")
    return dict(record, command=fairseq_runs.quote(cmd))


def run_one(data, backbone, recipe, seed, run_dir, residual_mode="sum", env=None, log=print):
    """Train one backbone/seed in ``run_dir``, then evaluate its best checkpoint on the whole
    validation set; ``run_dir/result.json`` holds the record."""
    label = f"[{backbone} seed {seed}] "
    cmd = train_command(data, backbone, recipe, seed, run_dir, residual_mode)
    done = fairseq_runs.read_json(os.path.join(run_dir, "result.json"))
    if done is not None and fairseq_runs.same_recipe(done.get("command"), cmd):
        log(f"{label}already done: reusing {os.path.join(run_dir, 'result.json')}")
        return done
    train = fairseq_runs.train_resumable(cmd, run_dir, label, log, recipe.max_update, env)
    result = dict(train, backbone=backbone, seed=seed, train_seconds=train["seconds"], full_valid=None,
                  checkpoint=os.path.abspath(os.path.join(run_dir, "checkpoint_best.pt")))
    if train["status"] == "finished" and os.path.exists(result["checkpoint"]):
        result["full_valid"] = validate_full(data, result["checkpoint"], recipe,
                                             os.path.join(run_dir, "validate.log"), env, log, label)
    result = fairseq_runs.finite_or_none(result)
    fairseq_runs.write_json(os.path.join(run_dir, "result.json"), result)
    acc = (result["full_valid"] or {}).get("mlm_accuracy")
    log(f"{label}DONE: {train['status']}, updates {train['updates']}, full-valid MLM accuracy "
        f"{_fmt(acc)}%, train {train['seconds']:.0f}s")
    return result


def _curve(result, metric):
    return [[rec["update"], rec.get(metric)] for rec in result["curve"] if rec.get(metric) is not None]


def _mean(values):
    values = [v for v in values if v is not None]
    return round(statistics.mean(values), 3) if values else None


def summarize_backbone(results, backbone, residual_mode):
    full = [r["full_valid"] or {} for r in results]
    accs = [f.get("mlm_accuracy") for f in full]
    return {
        "mlm_accuracy": _mean(accs),
        "mlm_accuracy_std": round(statistics.stdev(accs), 3) if len(accs) > 1 and None not in accs else None,
        "mlm_accuracy_per_seed": accs,
        "nsp_accuracy": _mean([f.get("nsp_accuracy") for f in full]),
        "valid_loss": _mean([f.get("loss") for f in full]),
        "updates": min(r["updates"] for r in results),
        "seeds": [r["seed"] for r in results],
        # the one outcome vocabulary (docs/results.md); there is no lagging reference here
        "status_per_seed": ["ok" if r["status"] == "finished" and a is not None else "diverged"
                            for r, a in zip(results, accs)],
        "fairseq_status_per_seed": [r["status"] for r in results],
        "curve": [[u, round(m, 3)] for u, m, _, _ in fairseq_runs.mean_curve(
            [_curve(r, "mlm_accuracy") for r in results])],
        "loss_curve": [[u, round(m, 4)] for u, m, _, _ in fairseq_runs.mean_curve(
            [_curve(r, "loss") for r in results])],
        "curve_per_seed": [_curve(r, "mlm_accuracy") for r in results],
        "train_seconds_per_seed": [r["train_seconds"] for r in results],
        "checkpoints": [r["checkpoint"] for r in results],
        "logs": [r["log"] for r in results],
        "flags": backbone_flags(backbone, residual_mode),
        "description": BACKBONE_DESCRIPTIONS[backbone],
    }


def comparison_markdown(summary):
    backbones = [b for b in BACKBONES if b in summary]
    n_seeds = len(summary[backbones[0]]["seeds"])
    nsp = any(summary[b]["nsp_accuracy"] is not None for b in backbones)
    paired = [(f"seed_paired_vs_{ref}", f"vs {name}, seed-paired Δ accuracy")
              for ref, name in (("postln", "Post-LN"), ("preln", "Pre-LN"))
              if any(summary[b].get(f"seed_paired_vs_{ref}") for b in backbones)]
    lines = [f"# {summary['title']}: Post-LN vs Pre-LN vs RealFormer encoders", "",
             "MLM accuracy (%) of the best checkpoint on the whole validation set (WikiText-2's valid split); "
             "the training text is WikiText-2's **test** split (the only WikiText-2 text here besides valid); "
             + ("**one seed**: differences of a few tenths are within seed noise." if n_seeds == 1
                else f"mean ± standard deviation over {n_seeds} seeds." if n_seeds > 2
                else "mean and range over 2 seeds."), "",
             "| backbone | valid MLM accuracy | per seed | "
             + "".join(f"{h} | " for _, h in paired) + ("valid NSP accuracy | " if nsp else "")
             + "valid loss | updates | train time per seed |",
             "| --- | --- | --- | " + "--- | " * len(paired) + ("--- | " if nsp else "") + "--- | --- | --- |"]
    for b in backbones:
        s = summary[b]
        acc = spread(s["mlm_accuracy"], s["mlm_accuracy_std"], s["mlm_accuracy_per_seed"])
        lines.append(f"| {b} | {acc} | {', '.join(_fmt(a) for a in s['mlm_accuracy_per_seed'])} | "
                     + "".join(f"{seed_paired_cell(s, key)} | " for key, _ in paired)
                     + (f"{_fmt(s['nsp_accuracy'])} | " if nsp else "")
                     + f"{_fmt(s['valid_loss'], 3)} | {s['updates']} | "
                     f"{', '.join(_seconds(t) for t in s['train_seconds_per_seed'])} |")
    if paired:
        lines += ["", SEED_PAIRED_NOTE.replace("Seed-paired difference", "Seed-paired difference (accuracy points)")
                  + "."]
    lines += ["", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        lines.append(f"- `{b}`: {summary[b]['description']}: `{' '.join(summary[b]['flags'])}`")
    lines += ["", "Shared fairseq-train flags:", "", "```", " ".join(summary["recipe"]["shared_train_flags"]),
              "```", "", f"Evaluation: {summary['recipe']['evaluation']}.", "",
              f"Machine: {summary['machine']}. The budget is a fixed number of updates, identical for "
              "every backbone; wall times depend on the load of the machine.", ""]
    return "\n".join(lines)


def plot_comparison(summary, path):
    """Validation MLM accuracy (fixed subset) against updates, one line per backbone."""
    plt = _pyplot()
    backbones = [b for b in BACKBONES if b in summary]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, ylabel in ((axes[0], "curve", "valid MLM accuracy (%)"), (axes[1], "loss_curve", "valid loss")):
        for b in backbones:
            s = summary[b]
            if s[key]:
                label = f"{b} (full valid {_fmt(s['mlm_accuracy'])}%)"
                ax.plot(*zip(*s[key]), marker="o", markersize=3, color=_COLORS[b], label=label)
        ax.set_xlabel("updates")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend()
    n = len(summary[backbones[0]]["seeds"])
    seeds = "1 seed" if n == 1 else f"mean of {n} seeds"
    fig.suptitle(f"{summary['title']}: Post-LN vs Pre-LN vs RealFormer ({seeds})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(data, out, recipe, backbones=BACKBONES, seeds=(1,), residual_mode="sum", results_path=None,
            machine_note="", threads=None, log=print, title="WikiText-2 masked LM", jobs=1):
    """Train every backbone for every seed (``jobs`` at a time), evaluate, write JSON, MD
    and PNG; return the summary."""
    check_data(data)
    results_path = results_path or os.path.join(out, "mlm_comparison.json")
    if not backbones or len(set(backbones)) != len(backbones):
        raise ConfigError("--backbones: give each backbone once")
    for b in backbones:
        backbone_flags(b)
    # every backbone with the plugin's data fixes on (masks redrawn each epoch with workers)
    env = fairseq_runs.with_data_fixes(fairseq_runs.cli_env(fairseq_runs.threads_per_job(threads, jobs)))
    log = fairseq_runs.serialized(log)
    total, done = len(backbones) * len(seeds), []

    def task(backbone, seed):
        def run():
            result = run_one(data, backbone, recipe, seed, os.path.join(out, backbone, f"seed{seed}"),
                             residual_mode, env, log)
            done.append(1)
            log(f"[compare-mlm] finished {len(done)}/{total}: {backbone} seed {seed}")
            return result
        return run

    runs = fairseq_runs.run_parallel([((b, seed), task(b, seed)) for seed in seeds for b in backbones], jobs, log)
    results = {b: [runs[(b, seed)] for seed in seeds] for b in backbones}
    summary = {b: summarize_backbone(results[b], b, residual_mode) for b in backbones}
    add_seed_paired(summary, metric="mlm_accuracy_per_seed")
    example = train_command(data, backbones[0], recipe, seeds[0], "<run_dir>", residual_mode)
    summary.update(
        title=title,
        recipe={
            "settings": asdict(recipe),
            "shared_train_flags": recipe.train_flags(),
            "backbone_flags": {b: backbone_flags(b, residual_mode) for b in backbones},
            "validate_flags": recipe.validate_flags(),
            "example_train_command": fairseq_runs.quote(example),
            "environment": {SWITCH: "1"},
            "seeds": list(seeds),
            "data": os.path.abspath(data),
            "evaluation": "MLM accuracy (% of masked positions whose top prediction is the original token) "
                          "of the best checkpoint (by the loss on the fixed validation subset) on the whole "
                          "validation set, fairseq-validate; curves: the fixed subset during training",
        },
        machine=machine_description(join_notes(parallel_note(jobs, threads), machine_note)),
        out=os.path.abspath(out),
    )
    write_outputs(summary, results_path, comparison_markdown, plot_comparison)
    log(f"[compare-mlm] wrote {results_path} (+ .md, .png)")
    return summary
