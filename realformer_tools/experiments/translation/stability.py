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
from .intervals import corrected_interval
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
from .stats import (
    add_seed_paired,
    best_loss_per_seed,
    outcome_entry,
    outcome_rule,
    over_seeds,
    reference_record,
    seed_paired,
)

STABILITY_BACKBONES = ("postln", "realformer", "realformer_mean", "preln", "realformer_preln")
STABILITY_LRS = (1e-3, 5e-4, 2.5e-4)
STABILITY_REFERENCE = "the lowest best valid loss of the grid's finished runs (every lr and backbone) of the same seed"


def _in_cells(cell, cells):
    lr, b = cell
    return any(math.isclose(lr, c_lr) and b == c_b for c_lr, c_b in cells)


def run_dir(out, depth, lr, recipe_lr, backbone, seed):
    """Where one grid run lives: the depth test's folder at the recipe's own learning rate."""
    base = out if math.isclose(lr, recipe_lr) else os.path.join(out, f"lr{lr:g}")
    return os.path.join(base, f"L{depth}", backbone, f"seed{seed}")


def stability_limit(data, out, recipe, lrs=STABILITY_LRS, depth=12, backbones=STABILITY_BACKBONES, seeds=(1, 2),
                    margin=1.0, residual_mode="sum", references=None, results_path=None, machine_note="",
                    threads=None, log=print, title=None, jobs=1, report_only=False, cells=None):
    """Train every backbone at ``depth+depth`` layers at every learning rate in ``lrs``
    (``recipe.layers`` and the peak lr replaced, nothing else changes); write the backbone x
    lr grid (JSON, MD, PNG). Each cell keeps the depth test's per-backbone record
    (``bleu_per_seed``, ``status_per_seed``, ...) and the seed-paired BLEU differences to
    Post-LN and Pre-LN at the same learning rate. ``cells`` (``{(lr, backbone)}``, None: every
    cell): the cells that train at ``seeds``; every other cell of the grid is reported with the runs
    it has (finished or imported), and only the asked-for cells count as missing. Returns the
    summary dict."""
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
    asked = [spec for spec in specs if cells is None or _in_cells(spec[0][:2], cells)]
    runs = train_all(asked, data, references, recipe, residual_mode, threads, jobs, log, "stability", report_only)
    others = [spec for spec in specs if spec not in asked]
    if others:  # the grid's other cells: the runs they have, nothing trained and nothing missing
        found = train_all(others, data, references, recipe, residual_mode, threads, jobs, log, "stability", True)
        runs.update({k: r for k, r in found.items() if r is not None})
    runs = {spec[0]: runs[spec[0]] for spec in specs if spec[0] in runs}
    reference = best_loss_per_seed(runs.values(), seeds)
    grid = {}
    for lr in lrs:
        row = {}
        for b in backbones:
            rs = [runs[(lr, b, seed)] for seed in seeds if runs.get((lr, b, seed)) is not None]
            row[b] = outcome_entry(rs, b, residual_mode, reference, margin) if rs else None
        grid[f"{lr:g}"] = add_seed_paired(row)
    add_corrected(grid)
    signatures = {r["signature"] for r in runs.values() if r is not None and r["signature"]}
    record = recipe_record(deep, data, references, backbones, residual_mode, seeds)
    record["note"] = f"--encoder-layers and --decoder-layers are {depth}; `--lr` replaced per column by lrs"
    if cells is not None:
        record["cells"] = [{"lr": lr, "backbone": b} for lr, b in sorted(cells, key=lambda c: (-c[0], c[1]))]
    summary = {
        "title": title or corpus_info(data)["title"],
        "study": "stability_limit",
        "depth": depth,
        "lrs": lrs,
        "backbones": list(backbones),
        "grid": grid,
        "reference_loss_per_seed": reference_record(reference),
        "reference": STABILITY_REFERENCE,
        "rule": outcome_rule(margin, STABILITY_REFERENCE),
        "margin": margin,
        "best_rate": best_rates(grid),
        "progress": done_and_missing(runs, ("lr", "backbone", "seed")),
        "recipe": record,
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(join_notes(parallel_note(jobs, threads, report_only, list(runs.values())),
                                                  machine_note)),
        "out": os.path.abspath(out),
    }
    results_path = results_path or os.path.join(out, f"stability_depth{depth}.json")
    write_outputs(summary, results_path, stability_markdown, plot_stability)
    log(f"[stability] wrote {results_path} (+ .md, .png)")
    return summary


