"""The main comparison's figure (``<name>.png``): validation loss minus the reference's on the
same seed, each backbone's curve over the seeds the drawn backbones share, and the seed-paired
BLEU differences per test set (``plot_comparison``)."""

import statistics

from .figures import COLORS, curve_over_seeds, paired_curves, pyplot
from .intervals import one_of_sets, rerun_seeds
from .recipe import MAIN_ORDER
from .report import spread, test_set_names

NAMES = {"postln": "Post-LN", "preln": "Pre-LN"}

QUESTIONS = (("realformer", "postln"), ("realformer_preln", "preln"), ("preln_vr", "preln"),
             ("realformer_preln_vr", "preln"))  # what a comparison answers (where the backbones ran)
LATER = ("preln_vr", "realformer_preln_vr")  # the value residual study's, added to the comparison later
PAIRED_CURVES = (("realformer", "postln"), ("preln", "postln"), ("realformer_preln", "preln"), ("preln_vr", "preln"),
                 ("realformer_preln_vr", "preln"))


def plot_comparison(summary, path):
    """Left: the validation loss minus the reference's on the same seed at every validation
    (RealFormer and Pre-LN minus Post-LN, RealFormer on Pre-LN minus Pre-LN; the mean, and
    the smallest to largest seed's difference), where the backbones' own curves lie on top
    of each other. Middle: the second half of training, each backbone's curve over the seeds
    every backbone drawn has, so that every band (min-max) covers as many seeds (a later
    study's backbone waits until it has those seeds: ``middle_panel_backbones``). With several test
    sets, right: RealFormer minus Post-LN and RealFormer on Pre-LN minus Pre-LN, same seed, on
    each test set and their mean (``plot_test_sets``)."""
    plt = pyplot()
    backbones = [b for b in MAIN_ORDER if b in summary]
    names = test_set_names(summary, backbones)
    questions = [(b, ref) for b, ref in QUESTIONS if b in summary
                 and (summary[b].get(f"seed_paired_vs_{ref}_by_test_set") or {})]
    sets_panel = len(names) > 1 and bool(questions)
    fig, axes = plt.subplots(1, 3 if sets_panel else 2, figsize=(18 if sets_panel else 12, 4.5))
    ax = axes[0]
    for b, ref in PAIRED_CURVES:
        if b not in summary or ref not in summary:
            continue
        points = paired_curves(summary[b], summary[ref])
        seeds = [seed for seed in summary[b]["seeds"] if seed in summary[ref]["seeds"]]
        if not points:
            continue
        xs = [u for u, _, _, _ in points]
        ax.plot(xs, [m for _, m, _, _ in points], marker="o", markersize=3, color=COLORS[b],
                label=f"{b} − {NAMES[ref]} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
        if len(seeds) > 1:
            ax.fill_between(xs, [lo for _, _, lo, _ in points], [hi for _, _, _, hi in points], color=COLORS[b],
                            alpha=0.15)
    ax.axhline(0, color="black", lw=1)
    ax.set_xlabel("updates")
    ax.set_ylabel("Δ validation loss, same seed")
    ax.set_title("validation loss minus the reference's, same seed\n(mean; band: smallest to largest seed)",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    drawn, shared, waiting = middle_panel_backbones(summary, backbones)
    last = max([u for b in drawn for u, _ in summary[b]["curve"]] or [0])
    ax = axes[1]
    for b in waiting:
        had = summary[b]["seeds"]
        ax.plot([], [], color=COLORS[b], label=f"{b}: seed{'s' if len(had) > 1 else ''} {_seed_range(had)} so far, "
                                               f"not drawn until it has seeds {_seed_range(shared)}")
    for b in drawn:
        s = summary[b]
        points = [p for p in curve_over_seeds(s, shared) if p[0] >= last / 2]
        bleus = [v for seed, v in zip(s["seeds"], s["bleu_per_seed"]) if seed in shared and v is not None]
        mean = statistics.mean(bleus) if bleus else None
        label = (f"{b} (test BLEU {spread(mean, statistics.stdev(bleus) if len(bleus) > 2 else None, bleus)} "
                 f"over the same {len(bleus)} seed{'s' if len(bleus) > 1 else ''})")
        if not points:
            ax.plot([], [], color=COLORS[b], label=label + ": no finite valid loss")
            continue
        xs = [u for u, _, _, _ in points]
        ax.plot(xs, [m for _, m, _, _ in points], marker="o", markersize=3, color=COLORS[b], label=label)
        if len(shared) > 1:
            ax.fill_between(xs, [lo for _, _, lo, _ in points], [hi for _, _, _, hi in points], color=COLORS[b],
                            alpha=0.15)
    ax.set_xlabel("updates")
    ax.set_ylabel("validation loss (label-smoothed, base 2)")
    ax.grid(alpha=0.3)
    ax.set_title(f"second half, seeds {_seed_range(shared)} (the seeds every backbone drawn has)"
                 + ("\n(mean, min-max over those seeds)" if len(shared) > 1 else ""), fontsize=10)
    ax.legend(fontsize=8)
    if sets_panel:
        plot_test_sets(axes[2], summary, names, questions)
    fig.suptitle(f"{summary['title']}: Post-LN vs Pre-LN vs RealFormer"
                 + (" vs value residual" if any(b in summary for b in LATER) else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def middle_panel_backbones(summary, backbones):
    """``(drawn, shared, waiting)``: the backbones the middle panel draws, the seeds every one of
    them has, and the backbones of a later study (:data:`LATER`) left out while they lack one of
    the seeds the others share. Without the rule, a later study's first seeds would shrink every
    backbone's curve to those seeds; a later backbone joins once it has caught up."""
    def common(names):
        return [seed for seed in summary[names[0]]["seeds"] if all(seed in summary[b]["seeds"] for b in names)]
    first = [b for b in backbones if b not in LATER] or backbones
    shared = common(first)
    waiting = [b for b in backbones if b not in first and not set(shared) <= set(summary[b]["seeds"])]
    drawn = [b for b in backbones if b not in waiting]
    return drawn, common(drawn), waiting


def _seeds(record):
    n = len(record["per_seed"])
    return f"{n} seed{'s' if n > 1 else ''}"


def _seed_range(seeds):
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)) \
        else ", ".join(map(str, seeds))


def plot_test_sets(ax, summary, names, questions):
    """Seed-paired BLEU differences per test set and over the sets: dots each seed (crosses:
    seeds whose run was trained again and did not reproduce its committed run), a diamond the
    mean with its 95% interval, and, per set, the thin interval corrected for the number of
    sets (Bonferroni); the diamond is filled where the corrected interval excludes zero."""
    columns = names + ["mean of the sets"]
    width = 0.8 / len(questions)
    for q, (b, ref) in enumerate(questions):
        by_set = dict(summary[b].get(f"seed_paired_vs_{ref}_by_test_set") or {})
        family = len(by_set)
        by_set["mean of the sets"] = summary[b].get(f"seed_paired_vs_{ref}_over_test_sets")
        reruns = rerun_seeds(summary, (b, ref))
        color = COLORS[b]
        for i, name in enumerate(columns):
            record = by_set.get(name)
            if not record or not record["per_seed"]:
                continue
            x = i + (q - (len(questions) - 1) / 2) * width
            for mark, keep in (("o", False), ("x", True)):
                values = [v for seed, v in zip(record["seeds"], record["per_seed"]) if (seed in reruns) == keep]
                ax.plot([x] * len(values), values, mark, ms=3.5, color=color, alpha=0.5)
            # the correction that decides: the record's own family (the value residual pairs: 15 per set,
            # 5 over the sets) where it carries one, else the number of test sets for one of several sets
            record = one_of_sets(record, family if name != "mean of the sets" else 1)
            corrected = record.get("ci95_corrected") or record.get("ci95")
            if record.get("ci95"):
                ax.plot([x, x], record["ci95"], color=color, lw=2.5)
            if record.get("ci95_corrected"):
                ax.plot([x + 0.06, x + 0.06], corrected, color=color, lw=0.9)
            clear = bool(corrected) and (corrected[0] > 0 or corrected[1] < 0)
            ax.plot([x], [record["mean"]], "D", ms=7, mec=color, mew=1.5, color=color if clear else "white",
                    label=f"{b} − {NAMES[ref]} ({_seeds(record)})" if i == 0 else None)
    ax.axhline(0, color="black", lw=1)
    ax.set_xticks(range(len(columns)))
    ax.set_xticklabels([n.replace("test_", "").replace("_", " ") for n in columns], fontsize=9)
    ax.set_ylabel("ΔBLEU, same seed")
    families = sorted({r["corrected_for"] for b, ref in questions
                       for r in [summary[b].get(f"seed_paired_vs_{ref}_over_test_sets"),
                                 *(summary[b].get(f"seed_paired_vs_{ref}_by_test_set") or {}).values()]
                       if r and r.get("corrected_for")})
    family_note = (f"; value residual pairs: for their family ({' and '.join(map(str, families))})"
                   if families else "")
    ax.set_title(f"ΔBLEU per test set, same seed: ◆ mean, thick 95% interval, thin corrected for {len(names)} sets"
                 f"{family_note}\n(filled: the corrected one excludes 0); dots: seeds, x: rerun seeds", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
