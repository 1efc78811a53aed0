"""The targets the check judges by (docs/gpu.md): speed and peak memory of ``bias`` (or
``auto``) against vanilla in fp16, and fp16 loss against fp32."""

from typing import Optional

from .settings import FP16_LOSS_TOLERANCE, SPEED_TARGETS


def speed_targets(speed: Optional[dict]):
    """The issue's speed targets on the fp16 benchmark: ``bias`` (or ``auto``) train tok/s
    >= 0.90x vanilla and peak memory <= 1.15x at T = 512; >= 0.95x and <= 1.05x at T = 128."""
    bounds = SPEED_TARGETS
    rows = []
    for config in (speed or {}).get("configs", []):
        if config["length"] not in bounds:
            continue
        min_speed, max_mem = bounds[config["length"]]
        best = None
        for variant in ("bias", "auto"):
            r = config["variants"].get(variant)
            if r is None:
                continue
            speed_ratio, mem_ratio = r.get("train_speed_ratio"), r.get("peak_memory_ratio")
            met = None
            if speed_ratio is not None and mem_ratio is not None:
                met = speed_ratio >= min_speed and mem_ratio <= max_mem
            row = dict(size=config["size"], length=config["length"], variant=variant, speed_ratio=speed_ratio,
                       memory_ratio=mem_ratio, min_speed=min_speed, max_memory=max_mem, met=met)
            if best is None or (met and not best["met"]):  # bias unless only auto meets it
                best = row
        if best:
            rows.append(best)
    return rows


def loss_targets(train: Optional[dict]):
    """fp16 loss after the run within 1% of fp32's, per kernel (final validation loss)."""
    runs = {(c.get("precision"), c.get("kernel")): c for c in (train or {}).get("checks", [])}
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