CORRECTION = ("Bonferroni over the learning rates of the grid: each rate's 95% interval widened to "
              "1 - 0.05 / rates (one comparison per rate and question)")


def add_corrected(grid):
    """Each seed-paired BLEU record of the grid with 3 or more seeds gets ``ci95_corrected``
    (its interval corrected for the number of learning rates tested, ``CORRECTION``) and
    ``corrected_for`` (that number): the grid asks each question once per rate."""
    rates = len(grid)
    for row in grid.values():
        for e in row.values():
            for key in ("seed_paired_vs_postln", "seed_paired_vs_preln"):
                record = (e or {}).get(key)
                interval = corrected_interval(record, rates) if record else None
                if interval is not None:
                    record.update(ci95_corrected=[round(v, 2) for v in interval], corrected_for=rates)


# the best-rate comparisons: a backbone at its best rate against another at its own
BEST_RATE_PAIRS = (("realformer", "preln"), ("realformer", "postln"))
BEST_RATE_RULE = ("each backbone's best rate is the one with the lowest mean best valid loss over the seeds it ran "
                  "at every rate of the grid (the selection seeds), never test BLEU; the difference is seed-paired "
                  "test BLEU, over every seed both ran at those rates and over the seeds not used to choose")


def best_rates(grid):
    """``{"rule", "backbones": {b: {"lr", "selection_seeds", "valid_loss_by_lr"}}, "pairs": [...]}``:
    each backbone's best learning rate chosen by validation loss (``BEST_RATE_RULE``), and the
    ``BEST_RATE_PAIRS`` at those rates: seed-paired test BLEU over all their common seeds
    (``seed_paired``) and over the common seeds outside the selection (``seed_paired_unselected``)."""
    chosen = {}
    backbones = {b for row in grid.values() for b, e in row.items() if e}
    for b in sorted(backbones):
        entries = {lr: row.get(b) for lr, row in grid.items()}
        if not all(entries.values()):
            continue
        by_seed = {lr: dict(zip(e["seeds"], e["valid_loss_per_seed"])) for lr, e in entries.items()}
        seeds = [s for s in next(iter(entries.values()))["seeds"]
                 if all(losses.get(s) is not None for losses in by_seed.values())]
        if not seeds:
            continue
        losses = {lr: round(sum(by_seed[lr][s] for s in seeds) / len(seeds), 4) for lr in entries}
        best = min(losses, key=losses.get)
        chosen[b] = {"lr": float(best), "selection_seeds": seeds, "valid_loss_by_lr": losses}
    pairs = []
    for b, ref in BEST_RATE_PAIRS:
        if b not in chosen or ref not in chosen:
            continue
        e, r = grid[f"{chosen[b]['lr']:g}"][b], grid[f"{chosen[ref]['lr']:g}"][ref]
        paired = seed_paired(e["bleu_per_seed"], r["bleu_per_seed"], e["seeds"], r["seeds"])
        selection = set(chosen[b]["selection_seeds"]) | set(chosen[ref]["selection_seeds"])
        keep = [i for i, s in enumerate(paired["seeds"]) if s not in selection]
        unselected = over_seeds([paired["seeds"][i] for i in keep], [paired["per_seed"][i] for i in keep])
        pairs.append({"backbone": b, "reference": ref, "lr": chosen[b]["lr"], "reference_lr": chosen[ref]["lr"],
                      "seed_paired": paired, "seed_paired_unselected": unselected})
    return {"rule": BEST_RATE_RULE, "backbones": chosen, "pairs": pairs}


