"""Post-LN / Pre-LN / RealFormer on a translation corpus, one shared recipe and budget.

``compare``   trains every backbone for every seed with the same fairseq-train flags
              (only the backbone flags differ), decodes each best checkpoint on ``test``
              with beam search, scores it with sacreBLEU against the raw references and
              writes ``<name>.json``, ``<name>.md`` and ``<name>.png``.
``lr_sweep``  the paper's stability test (He et al. 2021, Fig. 3): the same recipe at a
              normal and at higher peak learning rates (nothing else changes) for a short
              budget; each run is marked ``ok``, ``diverged`` (NaN/inf, fairseq stopped)
              or ``stalled`` (finished, but its best valid loss is more than ``margin``
              above the same backbone's run at the normal learning rate).

Runs live in ``out/<backbone>/seed<k>/`` (``out/lr<lr>/<backbone>/seed<k>/`` in the
sweep) with their checkpoints, ``train.log``, ``generate.txt`` and ``result.json``; a
re-run with the same arguments reuses finished runs and resumes an interrupted one
(see ``fairseq_runs.train_resumable``).
"""

import json
import math
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field

from ..errors import ConfigError, DataError
from . import fairseq_runs

BACKBONES = ("postln", "preln", "realformer")
BACKBONE_DESCRIPTIONS = {
    "postln": "fairseq `transformer` (Post-LN)",
    "preln": "fairseq `transformer` + `--encoder-normalize-before --decoder-normalize-before` (Pre-LN)",
    "realformer": "`realformer_transformer` (Post-LN, residual attention on encoder, decoder and cross paths)",
}
# layers (encoder = decoder), embedding dim, FFN dim, heads
SIZES = {
    "small": (3, 256, 512, 4),     # the CPU recipe
    "iwslt": (6, 512, 1024, 4),    # transformer_iwslt_de_en
    "base": (6, 512, 2048, 8),     # transformer (base) / transformer_wmt_en_de
}
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the realformer_nmt package


def backbone_flags(name, residual_mode="sum"):
    """The only fairseq-train flags that differ between backbones."""
    if name == "postln":
        return ["--arch", "transformer"]
    if name == "preln":
        return ["--arch", "transformer", "--encoder-normalize-before", "--decoder-normalize-before"]
    if name == "realformer":
        return ["--arch", "realformer_transformer", "--residual-attention-paths", "encoder,decoder,cross",
                "--residual-attention-mode", residual_mode]
    raise ConfigError(f"--backbones: unknown backbone {name!r} (choose from {', '.join(BACKBONES)})")


@dataclass
class Recipe:
    """Everything every backbone shares. ``train_flags`` / ``generate_flags`` turn it into
    fairseq flags; dims are always passed explicitly so all backbones get identical sizes."""

    size: str = "small"
    layers: int = None
    embed_dim: int = None
    ffn_dim: int = None
    heads: int = None
    lr: float = 1e-3
    warmup_updates: int = 400
    max_update: int = 1800
    max_minutes: float = 0.0
    max_tokens: int = 2048
    dropout: float = 0.1
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    validate_interval_updates: int = 0
    device: str = "cpu"
    fp16: bool = None            # None: on with --device cuda, off on cpu
    select_by_bleu: bool = False
    beam: int = 5
    log_interval: int = 50
    extra: list = field(default_factory=list)

    def __post_init__(self):
        if self.size not in SIZES:
            raise ConfigError(f"--size must be one of {', '.join(SIZES)}, not {self.size!r}")
        defaults = dict(zip(("layers", "embed_dim", "ffn_dim", "heads"), SIZES[self.size]))
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.fp16 = fairseq_runs.resolve_fp16(self.device, self.fp16)
        if self.max_update < 1 and self.max_minutes <= 0:
            raise ConfigError("give a budget: --max-update N (N >= 1) and/or --max-minutes M")
        if self.embed_dim % self.heads:
            raise ConfigError(f"--embed-dim {self.embed_dim} is not divisible by --heads {self.heads}")

    def model_flags(self):
        flags = []
        for side in ("encoder", "decoder"):
            flags += [f"--{side}-layers", self.layers, f"--{side}-embed-dim", self.embed_dim,
                      f"--{side}-ffn-embed-dim", self.ffn_dim, f"--{side}-attention-heads", self.heads]
        return [str(f) for f in flags] + ["--share-all-embeddings"]

    def train_flags(self, lr=None):
        flags = [
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--clip-norm", self.clip_norm,
            "--lr", lr if lr is not None else self.lr, "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", self.warmup_updates, "--warmup-init-lr", "1e-07",
            "--dropout", self.dropout, "--weight-decay", self.weight_decay,
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", self.label_smoothing,
            "--max-tokens", self.max_tokens, "--max-update", max(self.max_update, 0),
            "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", self.log_interval,
        ]
        if self.max_minutes > 0:
            flags += ["--stop-time-hours", self.max_minutes / 60]
        if self.validate_interval_updates > 0:
            flags += ["--validate-interval-updates", self.validate_interval_updates]
        flags += ["--cpu"] if self.device == "cpu" else []
        flags += ["--fp16"] if self.fp16 else []
        if self.select_by_bleu:
            flags += eval_bleu_flags(self.beam)
        return [str(f) for f in flags] + [str(e) for e in self.extra]

    def generate_flags(self):
        flags = ["--beam", self.beam, "--batch-size", 128, "--remove-bpe", "sentencepiece",
                 # German output is about as long as the English input: bound runaway hypotheses
                 "--max-len-a", 1.5, "--max-len-b", 10, "--user-dir", USER_DIR]
        flags += ["--cpu"] if self.device == "cpu" else []
        flags += ["--fp16"] if self.fp16 else []
        return [str(f) for f in flags]


