"""Stability limit at depth (issue 25): the depth-stress recipe (``L+L`` layers, narrow) at
several peak learning rates for every backbone, each run marked ``ok`` / ``lagging`` /
``diverged`` against the lowest best valid loss of the grid's runs of the same seed.

Runs at the recipe's own learning rate live where the depth stress test puts them
(``out/L<depth>/<backbone>/seed<k>/``), so with the depth test's ``out`` those runs are
reused when the recipe is identical (``fairseq_runs.same_recipe``); the other learning
rates go to ``out/lr<lr>/L<depth>/...``. ``report_only`` trains nothing and writes the
grid from the runs finished so far (missing cells "not run"); the JSON's ``progress``
lists the done and the missing runs, and a re-run with the same arguments trains the
missing ones.
"""

import math
import os
from dataclasses import replace

from realformer_nmt.errors import ConfigError

from .figures import COLORS, curve_with_band, pyplot
from .recipe import corpus_info, test_references
from .report import SEED_PAIRED_NOTE, fmt, not_run_lines, outcome_table, recipe_lines, seed_paired_cell, write_outputs
from .runs import (
    check_backbones,
    done_and_missing,
    join_notes,
    machine_description,
    parallel_note,
    recipe_record,
    train_all,
)
from .stats import add_seed_paired, best_loss_per_seed, outcome_entry, outcome_rule

STABILITY_BACKBONES = ("postln", "realformer", "realformer_mean", "preln", "realformer_preln")
STABILITY_LRS = (1e-3, 5e-4, 2.5e-4)
STABILITY_REFERENCE = "the lowest best valid loss of the grid's finished runs (every lr and backbone) of the same seed"


def run_dir(out, depth, lr, recipe_lr, backbone, seed):
    """Where one grid run lives: the depth test's folder at the recipe's own learning rate."""
    base = out if math.isclose(lr, recipe_lr) else os.path.join(out, f"lr{lr:g}")
    return os.path.join(base, f"L{depth}", backbone, f"seed{seed}")


def stability_limit(data, out, recipe, lrs=STABILITY_LRS, depth=12, backbones=STABILITY_BACKBONES, seeds=(1, 2),
                    margin=1.0, residual_mode="sum", references=None, results_path=None, machine_note="",
                    threads=None, log=print, title=None, jobs=1, report_only=False):
    """Train every backbone at ``depth+depth`` layers at every learning rate in ``lrs``
    (``recipe.layers`` and the peak lr replaced, nothing else changes); write the backbone x
    lr grid (JSON, MD, PNG). Each cell keeps the depth test's per-backbone record
    (``bleu_per_seed``, ``status_per_seed``, ...) and the seed-paired BLEU differences to
    Post-LN and Pre-LN at the same learning rate. Returns the summary dict."""
    check_backbones(backbones)
    lrs = sorted({float(lr) for lr in lrs}, reverse=True)
    if not lrs or lrs[-1] <= 0:
        raise ConfigError("--lrs: give one or more learning rates > 0")
    if int(depth) < 1:
        raise ConfigError("--depths: give one layer count >= 1")
    depth = int(depth)
    references = test_references(data, references)
    deep = replace(recipe, layers=depth)
    specs = [((lr, b, seed), b, seed, run_dir(out, depth, lr, recipe.lr, b, seed), deep, lr)
             for seed in seeds for lr in lrs for b in backbones]
    runs = train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "stability", report_only)
    reference = best_loss_per_seed(runs.values(), seeds)
    grid = {}
    for lr in lrs:
        row = {}
        for b in backbones:
            rs = [runs[(lr, b, seed)] for seed in seeds if runs[(lr, b, seed)] is not None]
            row[b] = outcome_entry(rs, b, residual_mode, reference, margin) if rs else None
        grid[f"{lr:g}"] = add_seed_paired(row)
    signatures = {r["signature"] for r in runs.values() if r is not None and r["signature"]}
    record = recipe_record(deep, data, references, backbones, residual_mode, seeds)
    record["note"] = f"--encoder-layers and --decoder-layers are {depth}; `--lr` replaced per column by lrs"
    summary = {
        "title": title or corpus_info(data)["title"],
        "study": "stability_limit",
        "depth": depth,
        "lrs": lrs,
        "backbones": list(backbones),
        "grid": grid,
        "reference_loss_per_seed": {str(seed): loss for seed, loss in reference.items()},
        "reference": STABILITY_REFERENCE,
        "rule": outcome_rule(margin, STABILITY_REFERENCE),
        "margin": margin,
        "progress": done_and_missing(runs, ("lr", "backbone", "seed")),
        "recipe": record,
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(join_notes(parallel_note(jobs, threads), machine_note)),
        "out": os.path.abspath(out),
    }
    results_path = results_path or os.path.join(out, f"stability_depth{depth}.json")
    write_outputs(summary, results_path, stability_markdown, plot_stability)
    log(f"[stability] wrote {results_path} (+ .md, .png)")
    return summary


