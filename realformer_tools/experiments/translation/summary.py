"""``results/summary.png``: every study's seed-paired differences in one figure.

One row per study, language pair, depth, learning rate (and test set or residual path where a
study has several); two columns, the two questions every study asks: RealFormer minus Post-LN
(for the path ablation: residual attention on one path minus Post-LN), and RealFormer on
Pre-LN minus Pre-LN (the ``seed_paired_vs_postln`` of ``realformer`` and the
``seed_paired_vs_preln`` of ``realformer_preln``, as the results JSONs hold them). A
comparison with 3 or more seeds is drawn as its mean with the 95% interval, one with two
seeds as both seeds' values, one seed as that value; a zero line in each panel. Each value's
numbers are printed in a column beside its panel, so the x-axis fits the data.

The rows come in blocks, each with its own x-axis fitted to its data (a block's widest
intervals run past it as arrows, their numbers printed): the main recipe (3+3 layers, 1800
updates: the comparisons, their further test sets, the path ablation); the deeper models and
learning-rate grids (1200 updates), by depth, then learning rate; the 200-update, one-seed
learning-rate sweep, drawn faint (a quick look, not a test); the masked LM (accuracy points).

The rows come from the study JSONs found in a folder (``summary_rows``), so a study added
later appears without any change here. Rows that hold the same runs are drawn once: the
same seeds under both studies' names (``depth stress = stability limit``), or a row whose
seeds are part of another's under the larger one (``stability limit [its seeds 1-2 = depth
stress]``: the grid added seed 3 to the depth test's seeds 1-2; ``comparison [its seeds 1-2 =
path ablation, all three paths]``). A comparison's row names the test set it is scored on.

A comparison with the value residual backbones (``preln_vr``, ``realformer_preln_vr``) adds their
rows minus Pre-LN to the right column, per test set and over the sets, each interval corrected
for the family of comparisons it belongs to (``pairs.py``). Where a comparison was scored on
several test sets, each set's interval is also drawn corrected for their number (Bonferroni),
and only that one decides whether the mean is filled; seeds whose run was trained again
without reproducing its committed run are drawn as crosses (``reproducibility`` in the JSON).
Both panels of a block share one x-scale.
"""

import glob
import json
import os

from .figures import pyplot
from .intervals import corrected_interval, rerun_seeds
from .recipe import MAIN_ORDER

COMPARISONS = (("realformer", "seed_paired_vs_postln", "RealFormer − Post-LN"),
               ("realformer_preln", "seed_paired_vs_preln", "RealFormer on Pre-LN − Pre-LN"))
COLUMN_TITLES = ("RealFormer (or one path) − Post-LN", "RealFormer (or value residual) on Pre-LN − Pre-LN")
VALUE_RESIDUAL = {"preln_vr": "value residual", "realformer_preln_vr": "RealFormer + value residual"}  # on Pre-LN
REFERENCE = {"seed_paired_vs_postln": "postln", "seed_paired_vs_preln": "preln"}
STUDY_NAMES = {"comparison": "comparison", "depth": "depth stress", "stability": "lr limit",
               "lr_sweep": "lr sweep", "mlm": "masked LM", "ablation": "path ablation"}
ORDER = ("comparison", "ablation", "depth", "stability", "lr_sweep", "mlm")
LANGUAGES = {"en": "En", "de": "De", "fr": "Fr"}
PATHS = {"encoder": "encoder path only", "decoder": "decoder path only", "cross": "cross path only",
         "all": "all three paths"}
BLOCKS = (("main", "3+3 layers, 1800 updates (the main recipe)"),
          ("deep", "deeper models and learning-rate grids, 1200 updates"),
          ("sweep", "learning-rate sweep: one seed, 200 updates (a quick look, not a test)"),
          ("mlm", "masked LM, WikiText-2 (accuracy points)"))


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


def _cell(entry, key, entries, record=None, family=1, reruns=(), family_word="sets"):
    """One comparison of a row: the record, whether every run on both sides lagged or diverged,
    how many comparisons of one family it is one of (``family``: its interval corrected for
    them; ``family_word``: test ``sets``, or learning ``rates`` of a grid) and the seeds whose
    runs were trained again without reproducing the committed ones."""
    record = record if record is not None else (entry or {}).get(key)
    if not record or not record.get("per_seed"):
        return None
    reference = entries.get(REFERENCE[key]) or {}
    failed = not _ok((entry or {}).get("status_per_seed", [])) and not _ok(reference.get("status_per_seed", []))
    if record.get("corrected_for"):  # one of a family of comparisons (pairs.py): corrected for all of them
        family, family_word = record["corrected_for"], record.get("corrected_what", family_word)
    return dict(record, failed=failed, family=family, family_word=family_word,
                reruns=[seed for seed in reruns if seed in record["seeds"]])