def eval_bleu_flags(beam=5):
    """fairseq's translation-task BLEU during validation, selecting checkpoint_best.pt by it."""
    return ["--eval-bleu", "--eval-bleu-detok", "space", "--eval-bleu-remove-bpe", "sentencepiece",
            "--eval-bleu-args", json.dumps({"beam": beam, "max_len_a": 1.5, "max_len_b": 10}),
            "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


def train_command(data, backbone, recipe, seed, save_dir, residual_mode="sum", lr=None):
    return ([fairseq_runs.fairseq_cli("fairseq-train"), data] + backbone_flags(backbone, residual_mode)
            + recipe.model_flags() + recipe.train_flags(lr)
            + ["--seed", str(seed), "--save-dir", save_dir, "--user-dir", USER_DIR])


def test_references(data, references=None):
    """Raw test references: ``references`` or ``<raw_dir>/test.de`` from ``data/prepare.json``."""
    for name in ("dict.en.txt", "dict.de.txt"):
        if not os.path.exists(os.path.join(data, name)):
            raise DataError(f"--data {data} has no {name}: prepare it with scripts/prepare_data.py")
    if references is None:
        try:
            with open(os.path.join(data, "prepare.json"), encoding="utf-8") as f:
                references = os.path.join(json.load(f)["raw_dir"], "test.de")
        except (OSError, ValueError, KeyError):
            raise DataError(f"--data {data} has no prepare.json naming its raw text: pass --references FILE")
    if not os.path.isfile(references):
        raise DataError(f"test references {references} not found (pass --references FILE)")
    return references


# --------------------------------------------------------------------------------------
# One run: train (resumably), then decode + score the best checkpoint
# --------------------------------------------------------------------------------------

def run_one(data, references, backbone, recipe, seed, run_dir, residual_mode="sum", lr=None,
            env=None, log=print):
    """Train one backbone/seed in ``run_dir`` and score its best checkpoint; return the result.

    The result (``run_dir/result.json``) holds the training record of
    ``fairseq_runs.train_resumable`` plus ``bleu``, ``best_valid_loss``, ``sacrebleu``,
    ``signature``, ``train_seconds``, ``decode_seconds`` and ``checkpoint``. A diverged run is
    not decoded (its ``bleu`` is None).
    """
    label = f"[{backbone} seed {seed}{'' if lr is None else f' lr {lr:g}'}] "
    done = fairseq_runs.read_json(os.path.join(run_dir, "result.json"))
    cmd = train_command(data, backbone, recipe, seed, run_dir, residual_mode, lr)
    if done is not None and fairseq_runs.same_recipe(done.get("command"), cmd):
        log(f"{label}already done: reusing {os.path.join(run_dir, 'result.json')}")
        return done
    train = fairseq_runs.train_resumable(cmd, run_dir, label, log, recipe.max_update, env)
    checkpoint = os.path.join(run_dir, "checkpoint_best.pt")
    finite = [rec for rec in train["curve"] if math.isfinite(rec["loss"])]
    result = dict(train, backbone=backbone, seed=seed, lr=lr if lr is not None else recipe.lr,
                  train_seconds=train["seconds"],
                  best_valid_loss=min(rec["loss"] for rec in finite) if finite else None,
                  final_valid_loss=train["curve"][-1]["loss"] if train["curve"] else None,
                  bleu=None, sacrebleu=None, signature=None, decode_seconds=None,
                  checkpoint=os.path.abspath(checkpoint))
    if recipe.select_by_bleu:
        bleus = [rec["bleu"] for rec in train["curve"] if "bleu" in rec]
        result["best_valid_bleu"] = max(bleus) if bleus else None
    if train["status"] == "finished" and os.path.exists(checkpoint):
        scored = fairseq_runs.generate_and_score(
            data, checkpoint, references, os.path.join(run_dir, "generate.txt"),
            recipe.generate_flags(), log=log, label=label, env=env)
        result.update(bleu=scored["bleu"], sacrebleu=scored["sacrebleu"], signature=scored["signature"],
                      decode_seconds=scored["seconds"], generate_command=scored["command"])
    fairseq_runs.write_json(os.path.join(run_dir, "result.json"), fairseq_runs.finite_or_none(result))
    log(f"{label}DONE: {train['status']}{' (' + train['reason'] + ')' if train['reason'] else ''}, "
        f"updates {train['updates']}, best valid loss {_fmt(result['best_valid_loss'])}, "
        f"test BLEU {_fmt(result['bleu'])}, train {train['seconds']:.0f}s")
    return fairseq_runs.finite_or_none(result)


def _fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def machine_description(note=""):
    import torch

    try:
        import fairseq
        fairseq_version = fairseq.__version__
    except Exception:  # pragma: no cover - fairseq always imports here
        fairseq_version = "?"
    desc = (f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
            f"fairseq {fairseq_version}")
    if torch.cuda.is_available():
        desc += f", GPU {torch.cuda.get_device_name(0)}"
    return desc + (f"; {note}" if note else "")


def summarize_backbone(results, backbone, residual_mode):
    bleus = [r["bleu"] for r in results]
    losses = [r["best_valid_loss"] for r in results]
    curves = [[[rec["update"], rec["loss"]] for rec in r["curve"]] for r in results]
    mean_curve = fairseq_runs.mean_curve(curves)
    finite_bleus = [b for b in bleus if b is not None]
    finite_losses = [v for v in losses if v is not None]
    return {
        "bleu": round(statistics.mean(finite_bleus), 2) if finite_bleus else None,
        "bleu_std": round(statistics.stdev(finite_bleus), 2) if len(finite_bleus) > 1 else None,
        "bleu_per_seed": bleus,
        "valid_loss": round(statistics.mean(finite_losses), 4) if finite_losses else None,
        "valid_loss_per_seed": losses,
        "updates": min(r["updates"] for r in results),
        "seeds": [r["seed"] for r in results],
        "status_per_seed": [r["status"] for r in results],
        "curve": [[u, round(m, 4)] for u, m, _, _ in mean_curve],
        "curve_min_max": [[u, round(lo, 4), round(hi, 4)] for u, _, lo, hi in mean_curve],
        "curve_per_seed": curves,
        "train_seconds_per_seed": [r["train_seconds"] for r in results],
        "decode_seconds_per_seed": [r["decode_seconds"] for r in results],
        "checkpoints": [r["checkpoint"] for r in results],
        "logs": [r["log"] for r in results],
        "flags": backbone_flags(backbone, residual_mode),
        "description": BACKBONE_DESCRIPTIONS[backbone],
    }


def recipe_record(recipe, data, references, backbones, residual_mode, seeds):
    example = train_command(data, backbones[0], recipe, seeds[0], "<run_dir>", residual_mode)
    return {
        "settings": asdict(recipe),
        "shared_train_flags": recipe.model_flags() + recipe.train_flags(),
        "backbone_flags": {b: backbone_flags(b, residual_mode) for b in backbones},
        "generate_flags": recipe.generate_flags(),
        "example_train_command": fairseq_runs.quote(example),
        "seeds": list(seeds),
        "data": os.path.abspath(data),
        "references": os.path.abspath(references),
        "scoring": "sacreBLEU on detokenized, cased text (fairseq-generate --remove-bpe sentencepiece) "
                   "against the raw references; best checkpoint by "
                   + ("validation BLEU" if recipe.select_by_bleu else "validation loss"),
    }


def _check_backbones(backbones):
    if not backbones:
        raise ConfigError("--backbones: give at least one backbone")
    for b in backbones:
        backbone_flags(b)
    if len(set(backbones)) != len(backbones):
        raise ConfigError("--backbones: a backbone is listed twice")


def compare(data, out, recipe, backbones=BACKBONES, seeds=(1,), residual_mode="sum", references=None,
            results_path=None, machine_note="", threads=None, log=print, title="Multi30k En->De"):
    """Train, decode and score every backbone for every seed; write JSON, MD and PNG.

    ``results_path`` is the path of the JSON file (default ``out/comparison.json``); the
    table and the plot go next to it with ``.md`` and ``.png``. Returns the summary dict.
    """
    _check_backbones(backbones)
    references = test_references(data, references)
    env = fairseq_runs.cli_env(threads)
    results = {b: [] for b in backbones}
    total = len(backbones) * len(seeds)
    for seed in seeds:  # seeds outermost: an early stop still leaves comparable backbones
        for backbone in backbones:
            run_dir = os.path.join(out, backbone, f"seed{seed}")
            results[backbone].append(run_one(data, references, backbone, recipe, seed, run_dir,
                                             residual_mode, env=env, log=log))
            done = sum(len(v) for v in results.values())
            log(f"[compare] finished {done}/{total}: {backbone} seed {seed}")
    summary = {b: summarize_backbone(results[b], b, residual_mode) for b in backbones}
    signatures = {r["signature"] for rs in results.values() for r in rs if r["signature"]}
    summary.update(
        title=title,
        recipe=recipe_record(recipe, data, references, backbones, residual_mode, seeds),
        sacrebleu_signature=" / ".join(sorted(signatures)) or None,
        machine=machine_description(machine_note),
        out=os.path.abspath(out),
    )
    results_path = results_path or os.path.join(out, "comparison.json")
    write_outputs(summary, results_path, comparison_markdown, plot_comparison)
    log(f"[compare] wrote {results_path} (+ .md, .png)")
    return summary


# --------------------------------------------------------------------------------------
# The learning-rate stability sweep
# --------------------------------------------------------------------------------------

def classify(result, reference_loss, margin):
    """``ok`` / ``diverged`` / ``stalled`` for one sweep run (see the module docstring)."""
    if result["status"] == "diverged" or result["best_valid_loss"] is None:
        return "diverged"
    if reference_loss is not None and result["best_valid_loss"] > reference_loss + margin:
        return "stalled"
    return "ok"


def lr_sweep(data, out, recipe, lrs, backbones=BACKBONES, seeds=(1,), residual_mode="sum", normal_lr=None,
             margin=1.0, references=None, results_path=None, machine_note="", threads=None, log=print,
             title="Multi30k En->De"):
    """Train every backbone at every learning rate in ``lrs`` (nothing else changes).

    ``normal_lr`` (default: the smallest of ``lrs``) is the reference: a run at another
    learning rate is ``stalled`` when its best valid loss exceeds the same backbone's (and
    seed's) best valid loss at ``normal_lr`` by more than ``margin``.
    """
    _check_backbones(backbones)
    lrs = sorted(set(float(lr) for lr in lrs))
    if not lrs:
        raise ConfigError("--lrs: give at least one learning rate")
    normal_lr = float(normal_lr) if normal_lr is not None else lrs[0]
    if normal_lr not in lrs:
        raise ConfigError(f"--normal-lr {normal_lr:g} is not one of --lrs")
    references = test_references(data, references)
    env = fairseq_runs.cli_env(threads)
    order = [normal_lr] + [lr for lr in lrs if lr != normal_lr]  # the reference runs first
    runs, total = {}, len(lrs) * len(backbones) * len(seeds)
    for seed in seeds:
        for lr in order:
            for backbone in backbones:
                run_dir = os.path.join(out, f"lr{lr:g}", backbone, f"seed{seed}")
                runs[(backbone, lr, seed)] = run_one(data, references, backbone, recipe, seed, run_dir,
                                                     residual_mode, lr=lr, env=env, log=log)
                log(f"[lr-sweep] finished {len(runs)}/{total}: {backbone} lr {lr:g} seed {seed} "
                    f"({runs[(backbone, lr, seed)]['status']})")
    table = {}
    for backbone in backbones:
        table[backbone] = {}
        for lr in lrs:
            entries = []
            for seed in seeds:
                r = runs[(backbone, lr, seed)]
                ref = runs[(backbone, normal_lr, seed)]["best_valid_loss"]
                entries.append({
                    "seed": seed, "outcome": classify(r, ref, margin), "status": r["status"],
                    "reason": r["reason"], "bleu": r["bleu"], "best_valid_loss": r["best_valid_loss"],
                    "final_valid_loss": r["final_valid_loss"], "updates": r["updates"],
                    "train_seconds": r["train_seconds"], "decode_seconds": r["decode_seconds"],
                    "curve": [[rec["update"], rec["loss"]] for rec in r["curve"]],
                    "checkpoint": r["checkpoint"], "log": r["log"],
                })
            table[backbone][f"{lr:g}"] = entries
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    summary = {
        "title": title,
        "runs": table,
        "lrs": lrs,
        "normal_lr": normal_lr,
        "divergence_rule": (
            "diverged: fairseq stopped on NaN/inf (FloatingPointError: NaN/inf gradients, or fp16 "
            "'Minimum loss scale reached') or no finite validation loss; stalled: finished, but its best "
            f"valid loss is more than {margin:g} above the same backbone and seed at lr {normal_lr:g} "
            "(fairseq's label-smoothed loss, base 2); ok: neither"),
        "margin": margin,
        "recipe": recipe_record(recipe, data, references, backbones, residual_mode, seeds),
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(machine_note),
        "out": os.path.abspath(out),
    }
    results_path = results_path or os.path.join(out, "lr_stress.json")
    write_outputs(summary, results_path, sweep_markdown, plot_sweep)
    log(f"[lr-sweep] wrote {results_path} (+ .md, .png)")
    return summary


# --------------------------------------------------------------------------------------
# JSON, Markdown, PNG
# --------------------------------------------------------------------------------------

def write_outputs(summary, json_path, markdown, plot):
    os.makedirs(os.path.dirname(os.path.abspath(json_path)) or ".", exist_ok=True)
    stem = os.path.splitext(json_path)[0]
    fairseq_runs.write_json(json_path, fairseq_runs.finite_or_none(summary))
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(summary))
    plot(summary, stem + ".png")


