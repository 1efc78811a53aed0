"""``results/summary.png``: every study's seed-paired differences in one figure.

One row per study, language pair, depth and learning rate; two columns, the two questions
every study asks: RealFormer minus Post-LN, and RealFormer on Pre-LN minus Pre-LN (the
``seed_paired_vs_postln`` of ``realformer`` and the ``seed_paired_vs_preln`` of
``realformer_preln``, as the results JSONs hold them). A comparison with 3 or more seeds is
drawn as its mean with the 95% interval, one with two seeds as both seeds' values, one seed
as that value; a zero line in each column. The masked-LM comparison (accuracy points, not
BLEU) has its own axis below.

The rows come from the study JSONs found in a folder (``summary_rows``), so a study added
later (another ``--stability-limit`` depth, say) appears without any change here. Rows that
hold the same runs (the stability grid reuses the depth test's runs at its own learning
rate) are drawn once, under both studies' names. The path ablation is left out: its
``all`` and Post-LN rows are the main comparison's runs, and its single-path rows answer
another question.
"""

import glob
import json
import os

from .figures import pyplot
from .recipe import MAIN_ORDER

COMPARISONS = (("realformer", "seed_paired_vs_postln", "RealFormer − Post-LN"),
               ("realformer_preln", "seed_paired_vs_preln", "RealFormer on Pre-LN − Pre-LN"))
REFERENCE = {"seed_paired_vs_postln": "postln", "seed_paired_vs_preln": "preln"}
STUDY_NAMES = {"comparison": "comparison", "depth": "depth stress", "stability": "stability limit",
               "lr_sweep": "lr sweep", "mlm": "masked LM"}
ORDER = ("comparison", "depth", "stability", "lr_sweep", "mlm")
LANGUAGES = {"en": "En", "de": "De", "fr": "Fr"}


def kind(summary):
    """Which study wrote ``summary`` (None: not a study's results)."""
    configs = summary.get("configs")
    if configs and isinstance(configs, list) and "variants" in configs[0] and "machine" in summary:
        return "speed"
    if "grid" in summary:
        return "stability"
    if "depths" in summary:
        return "depth"
    if "runs" in summary and "lrs" in summary:
        return "lr_sweep"
    if "encoder" in summary and "all" in summary:
        return "ablation"
    if any(isinstance(summary.get(b), dict) and "mlm_accuracy_per_seed" in summary[b] for b in MAIN_ORDER):
        return "mlm"
    if any(isinstance(summary.get(b), dict) and "bleu_per_seed" in summary[b] for b in MAIN_ORDER):
        return "comparison"
    return None


def lr_label(lr):
    """``1e-3``, ``2.5e-4``: the way the docs write learning rates."""
    mantissa, exponent = f"{float(lr):.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def pair_label(summary):
    """``En→De`` from the recipe's corpus (or its data folder's ``_src_tgt`` suffix)."""
    recipe = summary.get("recipe") or {}
    corpus = recipe.get("corpus") or {}
    src, tgt = corpus.get("src"), corpus.get("tgt")
    if not (src and tgt):
        parts = os.path.basename(str(recipe.get("data", "")).rstrip("/")).split("_")
        src, tgt = (parts[-2], parts[-1]) if len(parts) >= 3 else (None, None)
    if not (src and tgt):
        return "?"
    return f"{LANGUAGES.get(src, src.title())}→{LANGUAGES.get(tgt, tgt.title())}"


def _ok(statuses):
    return any(st in ("ok", "finished") for st in statuses)


def _cell(entry, key, entries):
    """One comparison of a row: the record and whether every run on both sides lagged or diverged."""
    record = (entry or {}).get(key)
    if not record or not record.get("per_seed"):
        return None
    reference = entries.get(REFERENCE[key]) or {}
    failed = not _ok(entry.get("status_per_seed", [])) and not _ok(reference.get("status_per_seed", []))
    return dict(record, failed=failed)


def _entry_cells(entries):
    return [_cell(entries.get(backbone), key, entries) for backbone, key, _ in COMPARISONS]


