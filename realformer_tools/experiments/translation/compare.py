"""The main comparison: every backbone for every seed with the same fairseq-train flags
(only the backbone flags differ); each best checkpoint decoded on ``test`` with beam
search, scored with sacreBLEU against the raw references and tested against Post-LN (and
Pre-LN) on the same sentences (sacreBLEU's paired bootstrap, per seed); writes
``<name>.json``, ``<name>.md``, ``<name>.png`` and ``<name>_hyps/``."""

import os

from realformer_nmt.errors import ConfigError

from .. import fairseq_runs
from .figures import COLORS, pyplot
from .recipe import BACKBONES, MAIN_ORDER, corpus_info, test_references
from .report import (
    SEED_PAIRED_NOTE,
    bleu_cell,
    fmt,
    paired_cell,
    recipe_lines,
    seconds,
    seed_paired_cell,
    spread,
    write_outputs,
)
from .runs import (
    check_backbones,
    done_and_missing,
    join_notes,
    machine_description,
    parallel_note,
    read_lines,
    recipe_record,
    save_hypotheses,
    train_all,
)
from .stats import PAIRED_TEST_NOTE, add_seed_paired, paired_vs, summarize_backbone


def compare(data, out, recipe, backbones=BACKBONES, seeds=(1,), residual_mode="sum", references=None,
            results_path=None, machine_note="", threads=None, log=print, title=None, jobs=1,
            bootstrap_samples=1000, report_only=False):
    """Train, decode and score every backbone for every seed; write JSON, MD and PNG.

    ``results_path`` is the path of the JSON file (default ``out/comparison.json``); the
    table and the plot go next to it with ``.md`` and ``.png``, and the hypotheses of every
    run in ``<stem>_hyps/``. With ``postln`` among the backbones, every other backbone gets
    ``paired_vs_postln`` (sacreBLEU's paired bootstrap test against Post-LN of the same
    seed) and ``seed_paired_vs_postln`` (the BLEU differences seed by seed); with ``preln``,
    ``seed_paired_vs_preln`` (and ``paired_vs_preln`` for ``realformer_preln``).
    ``report_only`` trains nothing and reports the runs finished so far (``runs`` in the
    JSON lists the done and the missing ones). Returns the summary dict.
    """
    check_backbones(backbones)
    references = test_references(data, references)
    # seeds outermost: an early stop still leaves comparable backbones
    specs = [((b, seed), b, seed, os.path.join(out, b, f"seed{seed}"), None, None)
             for seed in seeds for b in backbones]
    runs = train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "compare", report_only)
    results = {b: [runs[(b, seed)] for seed in seeds if runs[(b, seed)] is not None] for b in backbones}
    results = {b: rs for b, rs in results.items() if rs}
    if not results:
        raise ConfigError(f"--report-only: no run has finished in {out} yet")
    summary = {b: summarize_backbone(rs, b, residual_mode) for b, rs in results.items()}
    refs = read_lines(references)
    for reference in ("postln", "preln"):
        if reference not in results:
            continue
        for b in results:
            if b != reference and (reference == "postln" or b == "realformer_preln"):
                summary[b][f"paired_vs_{reference}"] = paired_vs(results[reference], results[b], refs,
                                                                 bootstrap_samples)
    add_seed_paired(summary)
    signatures = {r["signature"] for rs in results.values() for r in rs if r["signature"]}
    summary.update(
        title=title or corpus_info(data)["title"],
        recipe=recipe_record(recipe, data, references, backbones, residual_mode, seeds),
        progress=done_and_missing({k: runs[k] for k in sorted(runs, key=lambda k: (backbones.index(k[0]), k[1]))},
                              ("backbone", "seed")),
        sacrebleu_signature=" / ".join(sorted(signatures)) or None,
        paired_test=PAIRED_TEST_NOTE.format(samples=bootstrap_samples),
        machine=machine_description(join_notes(parallel_note(jobs, threads), machine_note)),
        out=os.path.abspath(out),
    )
    results_path = results_path or os.path.join(out, "comparison.json")
    save_hypotheses([r for rs in results.values() for r in rs], os.path.splitext(results_path)[0] + "_hyps")
    write_outputs(summary, results_path, comparison_markdown, plot_comparison)
    log(f"[compare] wrote {results_path} (+ .md, .png, _hyps/)")
    return summary


def not_run_lines(summary):
    """The Markdown note listing the runs a partial report leaves out (none: no lines)."""
    missing = (summary.get("progress") or {}).get("missing") or []
    if not missing:
        return []
    names = ", ".join(" ".join(f"{k} {v:g}" if k == "lr" else f"{v}" if k == "backbone" else f"{k} {v}"
                               for k, v in m.items()) for m in missing)
    return [f"**Partial results**: {len(missing)} of {len(missing) + len(summary['progress']['done'])} runs not run "
            f"or not finished yet, left out of every number here: {names}.", ""]