def _seconds(s):
    return "n/a" if s is None else f"{s / 60:.1f} min"


def comparison_markdown(summary):
    backbones = [b for b in BACKBONES if b in summary]
    n_seeds = len(summary[backbones[0]]["seeds"])
    settings = summary["recipe"]["settings"]
    lines = [f"# {summary['title']}: Post-LN vs Pre-LN vs RealFormer", "",
             f"Test BLEU (sacreBLEU, detokenized, cased) of the best checkpoint by "
             f"{'validation BLEU' if settings['select_by_bleu'] else 'validation loss'}, beam {settings['beam']}; "
             + ("**one seed**, so differences of a few tenths are within seed noise." if n_seeds == 1
                else f"mean ± standard deviation over {n_seeds} seeds."), "",
             "| backbone | test BLEU | BLEU per seed | best valid loss | updates | train time per seed | decode time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for b in backbones:
        s = summary[b]
        bleu = _fmt(s["bleu"]) + (f" ± {s['bleu_std']:.2f}" if s["bleu_std"] is not None else "")
        if n_seeds == 1:
            bleu += " (1 seed)"
        diverged = [seed for seed, st in zip(s["seeds"], s["status_per_seed"]) if st != "finished"]
        if diverged:
            bleu += f" (diverged: seeds {diverged})"
        lines.append(
            f"| {b} | {bleu} | {', '.join(_fmt(x) for x in s['bleu_per_seed'])} | {_fmt(s['valid_loss'], 3)} "
            f"| {s['updates']} | {', '.join(_seconds(t) for t in s['train_seconds_per_seed'])} "
            f"| {', '.join(_seconds(t) for t in s['decode_seconds_per_seed'])} |")
    lines += ["", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        lines.append(f"- `{b}`: {summary[b]['description']}: `{' '.join(summary[b]['flags'])}`")
    lines += ["", "Shared fairseq-train flags:", "", "```", " ".join(summary["recipe"]["shared_train_flags"]),
              "```", "", f"Decoding: `fairseq-generate {' '.join(summary['recipe']['generate_flags'])}`", "",
              f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", "",
              f"Machine: {summary['machine']}. Wall times depend on the load of the machine; the "
              "budget is a fixed number of updates, identical for every backbone.", ""]
    return "\n".join(lines)


def sweep_markdown(summary):
    backbones = [b for b in BACKBONES if b in summary["runs"]]
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    settings = summary["recipe"]["settings"]
    n_seeds = len(summary["recipe"]["seeds"])
    lines = [f"# {summary['title']}: learning-rate stability (He et al. 2021, Fig. 3)", "",
             f"Each cell: outcome, test BLEU, best valid loss (updates; train wall time). Budget "
             f"{settings['max_update']} updates, warmup {settings['warmup_updates']}, everything but the "
             f"peak learning rate identical; {'one seed' if n_seeds == 1 else f'{n_seeds} seeds'}.", "",
             "| backbone | " + " | ".join(f"lr {lr}" + (" (normal)" if float(lr) == summary["normal_lr"] else "")
                                        for lr in lrs) + " |",
             "| --- |" + " --- |" * len(lrs)]
    for b in backbones:
        cells = []
        for lr in lrs:
            parts = []
            for e in summary["runs"][b][lr]:
                parts.append(f"**{e['outcome']}** BLEU {_fmt(e['bleu'])}, loss {_fmt(e['best_valid_loss'], 3)} "
                             f"({e['updates']} upd; {_seconds(e['train_seconds'])})")
            cells.append("<br>".join(parts))
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    lines += ["", f"Rule: {summary['divergence_rule']}.", "",
              "Shared fairseq-train flags (`--lr` replaced per column):", "", "```",
              " ".join(summary["recipe"]["shared_train_flags"]), "```", "",
              f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", "",
              f"Machine: {summary['machine']}.", ""]
    return "\n".join(lines)


_COLORS = {"postln": "tab:blue", "preln": "tab:orange", "realformer": "tab:green"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(summary, path):
    """Validation loss against updates, one line per backbone (mean, min-max band over seeds);
    the right panel zooms on the second half of training, where the backbones separate."""
    plt = _pyplot()
    backbones = [b for b in BACKBONES if b in summary]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    last = max([u for b in backbones for u, _ in summary[b]["curve"]] or [0])
    for zoom, ax in enumerate(axes):
        for b in backbones:
            s = summary[b]
            keep = [i for i, (u, _) in enumerate(s["curve"]) if not zoom or u >= last / 2]
            if not keep:
                continue
            xs, ys = [s["curve"][i][0] for i in keep], [s["curve"][i][1] for i in keep]
            label = f"{b} (test BLEU {_fmt(s['bleu'])}" + (f" ± {s['bleu_std']:.2f})" if s["bleu_std"] is not None
                                                           else ", 1 seed)")
            ax.plot(xs, ys, marker="o", markersize=3, color=_COLORS[b], label=label)
            if len(s["seeds"]) > 1:
                band = [s["curve_min_max"][i] for i in keep]
                ax.fill_between([u for u, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                                color=_COLORS[b], alpha=0.2)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.set_title("second half (zoom)" if zoom else "validation loss"
                     + ("" if len(summary[backbones[0]]["seeds"]) == 1 else " (mean, min-max over seeds)"))
    axes[0].set_ylabel("validation loss (label-smoothed, base 2)")
    axes[0].legend()
    fig.suptitle(f"{summary['title']}: Post-LN vs Pre-LN vs RealFormer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(summary, path):
    plt = _pyplot()
    backbones = [b for b in BACKBONES if b in summary["runs"]]
    fig, axes = plt.subplots(1, len(backbones), figsize=(4.5 * len(backbones), 4), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    for ax, b in zip(axes[0], backbones):
        for i, lr in enumerate(lrs):
            color = cmap(i / max(1, len(lrs) - 1) * 0.85)
            for e in summary["runs"][b][lr]:
                points = [(u, v) for u, v in e["curve"] if v is not None and math.isfinite(v)]
                label = f"lr {lr}: {e['outcome']}" if e["seed"] == summary["runs"][b][lr][0]["seed"] else None
                if points:
                    ax.plot(*zip(*points), marker="o", markersize=3, color=color, label=label)
                    if e["outcome"] != "ok":
                        ax.plot(*points[-1], marker="x", markersize=10, color="red")
                elif label:
                    ax.plot([], [], color=color, label=label + " (no finite valid loss)")
        ax.set_title(b)
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss")
    fig.suptitle(f"{summary['title']}: learning-rate stability (x = diverged or stalled)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