def _grid_cell(e):
    if e is None:
        return "not run"
    bleus = " / ".join(fmt(x) for x in e["bleu_per_seed"])
    diverged = e["status_per_seed"].count("diverged")
    return f"{', '.join(e['status_per_seed'])} ({diverged} of {len(e['status_per_seed'])} diverged); BLEU {bleus}"


# the two questions a grid answers per learning rate: residual attention on Post-LN, and on Pre-LN
GRID_DIFFERENCES = (("realformer", "seed_paired_vs_postln", "RealFormer minus Post-LN"),
                    ("realformer_preln", "seed_paired_vs_preln", "RealFormer on Pre-LN minus Pre-LN"))


def difference_lines(summary):
    """A table of the seed-paired BLEU differences that answer the grid's question, one row
    per comparison and one column per learning rate (no lines if neither pair ran)."""
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    rows = [(b, key, label) for b, key, label in GRID_DIFFERENCES
            if any((summary["grid"][lr].get(b) or {}).get(key) for lr in lrs)]
    if not rows:
        return []
    lines = ["Seed-paired test BLEU differences at each learning rate:", "",
             "| difference | " + " | ".join(f"lr {lr}" for lr in lrs) + " |", "| --- |" + " --- |" * len(lrs)]
    for b, key, label in rows:
        lines.append(f"| {label} | " + " | ".join(seed_paired_cell(summary["grid"][lr].get(b), key)
                                                    for lr in lrs) + " |")
    return lines + [""]


def stability_markdown(summary):
    backbones, depth = summary["backbones"], summary["depth"]
    settings = summary["recipe"]["settings"]
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    lines = [f"# {summary['title']}: stability limit at {depth}+{depth} layers", ""] + not_run_lines(summary) + [
             f"The depth stress recipe ({depth}+{depth} layers, d={settings['embed_dim']}, FFN {settings['ffn_dim']}, "
             f"{settings['heads']} heads, {settings['warmup_updates']} warmup updates, {settings['max_update']} "
             f"updates) at each peak learning rate; seeds {summary['recipe']['seeds']}. Grid cell: outcome per "
             "seed; test BLEU per seed.", "",
             "| backbone | " + " | ".join(f"lr {lr}" for lr in lrs) + " |", "| --- |" + " --- |" * len(lrs)]
    for b in backbones:
        lines.append(f"| {b} | " + " | ".join(_grid_cell(summary["grid"][lr].get(b)) for lr in lrs) + " |")
    lines.append("")
    lines += difference_lines(summary)
    for lr in lrs:
        lines += [f"## lr {lr}", ""] + outcome_table(summary["grid"][lr], backbones) + [""]
    lines += [SEED_PAIRED_NOTE + " (same learning rate).", "",
              f"Rule: {summary['rule']}. Reference per seed: "
              + ", ".join(f"seed {k}: {fmt(v, 3)}" for k, v in summary["reference_loss_per_seed"].items()) + ".",
              "", f"Learning rates: {summary['recipe']['note']}."] + recipe_lines(summary)
    return "\n".join(lines)


def plot_stability(summary, path):
    """One panel per learning rate: validation loss against updates per backbone (mean,
    min-max band over seeds)."""
    plt = pyplot()
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    fig, axes = plt.subplots(1, len(lrs), figsize=(6 * len(lrs), 4.5), squeeze=False, sharey=True)
    for ax, lr in zip(axes[0], lrs):
        for b in summary["backbones"]:
            e = summary["grid"][lr].get(b)
            if e is None:
                ax.plot([], [], color=COLORS[b], label=f"{b}: not run")
                continue
            curve_with_band(ax, e, COLORS[b], f"{b}: {'/'.join(e['status_per_seed'])}, BLEU {fmt(e['bleu'])}")
        ax.set_title(f"lr {lr}")
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        if not any(summary["grid"][lr].get(b) for b in summary["backbones"]):
            ax.text(0.5, 0.5, "no run has finished yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss (mean, min-max over seeds)")
    fig.suptitle(f"{summary['title']}: stability limit at {summary['depth']}+{summary['depth']} layers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