def _sweep_cells(summary, lr_key):
    cells = []
    for backbone, key, _ in COMPARISONS:
        record = summary.get(key, {}).get(backbone, {}).get(lr_key)
        if not record or not record.get("per_seed"):
            cells.append(None)
            continue
        runs = summary["runs"]
        outcomes = [e["outcome"] for e in runs[backbone][lr_key] + runs[REFERENCE[key]][lr_key]]
        cells.append(dict(record, failed=not _ok(outcomes)))
    return cells


def rows_of(summary, kind, name):
    """``[{"study", "kind", "pair", "depth", "lr", "updates", "cells": [cell per COMPARISONS]}]``."""
    settings = (summary.get("recipe") or {}).get("settings", {})
    base = dict(study=STUDY_NAMES[kind], kind=kind, name=name, updates=settings.get("max_update"),
                pair="WikiText-2" if kind == "mlm" else pair_label(summary))
    if kind in ("comparison", "mlm"):
        return [dict(base, depth=settings.get("layers"), lr=settings.get("lr"), cells=_entry_cells(summary))]
    if kind == "depth":
        return [dict(base, depth=int(depth), lr=settings.get("lr"), cells=_entry_cells(row))
                for depth, row in sorted(summary["depths"].items(), key=lambda kv: int(kv[0]))]
    if kind == "stability":
        return [dict(base, depth=summary.get("depth", settings.get("layers")), lr=float(lr), cells=_entry_cells(row))
                for lr, row in summary["grid"].items()]
    if kind == "lr_sweep":
        return [dict(base, depth=settings.get("layers"), lr=float(lr), cells=_sweep_cells(summary, lr))
                for lr in next(iter(summary["runs"].values()))]
    return []


def _same_runs_key(row):
    cells = tuple(None if c is None else (tuple(c["seeds"]), tuple(c["per_seed"])) for c in row["cells"])
    return row["pair"], row["depth"], row["lr"], row["updates"], cells


def summary_rows(folder):
    """The rows of every study JSON in ``folder``, in reading order; rows with the same runs merged."""
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        k = kind(summary) if isinstance(summary, dict) else None
        if k in ORDER:
            found.append((ORDER.index(k), os.path.basename(path)[:-len(".json")], summary, k))
    rows = []
    for _, name, summary, k in sorted(found, key=lambda t: t[:2]):
        rows += sorted(rows_of(summary, k, name), key=lambda r: r["depth"] or 0)  # stable: the study's lr order
    merged, seen = [], {}
    for row in rows:
        if not any(row["cells"]):
            continue
        key = _same_runs_key(row)
        if key in seen:
            first = seen[key]
            if row["study"] not in first["study"].split(" = "):
                first["study"] += " = " + row["study"]
            continue
        seen[key] = row
        merged.append(row)
    return merged


def row_label(row):
    depth = f"{row['depth']}+{row['depth']}" if row["kind"] != "mlm" else f"{row['depth']} layers"
    updates = f", {row['updates']} upd." if row["updates"] else ""
    return f"{row['study']}: {row['pair']}, {depth}, lr {lr_label(row['lr'])}{updates}"


def cell_text(cell):
    if cell.get("ci95"):
        text = f"{cell['mean']:+.2f} [{cell['ci95'][0]:+.2f}, {cell['ci95'][1]:+.2f}]"
    else:
        text = ", ".join(f"{d:+.2f}" for d in cell["per_seed"]) + (" (1 seed)" if len(cell["per_seed"]) == 1 else "")
    return text + ("  (both lagging)" if cell["failed"] else "")


LABEL_OFFSET_PT = 13