def _family(entry, key):
    """How many test sets a comparison's record was scored on (1: its headline only)."""
    return max(1, len((entry or {}).get(f"{key}_by_test_set") or {}))


def _reruns(summary, backbone, key):
    return rerun_seeds(summary, (backbone, REFERENCE[key])) if "reproducibility" in summary else []


def _entry_cells(entries):
    return [_cell(entries.get(backbone), key, entries, family=_family(entries.get(backbone), key),
                  reruns=_reruns(entries, backbone, key)) for backbone, key, _ in COMPARISONS]


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


def _test_set_rows(summary, base):
    """A comparison's further test sets and the mean over its sets, one row each."""
    rows, names = [], []
    for backbone, key, _ in COMPARISONS:
        names += [n for n in (summary.get(backbone) or {}).get(f"{key}_by_test_set") or {} if n not in names]
    for name in names[1:] + (["mean of the test sets"] if len(names) > 1 else []):
        cells = []
        for backbone, key, _ in COMPARISONS:
            entry = summary.get(backbone) or {}
            mean = name == "mean of the test sets"
            record = entry.get(f"{key}_over_test_sets") if mean else (entry.get(f"{key}_by_test_set") or {}).get(name)
            cells.append(_cell(entry, key, summary, record or {}, family=1 if mean else _family(entry, key),
                               reruns=_reruns(summary, backbone, key)))
        rows.append(dict(base, variant=name if name.startswith("mean") else f"on {name}", cells=cells))
    return rows


def _value_residual_rows(summary, base, headline):
    """The value residual backbones minus Pre-LN (right column), on each test set and their mean."""
    rows, key = [], "seed_paired_vs_preln"
    for backbone, name in VALUE_RESIDUAL.items():
        entry = summary.get(backbone)
        if not isinstance(entry, dict) or not entry.get(key):
            continue
        by_set = entry.get(f"{key}_by_test_set") or {headline: entry[key]}
        for test_set, record in list(by_set.items()) + [("mean of the test sets", entry.get(f"{key}_over_test_sets"))]:
            cell = _cell(entry, key, summary, record or {}, family=_family(entry, key),
                         reruns=_reruns(summary, backbone, key))
            where = test_set if test_set.startswith("mean") else f"on {test_set}"
            if cell is not None:
                rows.append(dict(base, variant=f"{name}, {where}", cells=[None, cell], one_column=True))
    return rows


def _headline_set(summary):
    """The test set a comparison's own records are scored on, where it names its sets."""
    for backbone, key, _ in COMPARISONS:
        names = list((summary.get(backbone) or {}).get(f"{key}_by_test_set") or {})
        if names:
            return names[0]
    return ((summary.get("test_sets") or [{}])[0]).get("name")


def rows_of(summary, kind, name):
    """``[{"study", "kind", "pair", "depth", "lr", "updates", "variant", "cells": [cell per COMPARISONS]}]``."""
    settings = (summary.get("recipe") or {}).get("settings", {})
    base = dict(study=STUDY_NAMES[kind], kind=kind, name=name, updates=settings.get("max_update"), variant=None,
                pair="WikiText-2" if kind == "mlm" else pair_label(summary))
    if kind in ("comparison", "mlm"):
        base.update(depth=settings.get("layers"), lr=settings.get("lr"))
        headline = _headline_set(summary) if kind == "comparison" else None
        rows = [dict(base, cells=_entry_cells(summary), test_set=headline)]
        return rows + (_test_set_rows(summary, base) + _value_residual_rows(summary, base, headline)
                       if kind == "comparison" else [])
    if kind == "ablation":
        base.update(depth=settings.get("layers"), lr=settings.get("lr"))
        entries = {"postln": summary.get("postln")}
        return [dict(base, variant=PATHS[key], cells=[_cell(summary[key], "seed_paired_vs_postln", entries), None])
                for key in PATHS if summary.get(key)]
    if kind == "depth":
        return [dict(base, depth=int(depth), lr=settings.get("lr"), cells=_entry_cells(row))
                for depth, row in sorted(summary["depths"].items(), key=lambda kv: int(kv[0]))]
    if kind == "stability":  # each question asked once per rate: intervals corrected for the rates
        rates = len(summary["grid"])
        return [dict(base, depth=summary.get("depth", settings.get("layers")), lr=float(lr),
                     cells=[_cell(row.get(b), key, row, family=rates, family_word="rates")
                            for b, key, _ in COMPARISONS])
                for lr, row in summary["grid"].items()]
    if kind == "lr_sweep":
        return [dict(base, depth=settings.get("layers"), lr=float(lr), cells=_sweep_cells(summary, lr))
                for lr in next(iter(summary["runs"].values()))]
    return []


