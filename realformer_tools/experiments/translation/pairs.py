"""Seed-paired comparisons asked as one family: the value residual study's pairs
(``recipe.VALUE_RESIDUAL_PAIRS``: each new backbone minus Pre-LN and minus RealFormer on Pre-LN, and
the two new ones against each other). Each pair gets the records the main comparison gives a backbone
against Post-LN and Pre-LN (``stats.add_test_set_paired``), under the reference's name:
``seed_paired_vs_<ref>`` (headline test BLEU), ``..._by_test_set``, ``..._over_test_sets`` and
``seed_paired_valid_loss_vs_<ref>``; and every one of them its interval corrected (Bonferroni) for the
family, ``ci95_corrected`` with ``corrected_for``: BLEU on one test set for pairs x test sets
comparisons, the mean of the sets and the best validation loss for the pairs."""

from .intervals import corrected_interval
from .recipe import VALUE_RESIDUAL_PAIRS
from .report import seed_paired_cell
from .stats import add_paired_records, seed_paired

REFERENCES = ("postln", "preln")  # compared by stats.add_seed_paired / add_test_set_paired already


def present(entries, pairs=VALUE_RESIDUAL_PAIRS):
    """The pairs whose two backbones both ran."""
    return [(b, ref) for b, ref in pairs if isinstance(entries.get(b), dict) and isinstance(entries.get(ref), dict)]


def _paired(e, ref, ref_name):
    """The seed-paired records of entry ``e`` against ``ref`` (another backbone's entry)."""
    e[f"seed_paired_vs_{ref_name}"] = seed_paired(e["bleu_per_seed"], ref["bleu_per_seed"], e["seeds"], ref["seeds"])
    add_paired_records(e, ref, ref_name)


def _correct(record, comparisons, digits=2):
    interval = corrected_interval(record, comparisons)
    if interval is not None:
        record.update(ci95_corrected=[round(v, digits) for v in interval], corrected_for=comparisons,
                      corrected_what="comparisons")


def family(entries, pairs=VALUE_RESIDUAL_PAIRS):
    """``(pairs present, test sets)``: the sizes the intervals are corrected for."""
    found = present(entries, pairs)
    sets = max([len(entries[b].get(f"seed_paired_vs_{ref}_by_test_set") or {}) for b, ref in found] + [1])
    return found, sets


def add_pairs(entries, pairs=VALUE_RESIDUAL_PAIRS):
    """Add the family's records to ``entries`` (``{backbone: entry}``, in place; returned)."""
    for b, ref in present(entries, pairs):
        if ref not in REFERENCES:
            _paired(entries[b], entries[ref], ref)
    found, sets = family(entries, pairs)
    for b, ref in found:
        e = entries[b]
        by_set = e.get(f"seed_paired_vs_{ref}_by_test_set") or {}
        for record in [e.get(f"seed_paired_vs_{ref}")] + list(by_set.values()):
            if record:
                _correct(record, len(found) * sets)
        if e.get(f"seed_paired_vs_{ref}_over_test_sets"):
            _correct(e[f"seed_paired_vs_{ref}_over_test_sets"], len(found))
        _correct(e[f"seed_paired_valid_loss_vs_{ref}"], len(found), digits=3)
    return entries


def pair_lines(summary, pairs=VALUE_RESIDUAL_PAIRS):
    """The Markdown table of the family (none of its pairs ran: no lines)."""
    found, sets = family(summary, pairs)
    if not found:
        return []
    names = []
    for b, ref in found:
        names += [n for n in summary[b].get(f"seed_paired_vs_{ref}_by_test_set") or {} if n not in names]
    over = len(names) > 1 and any(summary[b].get(f"seed_paired_vs_{ref}_over_test_sets") for b, ref in found)
    k = len(found)
    lines = ["", f"**Value residual: {k} seed-paired comparisons as one family** (backbone minus reference trained "
             "with the same seed, over the seeds both have; mean ± sd, 95% interval (Student t) and the interval "
             f"corrected (Bonferroni) for the family: {k} pairs x {sets} test set{'s' if sets > 1 else ''} = "
             f"{k * sets} BLEU comparisons on each set, {k} for the mean of the sets and {k} for the best valid "
             "loss (lower is better); bold: the corrected interval excludes zero). Primary measure, fixed before "
             "the runs: ΔBLEU over the mean of the test sets, its interval corrected for the pairs; the other "
             "columns are secondary.", "",
             "| backbone − reference, same seed | "
             + (" | ".join(f"ΔBLEU `{n}`" for n in names) if names else "ΔBLEU (test)")
             + (" | ΔBLEU, mean of the test sets" if over else "") + " | Δ best valid loss |",
             "| --- |" + " --- |" * (max(len(names), 1) + over + 1)]
    for b, ref in found:
        s = summary[b]
        if names:
            by_set = dict(s.get(f"seed_paired_vs_{ref}_by_test_set") or {})
            cells = [seed_paired_cell(by_set, n) for n in names]
        else:
            cells = [seed_paired_cell(s, f"seed_paired_vs_{ref}")]
        if over:
            cells.append(seed_paired_cell(s, f"seed_paired_vs_{ref}_over_test_sets"))
        cells.append(seed_paired_cell(s, f"seed_paired_valid_loss_vs_{ref}", digits=3))
        lines.append(f"| {b} − {ref} | " + " | ".join(cells) + " |")
    return lines