def _draw_cell(ax, y, cell, color):
    """Draw one cell at row ``y``; returns its text label (anchored at the cell's rightmost x)."""
    seeds = cell["per_seed"]
    if cell.get("ci95"):
        low, high = cell["ci95"]
        clear = low > 0 or high < 0
        ax.plot([low, high], [y, y], color=color, lw=2.2, solid_capstyle="butt", zorder=2)
        ax.plot([low, low], [y - 0.18, y + 0.18], color=color, lw=1.5, zorder=2)
        ax.plot([high, high], [y - 0.18, y + 0.18], color=color, lw=1.5, zorder=2)
        ax.plot([cell["mean"]], [y], "D", ms=7, color=color if clear else "white", mec=color, mew=1.6, zorder=3)
        ax.plot(seeds, [y] * len(seeds), "|", ms=9, color="0.35", zorder=4)
    else:
        if len(seeds) > 1:
            ax.plot([min(seeds), max(seeds)], [y, y], color=color, lw=0.8, ls=":", zorder=2)
        ax.plot(seeds, [y] * len(seeds), "o", ms=6.5, color="white", mec=color, mew=1.6, zorder=3)
    x_text = max([*seeds, *(cell.get("ci95") or [])])
    return ax.annotate(cell_text(cell), (x_text, y), xytext=(LABEL_OFFSET_PT, 0), textcoords="offset points",
                       va="center", fontsize=8.5, color="0.15")


def _right_limit(fig, low, labels, default):
    """The smallest right x-limit, at least ``default``, with ``low`` on the left, at which every
    label (drawn a fixed offset in points right of its anchor) ends inside its own axes."""
    renderer = fig.canvas.get_renderer()
    needed = [default]
    for label in labels:
        width = label.axes.get_window_extent(renderer).width
        free = 1 - (label.get_window_extent(renderer).width + (LABEL_OFFSET_PT + 6) * fig.dpi / 72) / width
        needed.append(low + (label.xy[0] - low) / max(free, 0.05))
    return max(needed)


def plot_summary(rows, path):
    """Draw ``rows`` (``summary_rows``) into ``path``; the masked LM on its own axis below."""
    plt = pyplot()
    groups = [[r for r in rows if r["kind"] != "mlm"], [r for r in rows if r["kind"] == "mlm"]]
    groups = [g for g in groups if g]
    heights = [len(g) + 1.2 for g in groups]
    fig, axes = plt.subplots(len(groups), 2, figsize=(15, 0.42 * sum(heights) + 1.8), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "hspace": 0.35, "wspace": 0.05})
    colors = ("#1f5fa8", "#c0561b")
    for g, group in enumerate(groups):
        unit = "accuracy points" if group[0]["kind"] == "mlm" else "BLEU"
        values = [v for r in group for c in r["cells"] if c for v in [*c["per_seed"], *(c.get("ci95") or [])]]
        low, high = min(values + [0.0]), max(values + [0.0])
        span = max(high - low, 0.5)
        labels = []
        for col, (_, _, title) in enumerate(COMPARISONS):
            ax = axes[g][col]
            ax.axvline(0, color="black", lw=1)
            for i, row in enumerate(group):
                y = len(group) - i
                if i % 2 == 0:
                    ax.axhspan(y - 0.5, y + 0.5, color="0.94", zorder=0)
                cell = row["cells"][col]
                if cell is None:
                    ax.text(0, y, " not run", va="center", fontsize=8, color="0.55")
                else:
                    labels.append(_draw_cell(ax, y, cell, colors[col]))
            ax.set_ylim(0.4, len(group) + 0.6)
            ax.set_xlabel(f"{title}, same seed ({unit})")
            ax.grid(axis="x", color="0.85", lw=0.6)
            ax.set_yticks(range(1, len(group) + 1))
            ax.set_yticklabels([row_label(r) for r in reversed(group)] if col == 0 else [], fontsize=9.5)
            ax.tick_params(axis="y", length=0)
            if g == 0:
                ax.set_title(title, fontsize=11, fontweight="bold")
        # both columns share one scale, wide enough that no label runs past its panel
        left = low - 0.08 * span
        right = _right_limit(fig, left, labels, default=high + 0.42 * span)
        for ax in axes[g]:
            ax.set_xlim(left, right)
    fig.suptitle("Seed-paired differences, every study (results/*.json). ◆ mean with its 95% interval "
                 "(filled: excludes 0; | each seed); ○ each seed where there are one or two", fontsize=10, y=0.995)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_summary(folder, log=print):
    """``folder/summary.png`` from the study JSONs in ``folder``; returns its path (None: no study)."""
    rows = summary_rows(folder)
    if not rows:
        return None
    path = os.path.join(folder, "summary.png")
    plot_summary(rows, path)
    log(f"[rerender] {path}: {len(rows)} rows from the study JSONs in {folder}")
    return path