def block_of(row):
    if row["kind"] == "mlm":
        return "mlm"
    if row["kind"] == "lr_sweep":
        return "sweep"
    return "main" if row["kind"] in ("comparison", "ablation") else "deep"


def _setting(row):
    return row["pair"], row["depth"], row["lr"], row["updates"]


def _pairs(cell):
    return None if cell is None else dict(zip(cell["seeds"], cell["per_seed"]))


def _part_of(row, other):
    """Whether every run pair of ``row`` is in ``other`` (same setting, same values per seed)."""
    if _setting(row) != _setting(other) or row["variant"] not in (None, "all three paths") or other["variant"]:
        return False
    found = False
    for cell, big in zip(row["cells"], other["cells"]):
        if cell is None:
            continue
        mine, theirs = _pairs(cell), _pairs(big)
        if theirs is None or any(seed not in theirs or theirs[seed] != value for seed, value in mine.items()):
            return False
        found = True
    return found


def summary_rows(folder):
    """The rows of every study JSON in ``folder``, block by block (within a block: study order,
    then depth and learning rate); rows holding the same runs merged (see the module's text)."""
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        k = kind(summary) if isinstance(summary, dict) else None
        if k in ORDER:
            found.append((ORDER.index(k), os.path.basename(path)[:-len(".json")], summary, k))
    rows = []
    for _, name, summary, k in sorted(found, key=lambda t: t[:2]):
        rows += rows_of(summary, k, name)
    rows = [r for r in rows if any(r["cells"])]
    for row in rows:
        row["block"] = block_of(row)
    merged = []
    for row in rows:  # the same runs under two names: one row
        same = next((m for m in merged if _part_of(row, m) and _part_of(m, row)), None)
        if same is not None:
            if row["study"] not in same["study"].split(" = "):
                same["study"] += " = " + row["study"]
            continue
        merged.append(row)
    kept = []
    for row in merged:  # a row whose runs are part of another's: drawn in that one
        bigger = next((m for m in merged if m is not row and _part_of(row, m) and not _part_of(m, row)), None)
        if bigger is None:
            kept.append(row)
        else:
            seeds = sorted({seed for c in row["cells"] if c for seed in c["seeds"]})
            what = ", all three paths" if row["variant"] == "all three paths" else ""
            bigger.setdefault("holds", []).append(f"its seeds {_seed_list(seeds)} = {row['study']}{what}")
    blocks = [b for b, _ in BLOCKS]
    order = {id(r): i for i, r in enumerate(kept)}

    def key(r):  # blocks in order; the deep block by pair, depth, then learning rate; others as read
        within = (r["pair"], r["depth"] or 0, r["lr"] or 0) if r["block"] == "deep" else (order[id(r)],)
        return (blocks.index(r["block"]),) + within
    return sorted(kept, key=key)


def _seed_list(seeds):
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)) \
        else ", ".join(map(str, seeds))


def row_label(row):
    depth = f"{row['depth']}+{row['depth']}" if row["kind"] != "mlm" else f"{row['depth']} layers"
    updates = f", {row['updates']} upd." if row["updates"] else ""
    variant = row.get("variant") or (f"on {row['test_set']}" if row.get("test_set") else None)
    variant = f" ({variant})" if variant else ""
    holds = "".join(f" [{h}]" for h in row.get("holds", []))
    return f"{row['study']}{variant}{holds}: {row['pair']}, {depth}, lr {lr_label(row['lr'])}{updates}"