def _counts(statuses):
    """``10 ok`` / ``2 ok, 1 lagging``: a cell's outcomes counted, in the vocabulary's order."""
    return ", ".join(f"{statuses.count(o)} {o}" for o in ("ok", "lagging", "diverged") if o in statuses)


def _grid_cell(e):
    if e is None:
        return "not run"
    bleus = " / ".join(fmt(x) for x in e["bleu_per_seed"])
    statuses = e["status_per_seed"]
    diverged = statuses.count("diverged")
    outcomes = ", ".join(statuses) if len(statuses) <= 3 else _counts(statuses)
    return f"{outcomes} ({diverged} of {len(statuses)} diverged); BLEU {bleus}"


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
    lines = ["Seed-paired test BLEU differences at each learning rate (bold: the interval corrected for the "
             f"{len(lrs)} rates tested excludes zero):", "",
             "| difference | " + " | ".join(f"lr {lr}" for lr in lrs) + " |", "| --- |" + " --- |" * len(lrs)]
    for b, key, label in rows:
        lines.append(f"| {label} | " + " | ".join(seed_paired_cell(summary["grid"][lr].get(b), key)
                                                    for lr in lrs) + " |")
    return lines + [""]


def _interval_text(p):
    if not p or not p.get("per_seed"):
        return "no common seed"
    if not p.get("ci95"):
        return " / ".join(f"{v:+.2f}" for v in p["per_seed"]) + f" (seeds {p['seeds']})"
    return (f"{p['mean']:+.2f} ± {p['sd']:.2f} over {len(p['per_seed'])} seeds (95% CI {p['ci95'][0]:+.2f} to "
            f"{p['ci95'][1]:+.2f})")


def best_rate_lines(summary):
    """The best-rate comparisons (``best_rates``) as Markdown (none: no lines)."""
    best = summary.get("best_rate") or {}
    if not best.get("pairs"):
        return []
    lines = ["## Each backbone at its best learning rate", "", f"Rule: {best['rule']}.", "",
             "| backbone | best rate | selection seeds | mean best valid loss per rate |", "| --- | --- | --- | --- |"]
    for b, c in best["backbones"].items():
        losses = ", ".join(f"{lr}: {fmt(v, 3)}" for lr, v in c["valid_loss_by_lr"].items())
        lines.append(f"| {b} | {c['lr']:g} | {', '.join(map(str, c['selection_seeds']))} | {losses} |")
    lines += ["", "| difference (seed-paired test BLEU) | every common seed | the seeds not used to choose |",
              "| --- | --- | --- |"]
    for p in best["pairs"]:
        lines.append(f"| {p['backbone']} at {p['lr']:g} minus {p['reference']} at {p['reference_lr']:g} | "
                     f"{_interval_text(p['seed_paired'])} | {_interval_text(p['seed_paired_unselected'])} |")
    return lines + [""]


def _minutes(seconds_list):
    return ", ".join("n/a" if s is None else f"{s / 60:.0f}" for s in seconds_list)


