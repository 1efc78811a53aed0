"""Depth stress test: narrow deep models (``L+L`` layers for each depth) where Post-LN is
known to struggle, every backbone incl. RealFormer's mean mode; each run's outcome is
judged against the best run of the same seed."""

import os
from dataclasses import replace

from realformer_nmt.errors import ConfigError

from .figures import COLORS, curve_with_band, pyplot
from .recipe import DEPTH_BACKBONES, corpus_info, test_references
from .report import SEED_PAIRED_NOTE, fmt, outcome_table, recipe_lines, spread_word, write_outputs
from .runs import check_backbones, join_notes, machine_description, parallel_note, recipe_record, train_all
from .stats import add_seed_paired, best_loss_per_seed, outcome_entry, outcome_rule, reference_record

DEPTH_REFERENCE = "the lowest best valid loss of all runs (every depth and backbone) of the same seed"


def depth_stress(data, out, recipe, depths=(6, 12), backbones=DEPTH_BACKBONES, seeds=(1, 2), margin=1.0,
                 residual_mode="sum", references=None, results_path=None, machine_note="", threads=None,
                 log=print, title=None, jobs=1):
    """Train every backbone at ``L+L`` layers for every L in ``depths`` (``recipe.layers`` is
    replaced, nothing else changes) and mark each run ``ok`` / ``lagging`` / ``diverged``
    (``stats.classify``), the reference being the lowest best valid loss among all runs
    (every depth and backbone) of the same seed. Every backbone of a depth gets its
    seed-paired BLEU differences to Post-LN and Pre-LN of that depth.
    """
    check_backbones(backbones)
    depths = sorted(set(int(d) for d in depths))
    if not depths or depths[0] < 1:
        raise ConfigError("--depths: give one or more layer counts >= 1")
    references = test_references(data, references)
    specs = [((depth, b, seed), b, seed, os.path.join(out, f"L{depth}", b, f"seed{seed}"),
              replace(recipe, layers=depth), None) for seed in seeds for depth in depths for b in backbones]
    runs = train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "depth-stress")
    reference = best_loss_per_seed(runs.values(), seeds)
    table = {}
    for depth in depths:
        table[str(depth)] = {}
        for b in backbones:
            rs = [runs[(depth, b, seed)] for seed in seeds]
            table[str(depth)][b] = outcome_entry(rs, b, residual_mode, reference, margin)
        add_seed_paired(table[str(depth)])
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    record = recipe_record(replace(recipe, layers=depths[0]), data, references, backbones, residual_mode, seeds)
    record["depths"] = depths
    record["note"] = (f"--encoder-layers and --decoder-layers are L for L in {depths}; shared_train_flags "
                      f"show L = {depths[0]}")
    summary = {
        "title": title or corpus_info(data)["title"],
        "depths": table,
        "backbones": list(backbones),
        "reference_loss_per_seed": reference_record(reference),
        "rule": outcome_rule(margin, DEPTH_REFERENCE),
        "reference": DEPTH_REFERENCE,
        "margin": margin,
        "recipe": record,
        "sacrebleu_signature": " / ".join(sorted(signatures)) or None,
        "machine": machine_description(join_notes(parallel_note(jobs, threads), machine_note)),
        "out": os.path.abspath(out),
    }
    results_path = results_path or os.path.join(out, "depth_stress.json")
    write_outputs(summary, results_path, depth_markdown, plot_depth)
    log(f"[depth-stress] wrote {results_path} (+ .md, .png)")
    return summary


def depth_markdown(summary):
    backbones = summary["backbones"]
    settings = summary["recipe"]["settings"]
    seeds = summary["recipe"]["seeds"]
    lines = [f"# {summary['title']}: depth stress test (narrow deep models)", "",
             f"`L+L` layers, d={settings['embed_dim']}, FFN {settings['ffn_dim']}, {settings['heads']} heads; "
             f"lr {settings['lr']:g}, {settings['warmup_updates']} warmup updates, {settings['max_update']} updates, "
             f"seeds {seeds}. Each row: outcome per seed; test BLEU (mean, {spread_word(len(seeds))}; per seed); "
             "seed-paired BLEU differences to Post-LN and Pre-LN of the same depth; best valid loss "
             "mean (per seed).", ""]
    for depth, row in summary["depths"].items():
        lines += [f"## {depth}+{depth} layers", ""] + outcome_table(row, backbones) + [""]
    lines += [SEED_PAIRED_NOTE + ".", "", f"Rule: {summary['rule']}. Reference (lowest best valid loss) per seed: "
              + ", ".join(f"seed {k}: {fmt(v, 3)}" for k, v in summary["reference_loss_per_seed"].items()) + ".",
              "", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        e = next(iter(summary["depths"].values()))[b]
        lines.append(f"- `{b}`: {e['description']}: `{' '.join(e['flags'])}`")
    lines += ["", f"Depths: {summary['recipe']['note']}."] + recipe_lines(summary)
    return "\n".join(lines)


def plot_depth(summary, path):
    """One panel per depth: validation loss against updates per backbone (mean, min-max band)."""
    plt = pyplot()
    depths = list(summary["depths"])
    fig, axes = plt.subplots(1, len(depths), figsize=(6 * len(depths), 4.5), squeeze=False, sharey=True)
    for ax, depth in zip(axes[0], depths):
        for b in summary["backbones"]:
            e = summary["depths"][depth][b]
            outcomes = "/".join(e["status_per_seed"])
            curve_with_band(ax, e, COLORS[b], f"{b}: {outcomes}, BLEU {fmt(e['bleu'])}")
        ax.set_title(f"{depth}+{depth} layers")
        ax.set_xlabel("updates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss (mean, min-max over seeds)")
    fig.suptitle(f"{summary['title']}: depth stress test")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