def corrected(cell):
    """The interval that decides a cell's fill: its 95% interval, corrected (Bonferroni) for
    the number of test sets where it is one of several; None without an interval."""
    if not cell.get("ci95"):
        return None
    return corrected_interval(cell, cell["family"]) if cell.get("family", 1) > 1 else cell["ci95"]


def cell_text(cell):
    n = len(cell["per_seed"])
    lagging = "  (both lagging)" if cell["failed"] else ""
    if cell.get("ci95"):
        text = f"{cell['mean']:+.2f} [{cell['ci95'][0]:+.2f}, {cell['ci95'][1]:+.2f}], n={n}{lagging}"
        if cell.get("family", 1) > 1:
            low, high = corrected(cell)
            text += f"\n{cell['family']} {cell.get('family_word', 'sets')}, corrected: [{low:+.2f}, {high:+.2f}]"
        return text
    return ", ".join(f"{d:+.2f}" for d in cell["per_seed"]) + (" (1 seed)" if n == 1 else "") + lagging


def _limits(cells):
    """x-limits of a panel: every seed's value, mean and 0, and each interval's ends unless an end
    lies beyond that range by more than half its width (one wide interval must not squeeze the
    panel's other rows; it runs past the axis as an arrow, its ends printed). A panel with one
    row keeps its whole interval."""
    values = [0.0] + [v for c in cells for v in [*c["per_seed"], c["mean"]] if v is not None]
    low, high = min(values), max(values)
    allowance = 0.5 * max(high - low, 1e-9) if len(cells) > 1 else float("inf")
    ends = [v for c in cells for v in c.get("ci95") or []]
    low = min([low] + [v for v in ends if v >= low - allowance])
    high = max([high] + [v for v in ends if v <= high + allowance])
    span = max(high - low, 0.5 if len(cells) > 1 else 1e-9)
    return low - 0.06 * span, high + 0.06 * span


def _draw_cell(ax, y, cell, color, limits, faint=False):
    """Draw one cell at row ``y`` within ``limits`` (an interval running past them ends in an arrow)."""
    seeds = cell["per_seed"]
    lo_lim, hi_lim = limits
    alpha, size = (0.45, 4.5) if faint else (1.0, 6.5)
    if cell.get("ci95"):
        low, high = cell["ci95"]
        decides = corrected(cell)
        clear = decides[0] > 0 or decides[1] < 0
        if cell.get("family", 1) > 1:  # the corrected interval, thin, under the 95% one
            a, b = max(decides[0], lo_lim), min(decides[1], hi_lim)
            ax.plot([a, b], [y - 0.28, y - 0.28], color=color, lw=0.9, zorder=2, alpha=alpha)
        a, b = max(low, lo_lim), min(high, hi_lim)
        ax.plot([a, b], [y, y], color=color, lw=2.2, solid_capstyle="butt", zorder=2, alpha=alpha)
        for end, inside, marker in ((low, low >= lo_lim, "<"), (high, high <= hi_lim, ">")):
            if inside:
                ax.plot([end, end], [y - 0.18, y + 0.18], color=color, lw=1.5, zorder=2, alpha=alpha)
            else:
                ax.plot([lo_lim if marker == "<" else hi_lim], [y], marker, ms=7, color=color, zorder=3,
                        clip_on=False)
        ax.plot([cell["mean"]], [y], "D", ms=7, color=color if clear else "white", mec=color, mew=1.6, zorder=3)
        for mark, rerun in (("|", False), ("x", True)):
            values = [v for seed, v in zip(cell["seeds"], seeds) if (seed in cell.get("reruns", ())) == rerun]
            ax.plot(values, [y] * len(values), mark, ms=9 if mark == "|" else 5, color="0.35", zorder=4)
    else:
        if len(seeds) > 1:
            ax.plot([min(seeds), max(seeds)], [y, y], color=color, lw=0.8, ls=":", zorder=2, alpha=alpha)
        ax.plot(seeds, [y] * len(seeds), "o", ms=size, color="white", mec=color, mew=1.4 if faint else 1.6,
                zorder=3, alpha=alpha)


def plot_summary(rows, path):
    """Draw ``rows`` (``summary_rows``) into ``path`` (``draw_summary``)."""
    fig = draw_summary(rows)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)


