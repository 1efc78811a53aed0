"""Statistics of a study: per-backbone summaries over seeds, run outcomes and sacreBLEU's
paired bootstrap test (per seed, on the same test sentences)."""

import os
import statistics

from realformer_nmt.errors import DataError

from .. import fairseq_runs
from .recipe import BACKBONE_DESCRIPTIONS, backbone_flags
from .runs import run_hypotheses

PAIRED_TEST_NOTE = ("sacreBLEU paired bootstrap resampling ({samples} resamples, seed 12345) of each seed's "
                    "test hypotheses against the reference backbone's of the same seed, on the same sentences. "
                    "It measures test-sentence sampling on one seed: p < 0.05 means that seed's BLEU difference "
                    "is unlikely to come from the choice of test sentences; p of about 0.4-0.5 at a difference near "
                    "zero is not evidence either way, and it says nothing about seed-to-seed variation (the "
                    "seed-paired differences do)")


def paired_bootstrap(baseline, system, references, samples=1000, bleu_args=None):
    """sacreBLEU's paired bootstrap resampling (Koehn 2004) of ``system`` against ``baseline``
    on the same sentences: ``{"p_value", "delta_bleu", "baseline_bleu", "system_bleu",
    "system_ci95", "signature"}``. The p-value is sacreBLEU's ``--paired-bs`` (as Moses'
    bootstrap script): the share of resamples whose absolute BLEU difference, centred on
    its mean over the resamples, exceeds the observed absolute difference ((count + 1) /
    (resamples + 1)); the resamples are seeded (SACREBLEU_SEED, default 12345), so the test
    is repeatable."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if len(baseline) != len(references) or len(system) != len(references):
        raise DataError(f"paired test needs one hypothesis per reference: {len(baseline)} and "
                        f"{len(system)} hypotheses for {len(references)} references")
    signatures, scores = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU(**(bleu_args or {}))},
                                    [references], test_type="bs", n_samples=samples)()
    base, other = scores["BLEU"]
    return {"p_value": float(other.p_value), "delta_bleu": round(other.score - base.score, 2),
            "baseline_bleu": round(base.score, 2), "system_bleu": round(other.score, 2),
            "system_ci95": round(float(other.ci), 2) if other.ci is not None else None,
            "signature": str(signatures["BLEU"])}


def paired_vs(baseline_runs, runs, references, samples=1000):
    """One paired bootstrap test per seed: ``[{"seed", "p_value", "delta_bleu", ...}]``
    (seeds where either run was not decoded are left out)."""
    by_seed = {r["seed"]: r for r in baseline_runs}
    out = []
    for r in runs:
        base = by_seed.get(r["seed"])
        base_hyps, hyps = (run_hypotheses(base) if base else None), run_hypotheses(r)
        if base_hyps is None or hyps is None:
            continue
        refs, bleu_args = fairseq_runs.paired_test_references(r, references)  # the headline's BLEU
        out.append(dict(seed=r["seed"], **paired_bootstrap(base_hyps, hyps, refs, samples, bleu_args)))
    return out


def summarize_backbone(results, backbone, residual_mode):
    bleus = [r["bleu"] for r in results]
    losses = [r["best_valid_loss"] for r in results]
    curves = [[[rec["update"], rec["loss"]] for rec in r["curve"]] for r in results]
    mean_curve = fairseq_runs.mean_curve(curves)
    finite_bleus = [b for b in bleus if b is not None]
    finite_losses = [v for v in losses if v is not None]
    return {
        "bleu": round(statistics.mean(finite_bleus), 2) if finite_bleus else None,
        "bleu_std": round(statistics.stdev(finite_bleus), 2) if len(finite_bleus) > 1 else None,
        "bleu_per_seed": bleus,
        "valid_loss": round(statistics.mean(finite_losses), 4) if finite_losses else None,
        "valid_loss_per_seed": losses,
        "updates": min(r["updates"] for r in results),
        "seeds": [r["seed"] for r in results],
        "status_per_seed": [classify(r, None, 0.0) for r in results],  # ok / diverged; studies add lagging
        "fairseq_status_per_seed": [r["status"] for r in results],
        "curve": [[u, round(m, 4)] for u, m, _, _ in mean_curve],
        "curve_min_max": [[u, round(lo, 4), round(hi, 4)] for u, _, lo, hi in mean_curve],
        "curve_per_seed": curves,
        "train_seconds_per_seed": [r["train_seconds"] for r in results],
        # fairseq-train attempts of each run (2 or more: stopped and started again); None: not recorded
        "attempts_per_seed": [r.get("attempts") for r in results],
        # how many of those continued from checkpoint_last.pt (0: every restart began at update 0)
        "resumes_per_seed": [resumes(r) for r in results],
        "decode_seconds_per_seed": [r["decode_seconds"] for r in results],
        "checkpoints": [r["checkpoint"] for r in results],
        "logs": [r["log"] for r in results],
        "flags": backbone_flags(backbone, residual_mode),
        "description": BACKBONE_DESCRIPTIONS[backbone],
        # beside a tokenized-BLEU headline (IWSLT'14): each seed's lowercased sacreBLEU of the detokenized output
        **({"sacrebleu_per_seed": [r.get("sacrebleu") for r in results]}
           if any(r.get("bleu_convention") == "tokenized" for r in results) else {}),
        # runs taken from a committed results file (--import-results), not trained in this run folder
        **({"imported_from_per_seed": [r.get("imported_from") for r in results]}
           if any(r.get("imported_from") for r in results) else {}),
    }


def resumes(record):
    """A run's resumes from checkpoint_last.pt: its record's, or counted in its log where the run
    was recorded before the field was (None: attempts not recorded, or the log is gone)."""
    if record.get("resumes") is not None or record.get("attempts") is None:
        return record.get("resumes")
    if record["attempts"] == 1:
        return 0
    log = record.get("log")
    return fairseq_runs.resumes_in_log(fairseq_runs.read_log(log)) if log and os.path.exists(log) else None


EXACT_DIGITS = 10  # differences of values given to a few decimals, without binary noise

OUTCOMES = ("ok", "lagging", "diverged")  # the one vocabulary of run outcomes (docs/results.md)
DIVERGED_RULE = ("diverged: fairseq stopped on NaN/inf (FloatingPointError: NaN/inf gradients, or fp16 "
                 "'Minimum loss scale reached') or no finite validation loss")


def outcome_rule(margin, reference):
    """The outcome rule as the JSON states it, with the study's reference named."""
    return (f"{DIVERGED_RULE}; lagging: finished, but its best valid loss is more than {margin:g} above "
            f"the reference, {reference} (fairseq's label-smoothed loss, base 2); ok: neither")