def wall_time_lines(summary):
    """Every run's wall time (minutes, all attempts), and which runs were stopped and resumed from
    their checkpoint or started again from update 0."""
    lines = ["## Wall time of every run, and resumes", "",
             "Wall time over all of a run's fairseq-train attempts (minutes; from the first start to the last "
             "end, less the time between an attempt that was killed and the next). Resumed: the run was "
             "stopped and continued from its checkpoint_last.pt (fairseq's log says `Loaded checkpoint`); "
             "restarted: stopped before its first checkpoint and trained again from update 0, so the run is "
             "one uninterrupted training; not recorded: runs trained before the results recorded attempts.", "",
             "| lr | backbone | seeds | wall time per seed (min) | resumed | restarted from update 0 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for lr in [f"{lr:g}" for lr in summary["lrs"]]:
        for b in summary["backbones"]:
            e = summary["grid"][lr].get(b)
            if e is None:
                continue
            n = len(e["seeds"])
            attempts = e.get("attempts_per_seed") or [None] * n
            resumes = e.get("resumes_per_seed") or [None] * n
            unknown = [s for s, a in zip(e["seeds"], attempts) if a is None]
            cells = []
            for rule in (lambda a, r: r is not None and r > 0, lambda a, r: a > 1 and r == 0):
                hit = [s for s, a, r in zip(e["seeds"], attempts, resumes) if a is not None and rule(a, r)]
                words = ([f"seeds {hit}" if hit else "none"] if len(unknown) < n else [])
                if unknown:
                    words.append(f"not recorded for seeds {unknown}" if words else "not recorded")
                cells.append("; ".join(words))
            lines.append(f"| {lr} | {b} | {', '.join(map(str, e['seeds']))} | {_minutes(e['train_seconds_per_seed'])} "
                         f"| {cells[0]} | {cells[1]} |")
    return lines + [""]


def _seeds_line(summary):
    """``seeds [1, 2, 3]``, or with ``--cells`` which cells have which seeds."""
    seeds, cells = summary["recipe"]["seeds"], summary["recipe"].get("cells")
    if not cells:
        return f"seeds {seeds}"
    named = ", ".join(f"{c['backbone']} at {c['lr']:g}" for c in cells)
    counts = sorted({len(e["seeds"]) for row in summary["grid"].values() for e in row.values() if e})
    return (f"seeds {seeds} asked for in {len(cells)} cells ({named}), the other cells with the seeds they were run "
            f"with (a cell's seeds: {', '.join(map(str, counts))}; each cell lists its own)")


def stability_markdown(summary):
    backbones, depth = summary["backbones"], summary["depth"]
    settings = summary["recipe"]["settings"]
    lrs = [f"{lr:g}" for lr in summary["lrs"]]
    lines = [f"# {summary['title']}: learning-rate limit at {depth}+{depth} layers", ""] + not_run_lines(summary) + [
             f"The depth stress recipe ({depth}+{depth} layers, d={settings['embed_dim']}, FFN {settings['ffn_dim']}, "
             f"{settings['heads']} heads, {settings['warmup_updates']} warmup updates, {settings['max_update']} "
             f"updates) at each peak learning rate; {_seeds_line(summary)}. Grid cell: outcome per "
             "seed; test BLEU per seed.", "",
             "| backbone | " + " | ".join(f"lr {lr}" for lr in lrs) + " |", "| --- |" + " --- |" * len(lrs)]
    for b in backbones:
        lines.append(f"| {b} | " + " | ".join(_grid_cell(summary["grid"][lr].get(b)) for lr in lrs) + " |")
    lines.append("")
    lines += difference_lines(summary) + best_rate_lines(summary)
    for lr in lrs:
        lines += [f"## lr {lr}", ""] + outcome_table(summary["grid"][lr], backbones) + [""]
    lines += wall_time_lines(summary)
    lines += [SEED_PAIRED_NOTE + f" (same learning rate) once corrected for the {len(lrs)} rates tested "
              f"({CORRECTION}).", "",
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
            curve_with_band(ax, e, COLORS[b], f"{b}, {_counts(e['status_per_seed'])} (n={len(e['seeds'])}), "
                                              f"BLEU {fmt(e['bleu'])}")
        ax.set_title(f"lr {lr}")
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        if not any(summary["grid"][lr].get(b) for b in summary["backbones"]):
            ax.text(0.5, 0.5, "no run has finished yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            continue
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss (label-smoothed cross-entropy, bits per token)")
    fig.suptitle(f"{summary['title']}: learning-rate limit at {summary['depth']}+{summary['depth']} layers. Lines: "
                 "mean over a cell's seeds; band: lowest to highest seed (n per cell in its legend)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
