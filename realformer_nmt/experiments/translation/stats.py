"""Statistics of a study: per-backbone summaries over seeds, run outcomes and sacreBLEU's
paired bootstrap test (per seed, on the same test sentences)."""

import statistics

from ...errors import DataError
from .. import fairseq_runs
from .recipe import BACKBONE_DESCRIPTIONS, backbone_flags
from .runs import run_hypotheses

PAIRED_TEST_NOTE = ("sacreBLEU paired bootstrap resampling ({samples} resamples, seed 12345) of each seed's "
                    "test hypotheses against Post-LN's of the same seed, on the same sentences; p < 0.05 "
                    "means that seed's BLEU difference is unlikely to come from the choice of test sentences "
                    "(it says nothing about seed-to-seed variation, which bleu_std shows)")


def paired_bootstrap(baseline, system, references, samples=1000):
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
    signatures, scores = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU()},
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
        out.append(dict(seed=r["seed"], **paired_bootstrap(base_hyps, hyps, references, samples)))
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
        "status_per_seed": [r["status"] for r in results],
        "curve": [[u, round(m, 4)] for u, m, _, _ in mean_curve],
        "curve_min_max": [[u, round(lo, 4), round(hi, 4)] for u, _, lo, hi in mean_curve],
        "curve_per_seed": curves,
        "train_seconds_per_seed": [r["train_seconds"] for r in results],
        "decode_seconds_per_seed": [r["decode_seconds"] for r in results],
        "checkpoints": [r["checkpoint"] for r in results],
        "logs": [r["log"] for r in results],
        "flags": backbone_flags(backbone, residual_mode),
        "description": BACKBONE_DESCRIPTIONS[backbone],
    }


def classify(result, reference_loss, margin):
    """``ok`` / ``diverged`` / ``stalled`` for one sweep run (see the module docstring)."""
    if result["status"] == "diverged" or result["best_valid_loss"] is None:
        return "diverged"
    if reference_loss is not None and result["best_valid_loss"] > reference_loss + margin:
        return "stalled"
    return "ok"