def draw_summary(rows):
    """The figure of ``rows``: a block of axes per ``BLOCKS`` entry, each panel with a column of
    its values' numbers beside it (``fig.text_columns``: ``[(plot axes, text axes, [texts])]``)."""
    plt = pyplot()
    text_columns = []
    blocks = [(key, title, [r for r in rows if r["block"] == key]) for key, title in BLOCKS]
    blocks = [b for b in blocks if b[2]]
    heights = [len(group) + 1.1 for _, _, group in blocks]
    fig, axes = plt.subplots(len(blocks), 4, figsize=(18, 0.44 * sum(heights) + 1.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights, "hspace": 0.5, "wspace": 0.02,
                                          "width_ratios": [3.0, 2.0, 3.0, 2.0]})
    colors = ("#1f5fa8", "#c0561b")
    for g, (key, title, group) in enumerate(blocks):
        unit = "accuracy points" if key == "mlm" else "BLEU"
        faint = key == "sweep"
        for col in range(2):
            ax, text_ax = axes[g][2 * col], axes[g][2 * col + 1]
            cells = [r["cells"][col] for r in group if r["cells"][col]]
            if not cells:  # the study has no such backbone: one note instead of an empty panel
                ax.axis("off")
                text_ax.axis("off")
                ax.text(0.0, 0.5, f"{COMPARISONS[col][2]}: not run in this study",
                        transform=ax.transAxes, va="center", fontsize=9, color="0.5")
                continue
            limits = _limits([c for r in group for c in r["cells"] if c])  # one x-scale for the block's panels
            texts = []
            text_columns.append((ax, text_ax, texts))
            ax.axvline(0, color="black", lw=1)
            for i, row in enumerate(group):
                y = len(group) - i
                for a in (ax, text_ax):
                    if i % 2 == 0:
                        a.axhspan(y - 0.5, y + 0.5, color="0.94", zorder=0)
                cell = row["cells"][col]
                if cell is None:
                    empty = ("—" if row["kind"] == "ablation" or row.get("one_column")
                             else "not scored on this set" if row.get("variant") else "not run")
                    text_ax.text(0.02, y, empty, va="center", fontsize=8.5, color="0.55")
                    continue
                _draw_cell(ax, y, cell, "0.45" if faint else colors[col], limits, faint)
                texts.append(text_ax.text(0.02, y, cell_text(cell), va="center", fontsize=8.5, linespacing=1.0,
                                          color="0.45" if faint else "0.1", style="italic" if faint else "normal"))
            for a in (ax, text_ax):
                a.set_ylim(0.4, len(group) + 0.6)
                a.set_yticks(range(1, len(group) + 1))
                a.tick_params(axis="y", length=0)
            ax.set_xlim(*limits)
            ax.set_yticklabels([row_label(r) for r in reversed(group)] if col == 0 else [], fontsize=9,
                               color="0.45" if faint else "black")
            text_ax.set_yticklabels([])
            text_ax.set_xlim(0, 1)
            text_ax.set_xticks([])
            for side in ("top", "right", "bottom"):
                text_ax.spines[side].set_visible(False)
            ax.set_xlabel(f"{COMPARISONS[col][2]}, same seed ({unit})", fontsize=8.5)
            ax.grid(axis="x", color="0.85", lw=0.6)
            if g == 0:
                ax.set_title(COLUMN_TITLES[col], fontsize=11, fontweight="bold", loc="left", pad=20)
        axes[g][0].annotate(title, (0, 1), xycoords="axes fraction", xytext=(0, 4), textcoords="offset points",
                            fontsize=9.5, fontweight="bold", color="0.3", ha="left", va="bottom",
                            annotation_clip=False)
    fig.suptitle("Seed-paired differences, every study (results/*.json): ◆ mean with its 95% interval (filled: "
                 "excludes 0; one of several test sets or learning rates: its thin interval, corrected for their "
                 "number, does); | each "
                 "seed, × a seed trained again\nthat did not reproduce its committed run; ▶ the interval runs on, its "
                 "ends printed; ○ each seed where there are one or two; both panels of a block share one x-scale",
                 fontsize=10, y=1.005)
    fig.text_columns = text_columns
    return fig


def write_summary(folder, log=print):
    """``folder/summary.png`` from the study JSONs in ``folder``; returns its path (None: no study)."""
    rows = summary_rows(folder)
    if not rows:
        return None
    path = os.path.join(folder, "summary.png")
    plot_summary(rows, path)
    log(f"[rerender] {path}: {len(rows)} rows from the study JSONs in {folder}")
    return path
