"""What the figures read from a study's seed-paired records: the interval widened for a
family of comparisons (several test sets of one backbone pair), and the seeds whose rerun
did not reproduce its committed run. A module of its own so that ``summary`` (imported by
``report``) needs nothing of ``stats``, which imports ``runs``, which imports ``report``."""

import statistics


def corrected_interval(record, comparisons):
    """The 95% interval of a seed-paired ``record`` (its exact ``per_seed``) widened for
    ``comparisons`` tests of one family (Bonferroni: each at 0.05 / comparisons), as
    ``[low, high]`` unrounded; None with fewer than 3 seeds. One comparison: ``ci95`` itself."""
    per_seed = (record or {}).get("per_seed") or []
    if len(per_seed) < 3:
        return None
    from scipy.stats import t

    half = float(t.ppf(1 - 0.025 / comparisons, len(per_seed) - 1)) * statistics.stdev(per_seed) / len(per_seed) ** 0.5
    mean = statistics.mean(per_seed)
    return [mean - half, mean + half]


def rerun_seeds(summary, backbones):
    """The seeds whose run of any of ``backbones`` in ``summary`` is a rerun that did not
    reproduce its committed run (``reproducibility``: trained again, another BLEU)."""
    runs = (summary.get("reproducibility") or {}).get("runs") or []
    return sorted({r["seed"] for r in runs if r.get("backbone") in backbones and r.get("committed_in")
                   and r.get("bleu_equal") is False})


def one_of_sets(record, sets):
    """A seed-paired record on one of ``sets`` test sets, with its interval corrected for them
    (``ci95_corrected``, which decides: bold in a table, filled in a figure) unless it carries one of a
    family already (the value residual pairs')."""
    if not record or sets < 2 or record.get("ci95_corrected") or not record.get("ci95"):
        return record
    return dict(record, ci95_corrected=corrected_interval(record, sets), corrected_for=sets, corrected_what="sets")
