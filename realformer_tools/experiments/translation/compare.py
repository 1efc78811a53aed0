"""The main comparison: every backbone for every seed with the same fairseq-train flags
(only the backbone flags differ); each best checkpoint decoded on ``test`` with beam
search, scored with sacreBLEU against the raw references and tested against Post-LN (and
Pre-LN) on the same sentences (sacreBLEU's paired bootstrap, per seed); writes
``<name>.json``, ``<name>.md``, ``<name>.png`` and ``<name>_hyps/``."""

import os
import statistics

from realformer_nmt.errors import ConfigError

from .. import fairseq_runs
from .comparison_figure import plot_comparison
from .intervals import one_of_sets
from .pairs import add_pairs, pair_lines
from .recipe import BACKBONES, MAIN_ORDER, ON_PRELN, corpus_info, test_references
from .report import (
    SEED_PAIRED_NOTE,
    bleu_cell,
    fmt,
    not_run_lines,
    paired_cell,
    recipe_lines,
    seconds,
    seed_paired_cell,
    spread,
    test_set_names,
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
from .stats import (
    PAIRED_TEST_NOTE,
    add_seed_paired,
    add_test_set_paired,
    paired_vs,
    summarize_backbone,
    test_set_entries,
)


def compare(data, out, recipe, backbones=BACKBONES, seeds=(1,), residual_mode="sum", references=None,
            results_path=None, machine_note="", threads=None, log=print, title=None, jobs=1,
            bootstrap_samples=1000, report_only=False, import_from=None):
    """Train, decode and score every backbone for every seed; write JSON, MD and PNG.

    ``results_path`` is the path of the JSON file (default ``out/comparison.json``); the
    table and the plot go next to it with ``.md`` and ``.png``, and the hypotheses of every
    run in ``<stem>_hyps/``. With ``postln`` among the backbones, every other backbone gets
    ``paired_vs_postln`` (sacreBLEU's paired bootstrap test against Post-LN of the same
    seed) and ``seed_paired_vs_postln`` (the BLEU differences seed by seed); with ``preln``,
    ``seed_paired_vs_preln`` (and ``paired_vs_preln`` for the backbones on Pre-LN); the value residual
    study's pairs get their family's records (``pairs.py``).
    ``report_only`` trains nothing and reports the runs finished so far (``runs`` in the
    JSON lists the done and the missing ones); it still decodes finished runs on the test
    sets they lack.

    Every finished run is scored on every test set of ``data`` (``corpus_info``'s
    ``test_sets``: Multi30k's test_2016_flickr, the headline ``bleu``, and test_2017_flickr,
    test_2017_mscoco where prepared); a run scored before a set was added is decoded on it
    when asked again (``runs.score_test_sets``). Entries then carry ``bleu_by_test_set`` and
    the seed-paired differences per set and over the sets (``stats.add_test_set_paired``).

    ``import_from`` (a committed results file of this recipe, ``--import-results``): its
    runs that ``out`` has not finished count as finished (written into ``out`` first, or
    with ``report_only`` read in memory, nothing written); its backbones that ``backbones``
    leaves out are reported as the file has them (their own seeds, not trained); and each
    run trained in ``out`` that the file also holds is checked against it
    (``reproducibility``: equal BLEU, best valid loss and validation curve or not). Returns
    the summary dict.
    """
    from . import imports

    check_backbones(backbones)
    references = test_references(data, references)
    committed, committed_file = {}, {}
    if import_from:
        committed_file = fairseq_runs.read_json(import_from) or {}
        for run_dir, (record, hyps) in imports.run_records(import_from, data, out, recipe, residual_mode).items():
            committed[(record["backbone"], record["seed"])] = dict(
                record, run_dir=run_dir, **({"hypotheses": hyps.split("\n")[:-1]} if hyps is not None else {}))
        if not report_only:
            imports.import_results(import_from, data, out, recipe, residual_mode, log=log)
    # seeds outermost: an early stop still leaves comparable backbones
    specs = [((b, seed), b, seed, os.path.join(out, b, f"seed{seed}"), None, None)
             for seed in seeds for b in backbones]
    runs = train_all(specs, data, references, recipe, residual_mode, threads, jobs, log, "compare", report_only)
    trained_here = [k for k, r in runs.items() if r is not None and not r.get("imported_from")]
    for key, result in runs.items():  # --report-only: the file's runs where --out has none (in memory)
        if result is None and key in committed:
            runs[key] = committed[key]
    carried = [b for b in MAIN_ORDER if b not in backbones and any(k[0] == b for k in committed)]
    order = list(backbones) + carried
    for b in carried:  # the file's other backbones, with the file's seeds
        for key in sorted(k for k in committed if k[0] == b):
            runs[key] = committed[key]
    if carried:
        log(f"[compare] reported as {import_from} has them (not trained): {', '.join(carried)}")
    results = {b: [runs[k] for k in sorted(runs, key=lambda k: seed_order(k[1], seeds)) if k[0] == b
                   and runs[k] is not None] for b in order}
    results = {b: rs for b, rs in results.items() if rs}
    if not results:
        raise ConfigError(f"--report-only: no run has finished in {out} yet")
    summary = {b: summarize_backbone(rs, b, residual_mode) for b, rs in results.items()}
    test_sets = corpus_info(data)["test_sets"]
    if len(test_sets) > 1:
        for b, rs in results.items():
            test_set_entries(summary[b], rs, [t["name"] for t in test_sets])
    refs = read_lines(references)
    for reference in ("postln", "preln"):
        if reference not in results:
            continue
        for b in results:
            if b != reference and (reference == "postln" or b in ON_PRELN):
                summary[b][f"paired_vs_{reference}"] = paired_vs(results[reference], results[b], refs,
                                                                 bootstrap_samples)
    add_seed_paired(summary)
    add_pairs(add_test_set_paired(summary))
    signatures = {r["signature"] for rs in results.values() for r in rs if r["signature"]}
    summary.update(
        title=title or corpus_info(data)["title"],
        recipe=recipe_record(recipe, data, references, order, residual_mode, seeds),
        progress=done_and_missing({k: runs[k] for k in sorted(runs, key=lambda k: (order.index(k[0]), k[1]))},
                                  ("backbone", "seed")),
        sacrebleu_signature=" / ".join(sorted(signatures)) or None,
        paired_test=PAIRED_TEST_NOTE.format(samples=bootstrap_samples),
        machine=machine_description(join_notes(parallel_note(jobs, threads, report_only,
                                                             [r for rs in results.values() for r in rs]),
                                               machine_note)),
        out=os.path.abspath(out),
    )
    if len(test_sets) > 1:
        summary["test_sets"] = [{"split": t["split"], "name": t["name"]} for t in test_sets]
    if import_from:
        summary["reproducibility"] = reproducibility(
            [runs[k] for k in sorted(trained_here, key=lambda k: (order.index(k[0]), seed_order(k[1], seeds)))],
            committed, committed_file.get("reproducibility"), import_from)
    results_path = results_path or os.path.join(out, "comparison.json")
    save_hypotheses([r for rs in results.values() for r in rs], os.path.splitext(results_path)[0] + "_hyps")
    write_outputs(summary, results_path, comparison_markdown, plot_comparison)
    log(f"[compare] wrote {results_path} (+ .md, .png, _hyps/)")
    return summary


def seed_order(seed, seeds):
    """Sort key: a seed's place in ``seeds`` (those not asked for after them, by number)."""
    return (seeds.index(seed), 0) if seed in seeds else (len(seeds), seed)


REPRODUCIBILITY_RULE = ("a run trained in this run folder that the imported results file already held (the same "
                        "backbone, seed and recipe) is compared with the file's record: test BLEU (2 decimals), best "
                        "valid loss and every validation loss of its curve (as fairseq logs them); a run the file did "
                        "not hold is recorded as first trained here (committed_in null), and the file's own records "
                        "are carried forward unchanged")


def _same_curve(a, b):
    def points(run):
        return [(int(rec["update"]), rec["loss"]) for rec in run.get("curve") or []]
    return points(a) == points(b)


def reproducibility(trained, committed, previous, source):
    """``{"rule", "runs": [...]}``: each run of ``trained`` (trained in the run folder) that the
    imported file also holds (``committed``, by backbone and seed) compared with it:
    ``bleu_equal``, ``valid_loss_equal``, ``curve_equal`` beside both values; one the file does
    not hold gets ``committed_in: None`` (first trained here). A file run with this run's
    wall time and curve is this very run, reported before: its record in the file's own
    ``reproducibility`` (``previous``) is kept, as are the file's records of runs not
    trained here."""
    kept = {(r["backbone"], r["seed"]): r for r in (previous or {}).get("runs", [])}
    records = {}
    for r in trained:
        key = (r["backbone"], r["seed"])
        c = committed.get(key)
        if c is None:
            records[key] = {"backbone": key[0], "seed": key[1], "committed_in": None}
        elif c.get("train_seconds") == r.get("train_seconds") and _same_curve(c, r):
            if key in kept:  # the file's record is this run's
                records[key] = kept[key]
        else:
            def equal(a, b, digits):
                return a is not None and b is not None and round(a, digits) == round(b, digits)

            records[key] = {"backbone": key[0], "seed": key[1], "committed_in": source,
                            "committed_bleu": c.get("bleu"), "rerun_bleu": r.get("bleu"),
                            "bleu_equal": equal(c.get("bleu"), r.get("bleu"), 2),
                            "committed_valid_loss": c.get("best_valid_loss"),
                            "rerun_valid_loss": r.get("best_valid_loss"),
                            "valid_loss_equal": equal(c.get("best_valid_loss"), r.get("best_valid_loss"), 4),
                            "curve_equal": _same_curve(c, r)}
    for key, record in kept.items():
        records.setdefault(key, record)
    rank = {b: i for i, b in enumerate(MAIN_ORDER)}
    return {"rule": REPRODUCIBILITY_RULE,
            "runs": [records[k] for k in sorted(records, key=lambda k: (rank.get(k[0], len(rank)), k[1]))]}


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


def seed_list(seeds):
    """``1-5``, ``1-3, 6``: a backbone's seeds as the tables list them."""
    seeds, parts, i = sorted(seeds), [], 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(f"{seeds[i]}" if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ", ".join(parts)


def comparison_markdown(summary):
    backbones = [b for b in MAIN_ORDER if b in summary]
    n_seeds = max(len(summary[b]["seeds"]) for b in backbones)
    seeds = max((summary[b]["seeds"] for b in backbones), key=len)
    settings = summary["recipe"]["settings"]
    paired = any(summary[b].get("paired_vs_postln") for b in backbones)
    paired_pre = any(summary[b].get("paired_vs_preln") for b in backbones)
    seed_paired = seed_paired_columns([summary[b] for b in backbones])
    equal = len({tuple(summary[b]["seeds"]) for b in backbones}) == 1
    lines = [f"# {summary['title']}: Post-LN vs Pre-LN vs RealFormer", ""] + not_run_lines(summary) + [
             f"Test BLEU ({fairseq_runs.BLEU_LABELS[summary['recipe'].get('corpus', {}).get('bleu', 'sacrebleu')]}) "
             + (f"on {summary['test_sets'][0]['name']} " if summary.get("test_sets") else "")
             + "of the best checkpoint by "
             f"{'validation BLEU' if settings['select_by_bleu'] else 'validation loss'}, beam {settings['beam']}; "
             + seeds_phrase(n_seeds, seeds, equal=len({len(summary[b]["seeds"]) for b in backbones}) == 1), "",
             "| backbone | " + ("" if equal else "seeds | ") + "test BLEU | BLEU per seed | best valid loss (mean) | "
             "valid loss per seed | "
             + "".join(f"{header} | " for _, header in seed_paired)
             + ("vs Post-LN per seed: ΔBLEU (paired bootstrap p) | " if paired else "")
             + ("vs Pre-LN per seed: ΔBLEU (paired bootstrap p) | " if paired_pre else "")
             + "updates | train time per seed |",
             "| --- | " + ("" if equal else "--- | ") + "--- | --- | --- | " + "--- | " * len(seed_paired)
             + ("--- | " if paired else "") + ("--- | " if paired_pre else "") + "--- | --- | --- |"]
    for b in backbones:
        s = summary[b]
        lines.append(
            f"| {b} | " + ("" if equal else f"{seed_list(s['seeds'])} | ")
            + f"{bleu_cell(s)} | {', '.join(fmt(x) for x in s['bleu_per_seed'])} "
            f"| {fmt(s['valid_loss'], 3)} | {', '.join(fmt(x, 3) for x in s['valid_loss_per_seed'])} | "
            + "".join(f"{seed_paired_cell(s, key)} | " for key, _ in seed_paired)
            + (f"{paired_cell(s)} | " if paired else "")
            + (f"{paired_cell(s, 'paired_vs_preln')} | " if paired_pre else "")
            + f"{s['updates']} | {', '.join(seconds(t) for t in s['train_seconds_per_seed'])} |")
    if seed_paired:
        lines += ["", SEED_PAIRED_NOTE + "."]
    lines += test_set_lines(summary, backbones) + paired_by_set_lines(summary, backbones) + pair_lines(summary)
    lines += reproducibility_lines(summary)
    lines += ["", "Backbones (the only flags that differ):", ""]
    for b in backbones:
        lines.append(f"- `{b}`: {summary[b]['description']}: `{' '.join(summary[b]['flags'])}`")
    lines += recipe_lines(summary)
    return "\n".join(lines)


def test_set_lines(summary, backbones):
    """BLEU of every backbone on every test set: mean ± sd over the seeds scored on it, and per seed."""
    names = test_set_names(summary, backbones)
    if len(names) < 2:
        return []
    lines = ["", f"**Every test set** ({', '.join(f'`{n}`' for n in names)}; the first is the headline above): "
             "test BLEU, mean ± sd over the seeds scored on it (a run taken from a results file that did not "
             "score a set, and whose checkpoint is gone, has none there), then per seed.", "",
             "| backbone | " + " | ".join(f"`{n}`" for n in names) + " |", "| --- |" + " --- |" * len(names)]
    for b in backbones:
        s = summary[b]
        per_set = dict(s.get("bleu_per_seed_by_test_set") or {names[0]: s["bleu_per_seed"]})
        cells = []
        for n in names:
            values = per_set.get(n) or ([None] * len(s["seeds"]))
            scored = [(seed, v) for seed, v in zip(s["seeds"], values) if v is not None]
            if not scored:
                cells.append("not scored")
                continue
            finite = [v for _, v in scored]
            mean = round(statistics.mean(finite), 2)
            sd = round(statistics.stdev(finite), 2) if len(finite) > 1 else None
            cells.append(f"{spread(mean, sd, finite)} (seeds {seed_list([k for k, _ in scored])}: "
                         + ", ".join(fmt(v) for v in finite) + ")")
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return lines


def paired_by_set_lines(summary, backbones):
    """Seed-paired differences per test set, over the test sets, and of the best valid loss."""
    names = test_set_names(summary, backbones)
    pairs = [(b, ref) for b in backbones for ref in ("postln", "preln")
             if summary[b].get(f"seed_paired_valid_loss_vs_{ref}")]
    if not pairs:
        return []
    over = len(names) > 1 and any(summary[b].get(f"seed_paired_vs_{ref}_over_test_sets") for b, ref in pairs)
    header = ("| backbone minus reference, same seed | "
              + (" | ".join(f"ΔBLEU `{n}`" for n in names) if len(names) > 1 else "ΔBLEU (test)")
              + (" | ΔBLEU, mean of the test sets" if over else "") + " | Δ best valid loss |")
    lines = ["", "**Seed-paired differences, " + ("test BLEU per test set" if len(names) > 1 else "test BLEU")
             + " and best validation loss** (backbone minus reference trained with the same seed, over the seeds "
             "both have" + ("; mean of the test sets: per seed the mean of its differences on the "
                            f"{len(names)} sets, then over the seeds scored on all of them" if over else "")
             + "; a lower valid loss is better; per seed = mean ± sd (95% interval, Student t) with 3 or more "
             "seeds; bold: the interval excludes zero" + ("; on one of several test sets a pair is scored on, the "
                                                          "interval corrected for their number (Bonferroni), printed "
                                                          "beside it, decides" if len(names) > 1 else "") + ").", "",
             header, "| --- |" + " --- |" * (max(len(names), 1) + over + 1)]
    for b, ref in pairs:
        s = summary[b]
        if len(names) > 1:
            by_set = dict(s.get(f"seed_paired_vs_{ref}_by_test_set") or {})
            by_set.setdefault(names[0], s.get(f"seed_paired_vs_{ref}"))  # the headline: the table's own record
            scored = [n for n in names if (by_set.get(n) or {}).get("per_seed")]  # the sets this pair has
            cells = [seed_paired_cell({n: one_of_sets(by_set.get(n), len(scored))}, n) for n in names]
        else:
            cells = [seed_paired_cell(s, f"seed_paired_vs_{ref}")]
        if over:
            cells.append(seed_paired_cell(s, f"seed_paired_vs_{ref}_over_test_sets"))
        cells.append(seed_paired_cell(s, f"seed_paired_valid_loss_vs_{ref}", digits=3))
        lines.append(f"| {b} − {ref} | " + " | ".join(cells) + " |")
    return lines


def reproducibility_lines(summary):
    """Which runs trained here reproduce the imported results file's (its ``reproducibility``)."""
    record = summary.get("reproducibility")
    if not record:
        return []
    again = [r for r in record["runs"] if r.get("committed_in")]
    first = [r for r in record["runs"] if not r.get("committed_in")]
    lines = ["", "**Reproducibility of the harness**: " + record["rule"] + "."]
    if again:
        exact = [r for r in again if r["bleu_equal"] and r["valid_loss_equal"] and r["curve_equal"]]
        lines += ["", f"{len(exact)} of {len(again)} runs trained again reproduce the committed run exactly "
                      "(test BLEU, best valid loss and validation curve):", ""]
        for r in again:
            def same(flag):
                return "equal" if flag else "**differs**"
            lines.append(f"- {r['backbone']} seed {r['seed']}: BLEU {fmt(r['rerun_bleu'])} against "
                         f"{fmt(r['committed_bleu'])} in `{r['committed_in']}` ({same(r['bleu_equal'])}), best valid "
                         f"loss {fmt(r['rerun_valid_loss'], 3)} against {fmt(r['committed_valid_loss'], 3)} "
                         f"({same(r['valid_loss_equal'])}), validation curve {same(r['curve_equal'])}")
    else:
        lines += ["", "No run trained here had a committed counterpart."]
    if first:
        by_backbone = {}
        for r in first:
            by_backbone.setdefault(r["backbone"], []).append(r["seed"])
        lines += ["", "No earlier record to compare with when first trained (trained in this run folder, or "
                  "carried forward from the file's own reproducibility records): "
                  + "; ".join(f"{b} seeds {seed_list(s)}" for b, s in by_backbone.items()) + "."]
    return lines