def seeds_phrase(n_seeds, seeds, equal=True):
    """How a table's spread over seeds is given (``equal``: every backbone has the same seeds)."""
    if not equal:
        return ("mean ± standard deviation over each backbone's finished seeds (listed per seed); a "
                "seed-paired difference uses the seeds both backbones have.")
    if n_seeds == 1:
        return "**one seed**, so differences of a few tenths are within seed noise."
    if n_seeds == 2:
        return f"mean and range over 2 seeds (seeds {seeds})."
    return f"mean ± standard deviation over {n_seeds} seeds (seeds {seeds})."


def seed_paired_columns(entries):
    """The seed-paired reference columns a table has: ``[(key, header)]``."""
    return [(f"seed_paired_vs_{ref}", f"vs {name}, seed-paired ΔBLEU")
            for ref, name in (("postln", "Post-LN"), ("preln", "Pre-LN"))
            if any(e and e.get(f"seed_paired_vs_{ref}") for e in entries)]


def comparison_markdown(summary):
    backbones = [b for b in MAIN_ORDER if b in summary]
    n_seeds = max(len(summary[b]["seeds"]) for b in backbones)
    seeds = max((summary[b]["seeds"] for b in backbones), key=len)
    settings = summary["recipe"]["settings"]
    paired = any(summary[b].get("paired_vs_postln") for b in backbones)
    paired_pre = any(summary[b].get("paired_vs_preln") for b in backbones)
    seed_paired = seed_paired_columns([summary[b] for b in backbones])
    lines = [f"# {summary['title']}: Post-LN vs Pre-LN vs RealFormer", ""] + not_run_lines(summary) + [
             f"Test BLEU ({fairseq_runs.BLEU_LABELS[summary['recipe'].get('corpus', {}).get('bleu', 'sacrebleu')]}) "
             "of the best checkpoint by "
             f"{'validation BLEU' if settings['select_by_bleu'] else 'validation loss'}, beam {settings['beam']}; "
             + seeds_phrase(n_seeds, seeds, equal=len({len(summary[b]["seeds"]) for b in backbones}) == 1), "",
             "| backbone | test BLEU | BLEU per seed | best valid loss (mean) | valid loss per seed | "
             + "".join(f"{header} | " for _, header in seed_paired)
             + ("vs Post-LN per seed: ΔBLEU (paired bootstrap p) | " if paired else "")
             + ("vs Pre-LN per seed: ΔBLEU (paired bootstrap p) | " if paired_pre else "")
             + "updates | train time per seed |",
             "| --- | --- | --- | --- | --- | " + "--- | " * len(seed_paired) + ("--- | " if paired else "")
             + ("--- | " if paired_pre else "") + "--- | --- |"]
    for b in backbones:
        s = summary[b]
        lines.append(
            f"| {b} | {bleu_cell(s)} | {', '.join(fmt(x) for x in s['bleu_per_seed'])} "
            f"| {fmt(s['valid_loss'], 3)} | {', '.join(fmt(x, 3) for x in s['valid_loss_per_seed'])} | "
            + "".join(f"{seed_paired_cell(s, key)} | " for key, _ in seed_paired)
            + (f"{paired_cell(s)} | " if paired else "")
            + (f"{paired_cell(s, 'paired_vs_preln')} | " if paired_pre else "")
            + f"{s['updates']} | {', '.join(seconds(t) for t in s['train_seconds_per_seed'])} |")
    if seed_paired:
        lines += ["", SEED_PAIRED_NOTE + "."]
    lines += ["", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        lines.append(f"- `{b}`: {summary[b]['description']}: `{' '.join(summary[b]['flags'])}`")
    lines += recipe_lines(summary)
    return "\n".join(lines)


def plot_comparison(summary, path):
    """Validation loss against updates, one line per backbone (mean, min-max band over seeds);
    the right panel zooms on the second half of training, where the backbones separate."""
    plt = pyplot()
    backbones = [b for b in MAIN_ORDER if b in summary]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    last = max([u for b in backbones for u, _ in summary[b]["curve"]] or [0])
    for zoom, ax in enumerate(axes):
        for b in backbones:
            s = summary[b]
            keep = [i for i, (u, _) in enumerate(s["curve"]) if not zoom or u >= last / 2]
            if not keep:
                continue
            xs, ys = [s["curve"][i][0] for i in keep], [s["curve"][i][1] for i in keep]
            label = f"{b} (test BLEU {spread(s['bleu'], s['bleu_std'], s['bleu_per_seed'])})"
            ax.plot(xs, ys, marker="o", markersize=3, color=COLORS[b], label=label)
            if len(s["seeds"]) > 1:
                band = [s["curve_min_max"][i] for i in keep]
                ax.fill_between([u for u, _, _ in band], [lo for _, lo, _ in band], [hi for _, _, hi in band],
                                color=COLORS[b], alpha=0.2)
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