def classify(result, reference_loss, margin):
    """``ok`` / ``lagging`` / ``diverged`` for one run against its study's reference loss."""
    if result["status"] == "diverged" or result["best_valid_loss"] is None:
        return "diverged"
    if reference_loss is not None and result["best_valid_loss"] > reference_loss + margin:
        return "lagging"
    return "ok"


def seed_paired(values, reference_values, seeds, reference_seeds, digits=2):
    """Differences ``value - reference`` on the same seed: ``{"seeds", "per_seed", "mean"}``
    plus, with 3 or more paired seeds, ``"sd"`` and ``"ci95"`` (Student t over seeds). Seeds
    where either side has no value (a diverged run, a run not done) are left out.

    Only what is shown is rounded: ``per_seed`` keeps each difference exactly (to
    ``EXACT_DIGITS``, which only removes binary noise such as 0.15499999999999936 from
    values given to 2-4 decimals), and the mean, sd and interval are computed from those
    exact differences, then rounded to ``digits``."""
    by_seed = dict(zip(reference_seeds, reference_values))
    pairs = [(seed, v, by_seed[seed]) for seed, v in zip(seeds, values)
             if seed in by_seed and v is not None and by_seed[seed] is not None]
    return over_seeds([seed for seed, _, _ in pairs], [round(v - ref, EXACT_DIGITS) for _, v, ref in pairs], digits)


def over_seeds(seeds, per_seed, digits=2):
    """``{"seeds", "per_seed", "mean"}`` of one value per seed, plus ``"sd"`` (n - 1) and
    ``"ci95"`` (Student t) with 3 or more seeds; only the statistics are rounded."""
    out = {"seeds": list(seeds), "per_seed": list(per_seed),
           "mean": round(statistics.mean(per_seed), digits) if per_seed else None}
    if len(per_seed) >= 3:
        from scipy.stats import t

        sd = statistics.stdev(per_seed)
        half = float(t.ppf(0.975, len(per_seed) - 1)) * sd / len(per_seed) ** 0.5
        mean = statistics.mean(per_seed)
        out.update(sd=round(sd, digits), ci95=[round(mean - half, digits), round(mean + half, digits)])
    return out


def over_test_sets(records, digits=2):
    """Per seed, the mean of its seed-paired differences on every test set of ``records``
    (``{name: seed_paired record}``; only seeds paired on all of them), then ``over_seeds``:
    ``{"test_sets", "seeds", "per_seed", "mean", "sd", "ci95"}``."""
    names = list(records)
    common = [seed for seed in records[names[0]]["seeds"] if all(seed in r["seeds"] for r in records.values())]
    per_seed = [round(statistics.mean(r["per_seed"][r["seeds"].index(seed)] for r in records.values()), EXACT_DIGITS)
                for seed in common]
    return dict(test_sets=names, **over_seeds(common, per_seed, digits))


TEST_SET_KEY = "bleu_per_seed_by_test_set"  # {test set name: [BLEU per seed, None where not scored]}


