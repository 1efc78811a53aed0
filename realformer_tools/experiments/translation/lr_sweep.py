"""The paper's learning-rate stability test (He et al. 2021, Fig. 3): the same recipe at a
normal and at higher peak learning rates (nothing else changes) for a short budget; each
run's outcome is judged as in every study with outcomes: against the lowest best valid loss
of the study's finished runs of the same seed (every backbone and learning rate)."""

import math
import os

from realformer_nmt.errors import ConfigError

from .figures import pyplot
from .recipe import BACKBONES, corpus_info, test_references
from .report import fmt, seconds, seed_paired_cell, write_outputs
from .runs import check_backbones, join_notes, machine_description, parallel_note, recipe_record, train_all
from .stats import best_loss_per_seed, classify, outcome_rule, reference_record, seed_paired

SWEEP_REFERENCE = "the lowest best valid loss of the sweep's finished runs (every lr and backbone) of the same seed"


def sweep_reference(normal_lr=None):
    """The sweep's outcome reference, the same rule as the depth test's and the grids' (the
    normal learning rate only labels a column)."""
    return SWEEP_REFERENCE


def classify_sweep(table, margin):
    """Set each run's ``outcome`` in the sweep's ``{backbone: {lr: [run per seed]}}`` against the
    lowest best valid loss of the finished runs of its seed (``stats.best_loss_per_seed``);
    returns ``{seed: reference loss}``."""
    entries = [e for by_lr in table.values() for es in by_lr.values() for e in es]
    reference = best_loss_per_seed(entries, sorted({e["seed"] for e in entries}))
    for e in entries:
        e["outcome"] = classify(e, reference[e["seed"]], margin)
    return reference


def sweep_seed_paired(table):
    """``{"seed_paired_vs_postln": {backbone: {lr: record}}, ...}`` (Pre-LN where it ran) from the
    sweep's ``{backbone: {lr: [run per seed]}}``."""
    out = {}
    for reference in ("postln", "preln"):
        if reference not in table:
            continue
        out[f"seed_paired_vs_{reference}"] = {
            b: {lr: seed_paired([e["bleu"] for e in entries], [e["bleu"] for e in table[reference][lr]],
                                [e["seed"] for e in entries], [e["seed"] for e in table[reference][lr]])
                for lr, entries in by_lr.items()}
            for b, by_lr in table.items() if b != reference}
    return out


def lr_sweep(data, out, recipe, lrs, backbones=BACKBONES, seeds=(1,), residual_mode="sum", normal_lr=None,
             margin=1.0, references=None, results_path=None, machine_note="", threads=None, log=print,
             title=None, jobs=1):
    """Train every backbone at every learning rate in ``lrs`` (nothing else changes).

    ``normal_lr`` (default: the smallest of ``lrs``) is trained first and marked in the
    table. A run is ``lagging`` when its best valid loss exceeds the lowest best valid loss of
    the sweep's finished runs of the same seed by more than ``margin`` (``classify_sweep``,
    the rule of every study with outcomes).
    ``seed_paired_vs_postln`` / ``_vs_preln``: ``{backbone: {lr: BLEU differences seed by
    seed}}`` against Post-LN / Pre-LN at the same learning rate.
    """
    check_backbones(backbones)
    lrs = sorted(set(float(lr) for lr in lrs))
    if not lrs:
        raise ConfigError("--lrs: give at least one learning rate")
    normal_lr = float(normal_lr) if normal_lr is not None else lrs[0]
    if normal_lr not in lrs:
        raise ConfigError(f"--normal-lr {normal_lr:g} is not one of --lrs")
    references = test_references(data, references)
    order = [normal_lr] + [lr for lr in lrs if lr != normal_lr]  # the reference runs first
    specs = [((backbone, lr, seed), backbone, seed, os.path.join(out, f"lr{lr:g}", backbone, f"seed{seed}"),
              None, lr) for seed in seeds for lr in order for backbone in backbones]
    runs = train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "lr-sweep")
    table = {}
    for backbone in backbones:
        table[backbone] = {}
        for lr in lrs:
            entries = []
            for seed in seeds:
                r = runs[(backbone, lr, seed)]
                entries.append({
                    "seed": seed, "outcome": None, "status": r["status"],
                    "reason": r["reason"], "bleu": r["bleu"], "best_valid_loss": r["best_valid_loss"],
                    "final_valid_loss": r["final_valid_loss"], "updates": r["updates"],
                    "train_seconds": r["train_seconds"], "decode_seconds": r["decode_seconds"],
                    "curve": [[rec["update"], rec["loss"]] for rec in r["curve"]],
                    "checkpoint": r["checkpoint"], "log": r["log"],
                })
            table[backbone][f"{lr:g}"] = entries
    reference = classify_sweep(table, margin)
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    summary = {
        "title": title or corpus_info(data)["title"],
        "runs": table,
        "lrs": lrs,
        "normal_lr": normal_lr,
        "divergence_rule": outcome_rule(margin, sweep_reference(normal_lr)),
        "reference": sweep_reference(normal_lr),
        "reference_loss_per_seed": reference_record(reference),
        "margin": margin,
        "recipe": recipe_record(recipe, data, references, backbones, residual_mode, seeds),
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(join_notes(parallel_note(jobs, threads), machine_note)),
        "out": os.path.abspath(out),
    }
    summary.update(sweep_seed_paired(table))
    results_path = results_path or os.path.join(out, "lr_stress.json")
    write_outputs(summary, results_path, sweep_markdown, plot_sweep)
    log(f"[lr-sweep] wrote {results_path} (+ .md, .png)")
    return summary


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
                parts.append(f"{e['outcome']}: BLEU {fmt(e['bleu'])}, loss {fmt(e['best_valid_loss'], 3)} "
                             f"({e['updates']} upd; {seconds(e['train_seconds'])})")
            cells.append("<br>".join(parts))
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    for key, name in (("seed_paired_vs_postln", "Post-LN"), ("seed_paired_vs_preln", "Pre-LN")):
        if summary.get(key):
            lines += ["", f"Seed-paired BLEU difference to {name} at the same learning rate:", "",
                      "| backbone | " + " | ".join(f"lr {lr}" for lr in lrs) + " |", "| --- |" + " --- |" * len(lrs)]
            lines += [f"| {b} | " + " | ".join(seed_paired_cell(summary[key][b], lr) for lr in lrs) + " |"
                      for b in backbones if b in summary[key]]
    reference = summary.get("reference_loss_per_seed") or {}
    lines += ["", f"Rule: {summary['divergence_rule']}."
              + (" Reference (lowest best valid loss) per seed: "
                 + ", ".join(f"seed {k}: {fmt(v, 3)}" for k, v in reference.items()) + "." if reference else ""), "",
              "Shared fairseq-train flags (`--lr` replaced per column):", "", "```",
              " ".join(summary["recipe"]["shared_train_flags"]), "```", "",
              f"sacreBLEU signature: `{summary['sacrebleu_signature']}`", "",
              f"Machine: {summary['machine']}.", ""]
    return "\n".join(lines)


def plot_sweep(summary, path):
    plt = pyplot()
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
    fig.suptitle(f"{summary['title']}: learning-rate stability (x = diverged or lagging)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
