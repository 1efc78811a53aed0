"""The targets the check judges by (docs/gpu.md): speed and peak memory of ``bias`` (or
``auto``), and of ``triton`` on its own stricter targets, against vanilla in fp16, judged on
the median of the per-round ratios; and the precision yardsticks (a kernel's precision cost
against vanilla's own)."""

import math
import statistics
from typing import Dict, List, Optional

from .settings import (
    FP16_LOSS_TOLERANCE,
    PRECISION_GAP_SE,
    PRECISION_SHIFT_FACTOR,
    PRECISION_SHIFT_FLOOR,
    SPEED_MIN_ALTERNATIONS,
    SPEED_TARGETS,
    TRITON_SPEED_TARGETS,
)


def per_round_ratios(config: dict, variant: str, key: str = "train_step_seconds_all") -> List[float]:
    """``variant``'s speed as a multiple of vanilla's, one ratio per timed round (the rounds
    are interleaved: round r of every variant ran under the same load)."""
    base = config["variants"].get("vanilla", {}).get(key) or []
    mine = config["variants"].get(variant, {}).get(key) or []
    return [b / m for b, m in zip(base, mine) if m]


def speed_summary(config: dict, variant: str) -> dict:
    """``{"median", "low", "high", "rounds"}`` of the per-round train speed ratios."""
    ratios = per_round_ratios(config, variant)
    if not ratios:
        ratio = config["variants"].get(variant, {}).get("train_speed_ratio")
        return dict(median=ratio, low=ratio, high=ratio, rounds=0)
    return dict(median=statistics.median(ratios), low=min(ratios), high=max(ratios), rounds=len(ratios))


def speed_targets(speed: Optional[dict]):
    """The speed targets on the fp16 benchmark: ``bias`` (or ``auto``) train tok/s >= 0.90x
    vanilla and peak memory <= 1.15x at T = 512; >= 0.95x and <= 1.05x at T = 128; and
    ``triton``, where it ran, its own: >= 0.95x at both lengths, memory <= 1.00x at T = 512
    and <= 1.05x at T = 128. Speed is the median of the per-round ratios (with their range);
    a target is judged only on at least ``SPEED_MIN_ALTERNATIONS`` rounds (``met`` None below
    that, ``rounds`` says)."""
    rows = []
    for config in (speed or {}).get("configs", []):
        if config["length"] in SPEED_TARGETS:
            best = None
            for variant in ("bias", "auto"):
                row = _target_row(config, variant, SPEED_TARGETS[config["length"]])
                if row is not None and (best is None or (row["met"] and not best["met"])):
                    best = row  # bias unless only auto meets it
            if best:
                rows.append(best)
        if config["length"] in TRITON_SPEED_TARGETS:
            row = _target_row(config, "triton", TRITON_SPEED_TARGETS[config["length"]])
            if row is not None:
                rows.append(row)
    return rows


def _target_row(config: dict, variant: str, bounds) -> Optional[dict]:
    """One judged row: ``variant`` against vanilla at ``config``'s length, ``bounds`` =
    (least speed ratio, most memory ratio); None where ``variant`` did not run."""
    r = config["variants"].get(variant)
    if r is None:
        return None
    min_speed, max_mem = bounds
    summary = speed_summary(config, variant)
    speed_ratio, mem_ratio = summary["median"], r.get("peak_memory_ratio")
    median_met = None if speed_ratio is None or mem_ratio is None else speed_ratio >= min_speed and mem_ratio <= max_mem
    return dict(size=config["size"], length=config["length"], variant=variant, speed_ratio=speed_ratio,
                speed_low=summary["low"], speed_high=summary["high"], rounds=summary["rounds"],
                memory_ratio=mem_ratio, min_speed=min_speed, max_memory=max_mem,
                met=median_met if summary["rounds"] >= SPEED_MIN_ALTERNATIONS else None, median_met=median_met)


def loss_targets(train: Optional[dict]):
    """fp16 loss after the run within 1% of fp32's, per kernel (final validation loss;
    reported beside the judged precision checks)."""
    runs = {(c.get("precision"), c.get("kernel")): c for c in (train or {}).get("checks", [])
            if c.get("seed", 1) == 1}
    rows = []
    for (precision, kernel), c in runs.items():
        if precision != "fp16":
            continue
        ref = runs.get(("fp32", kernel), {}).get("valid_loss")
        loss = c.get("valid_loss")
        diff = abs(loss - ref) / ref if loss is not None and ref else None
        met = None if diff is None else diff <= FP16_LOSS_TOLERANCE
        rows.append(dict(kernel=kernel, fp16=loss, fp32=ref, relative=diff, met=met, status=c["status"]))
    return rows


# ---------------------------------------------------------------------------------------
# mixed precision against vanilla's own cost
# ---------------------------------------------------------------------------------------


def shift_limit(vanilla_shift: float) -> float:
    """How far a kernel's fp32 checkpoint may move when evaluated in half precision:
    ``max(0.5%, 1.5x vanilla's own shift)``."""
    return max(PRECISION_SHIFT_FLOOR, PRECISION_SHIFT_FACTOR * vanilla_shift)


def judge_shift(kernel_shift: float, vanilla_shift: float) -> bool:
    return kernel_shift <= shift_limit(vanilla_shift)


def seed_gap(kernel_gaps: Dict[int, float], vanilla_gaps: Dict[int, float]) -> dict:
    """A kernel's precision gap over seeds against vanilla's, paired by seed: the mean of
    ``gap_kernel - gap_vanilla`` and its standard error; ``met`` when the mean is at most
    ``PRECISION_GAP_SE`` standard errors (None with fewer than two paired seeds)."""
    seeds = sorted(set(kernel_gaps) & set(vanilla_gaps))
    diffs = [kernel_gaps[s] - vanilla_gaps[s] for s in seeds]
    if len(diffs) < 2:
        return dict(seeds=seeds, mean=diffs[0] if diffs else None, se=None, met=None,
                    kernel_mean=None, vanilla_mean=None)
    mean = statistics.mean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return dict(seeds=seeds, mean=mean, se=se, met=mean <= PRECISION_GAP_SE * se,
                kernel_mean=statistics.mean(kernel_gaps[s] for s in seeds),
                vanilla_mean=statistics.mean(vanilla_gaps[s] for s in seeds))
