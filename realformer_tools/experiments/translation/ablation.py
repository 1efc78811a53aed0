"""Which residual path matters: RealFormer with residual attention on the encoder, decoder
or cross path alone, on all three, and Post-LN, one recipe."""

import os

from .figures import COLORS, curve_with_band, pyplot
from .recipe import ABLATION, corpus_info, test_references
from .report import (
    SEED_PAIRED_NOTE,
    bleu_cell,
    fmt,
    paired_cell,
    recipe_lines,
    seed_paired_cell,
    spread_word,
    write_outputs,
)
from .runs import join_notes, machine_description, parallel_note, read_lines, recipe_record, save_hypotheses, train_all
from .stats import PAIRED_TEST_NOTE, add_seed_paired, paired_vs, summarize_backbone


def path_ablation(data, out, recipe, seeds=(1, 2), residual_mode="sum", references=None, results_path=None,
                  machine_note="", threads=None, log=print, title=None, jobs=1,
                  bootstrap_samples=1000):
    """Which residual path matters: RealFormer with residual attention on one path alone
    (``encoder``, ``decoder``, ``cross``), on all three (``all``) and Post-LN (``postln``,
    paths ``none`` being fairseq's ``transformer``), one recipe.

    The runs share ``out`` with the main comparison: ``all`` and ``postln`` are its
    ``realformer`` and ``postln`` runs, reused when the recipe is the same. Each setting but
    Post-LN gets ``paired_vs_postln`` per seed and ``seed_paired_vs_postln``.
    """
    references = test_references(data, references)
    specs = [((key, seed), backbone, seed, os.path.join(out, backbone, f"seed{seed}"), None, None)
             for seed in seeds for key, backbone in ABLATION.items()]
    runs = train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "path-ablation")
    refs = read_lines(references)
    summary = {}
    for key, backbone in ABLATION.items():
        rs = [runs[(key, seed)] for seed in seeds]
        entry = summarize_backbone(rs, backbone, residual_mode)
        entry["backbone"] = backbone
        if key != "postln":
            entry["paired_vs_postln"] = paired_vs([runs[("postln", seed)] for seed in seeds], rs, refs,
                                                  bootstrap_samples)
        summary[key] = entry
    add_seed_paired({k: summary[k] for k in ABLATION}, backbone_of=ABLATION.get)
    signatures = {r["signature"] for r in runs.values() if r["signature"]}
    summary.update(
        title=title or corpus_info(data)["title"],
        recipe=recipe_record(recipe, data, references, list(ABLATION.values()), residual_mode, seeds),
        sacrebleu_signature=" / ".join(sorted(signatures)) or None,
        paired_test=PAIRED_TEST_NOTE.format(samples=bootstrap_samples),
        machine=machine_description(join_notes(parallel_note(jobs, threads), machine_note)),
        out=os.path.abspath(out),
    )
    results_path = results_path or os.path.join(out, "path_ablation.json")
    save_hypotheses([runs[(key, seed)] for key in ("encoder", "decoder", "cross") for seed in seeds],
                    os.path.splitext(results_path)[0] + "_hyps")
    write_outputs(summary, results_path, ablation_markdown, plot_ablation)
    log(f"[path-ablation] wrote {results_path} (+ .md, .png, _hyps/)")
    return summary


def ablation_markdown(summary):
    keys = [k for k in ABLATION if k in summary]
    n_seeds = len(summary[keys[0]]["seeds"])
    lines = [f"# {summary['title']}: which residual path matters", "",
             f"RealFormer with residual attention on one path, on all three, and Post-LN (paths `none`); "
             f"one recipe, seeds {summary[keys[0]]['seeds']}. Test BLEU mean ({spread_word(n_seeds)} over seeds).", "",
             "| paths | backbone | test BLEU | BLEU per seed | best valid loss (mean) | valid loss per seed "
             "| vs Post-LN, seed-paired ΔBLEU | vs Post-LN per seed: ΔBLEU (paired bootstrap p) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in keys:
        s = summary[k]
        lines.append(f"| {k} | `{s['backbone']}` | {bleu_cell(s)} "
                     f"| {', '.join(fmt(x) for x in s['bleu_per_seed'])} | {fmt(s['valid_loss'], 3)} "
                     f"| {', '.join(fmt(x, 3) for x in s['valid_loss_per_seed'])} | {seed_paired_cell(s)} "
                     f"| {paired_cell(s)} |")
    lines += ["", SEED_PAIRED_NOTE + ".", "", "Flags of each setting (the only ones that differ):", ""]
    for k in keys:
        lines.append(f"- `{k}`: `{' '.join(summary[k]['flags'])}`")
    lines += recipe_lines(summary)
    return "\n".join(lines)


def plot_ablation(summary, path):
    """Test BLEU per path setting (mean, ± sd or the range of two seeds, seeds as dots) and validation loss curves."""
    plt = pyplot()
    keys = [k for k in ABLATION if k in summary]
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, k in enumerate(keys):
        s = summary[k]
        color = COLORS[s["backbone"]]
        seeds = [b for b in s["bleu_per_seed"] if b is not None]
        # ± sd with 3 or more seeds, the range of two
        err = (s["bleu_std"] or 0) if len(seeds) > 2 else [[s["bleu"] - min(seeds)], [max(seeds) - s["bleu"]]] \
            if len(seeds) == 2 else 0
        bars.bar(i, s["bleu"] or 0, yerr=err, color=color, alpha=0.6, capsize=4)
        bars.scatter([i] * len(seeds), seeds, color="black", s=12, zorder=3)
        curve_with_band(curves, s, color, k)
    bars.set_xticks(range(len(keys)), keys)
    finite = [b for k in keys for b in summary[k]["bleu_per_seed"] if b is not None]
    if finite:
        bars.set_ylim(min(finite) - 2, max(finite) + 1)
    bars.set_ylabel(f"test BLEU (mean, {spread_word(len(summary[keys[0]]['seeds']))}; dots: seeds)")
    bars.grid(alpha=0.3, axis="y")
    curves.set_xlabel("updates")
    curves.set_ylabel("validation loss")
    curves.grid(alpha=0.3)
    curves.legend()
    fig.suptitle(f"{summary['title']}: residual attention on one path vs all vs none")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