def add_test_set_paired(entries):
    """The main comparison's further seed-paired records, on every entry (``{backbone: entry}``)
    but the reference itself, against Post-LN and Pre-LN where they ran:

    - ``seed_paired_valid_loss_vs_<ref>``: best valid loss minus the reference's, same seed
      (3 decimals);
    - with per-test-set BLEU (``bleu_per_seed_by_test_set``), ``seed_paired_vs_<ref>_by_test_set``
      (``{name: seed_paired record}``, the sets both sides have a score on) and, with two or
      more sets, ``seed_paired_vs_<ref>_over_test_sets`` (``over_test_sets``: per seed the
      mean of the sets' differences, then over seeds)."""
    for reference in ("postln", "preln"):
        ref = entries.get(reference)
        if ref is None:
            continue
        for b, e in entries.items():
            if e is not None and b != reference:
                add_paired_records(e, ref, reference)
    return entries


def add_paired_records(e, ref, name):
    """Entry ``e``'s valid-loss and per-test-set seed-paired records against entry ``ref``, named
    ``..._vs_<name>`` (``add_test_set_paired``)."""
    e[f"seed_paired_valid_loss_vs_{name}"] = seed_paired(
        e["valid_loss_per_seed"], ref["valid_loss_per_seed"], e["seeds"], ref["seeds"], digits=3)
    if TEST_SET_KEY not in e or TEST_SET_KEY not in ref:
        return
    by_set = {}
    for test_set, values in e[TEST_SET_KEY].items():
        if test_set in ref[TEST_SET_KEY]:
            record = seed_paired(values, ref[TEST_SET_KEY][test_set], e["seeds"], ref["seeds"])
            if record["per_seed"]:
                by_set[test_set] = record
    e[f"seed_paired_vs_{name}_by_test_set"] = by_set
    if len(by_set) >= 2:
        e[f"seed_paired_vs_{name}_over_test_sets"] = over_test_sets(by_set)
    else:
        e.pop(f"seed_paired_vs_{name}_over_test_sets", None)


def test_set_entries(entry, results, names):
    """Add each test set's BLEU per seed (``bleu_per_seed_by_test_set``, None where a run has no
    score on it) and its mean and sd over the scored seeds (``bleu_by_test_set``,
    ``bleu_std_by_test_set``) to a backbone's summary ``entry``; ``names``: the test sets, the
    headline first (a run without per-set scores has its ``bleu`` there)."""
    per = {}
    for name in names:
        values = []
        for r in results:
            by_set = dict(r.get("bleu_by_test_set") or {})
            by_set.setdefault(names[0], r.get("bleu"))
            values.append(by_set.get(name))
        per[name] = values
    entry[TEST_SET_KEY] = per
    return test_set_means(entry)


def test_set_means(entry):
    """``bleu_by_test_set`` / ``bleu_std_by_test_set`` of an entry from its
    ``bleu_per_seed_by_test_set`` (mean and sd, n - 1, over the seeds scored on each set)."""
    per = entry.get(TEST_SET_KEY)
    if per is None:
        return entry
    entry["bleu_by_test_set"] = {n: round(statistics.mean(v for v in vs if v is not None), 2)
                                 if any(v is not None for v in vs) else None for n, vs in per.items()}
    entry["bleu_std_by_test_set"] = {n: round(statistics.stdev(v for v in vs if v is not None), 2)
                                     if sum(v is not None for v in vs) > 1 else None for n, vs in per.items()}
    return entry


def add_seed_paired(entries, metric="bleu_per_seed", backbone_of=None, digits=2):
    """``seed_paired_vs_postln`` (and ``seed_paired_vs_preln`` where Pre-LN ran) on every entry
    of ``entries`` (``{name: summary entry or None}``) but the reference itself; ``backbone_of``
    maps a name to its backbone (default: the name)."""
    backbone_of = backbone_of or (lambda name: name)
    names = {backbone_of(k): k for k, e in entries.items() if e is not None}
    for reference in ("postln", "preln"):
        if reference not in names:
            continue
        ref = entries[names[reference]]
        for k, e in entries.items():
            if e is not None and backbone_of(k) != reference:
                e[f"seed_paired_vs_{reference}"] = seed_paired(e[metric], ref[metric], e["seeds"], ref["seeds"],
                                                               digits)
    return entries


def best_loss_per_seed(results, seeds):
    """``{seed: lowest best valid loss among the finished runs of that seed}`` (None: none)."""
    reference = {}
    for seed in seeds:
        losses = [r["best_valid_loss"] for r in results if r is not None and r["seed"] == seed
                  and r["status"] == "finished" and r["best_valid_loss"] is not None]
        reference[seed] = min(losses) if losses else None
    return reference


def reference_record(reference):
    """``best_loss_per_seed``'s reference as a study's JSON records it (``reference_loss_per_seed``):
    seeds as strings, and only seeds with a finished run (a study still training has none for the
    others)."""
    return {str(seed): loss for seed, loss in reference.items() if loss is not None}


def outcome_entry(results, backbone, residual_mode, reference, margin):
    """``summarize_backbone`` with each seed's outcome against ``reference[seed]``."""
    entry = summarize_backbone(results, backbone, residual_mode)
    entry["status_per_seed"] = [classify(r, reference[r["seed"]], margin) for r in results]
    entry["reason_per_seed"] = [r["reason"] for r in results]
    return entry
