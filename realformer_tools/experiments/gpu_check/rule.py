"""The CUDA rule for ``auto`` derived from a whole-model speed table
(``scripts/benchmark_speed.py``'s JSON, e.g. ``--quick``'s fp16 table at T = 128 and 512),
in the schema of ``kernel_rule.json`` (``kernel_timing.kernel_rule``'s).

Candidates: the uniform stacks the table measured (``materialized``, ``bias``, ``fused``;
``auto`` is a stack of these). Score: the geometric mean over the table's configurations
of each kernel's median train step time relative to ``materialized``'s (the per-round
ratios' median). Eligible: peak memory nowhere above ``materialized``'s (1% allowance).
The fastest eligible kernel wins; kernels within the table's noise of it are a tie, broken
by the lower geometric-mean peak memory. The noise is measured in the same table where it
can be: ``auto`` runs one of the uniform stacks (``auto_ran``: the rule it applied, which
its log names), so the two are the same computation timed twice, and their geometric-mean
time ratio's distance from 1 is the noise floor (at least ``TIE``, 2%).
"""

import math
import statistics

from ..kernel_timing import MEMORY_SLACK
from .targets import per_round_ratios

CANDIDATES = ("materialized", "bias", "fused")
TIE = 0.02


def _time_ratio(config, kernel):
    """Median over rounds of ``kernel``'s step time / ``materialized``'s step time."""
    key = "train_step_seconds_all"
    mat = config["variants"]["materialized"].get(key) or []
    mine = config["variants"][kernel].get(key) or []
    ratios = [m / b for m, b in zip(mine, mat) if b]
    if ratios:
        return statistics.median(ratios)
    return config["variants"][kernel]["train_step_seconds"] / config["variants"]["materialized"]["train_step_seconds"]


def noise_floor(configs, auto_ran):
    """The largest relative difference, over configurations, between ``auto`` and the
    uniform stack it ran (the same computation, timed twice), or None."""
    if auto_ran not in CANDIDATES or not all("auto" in c["variants"] for c in configs):
        return None
    return max(abs(math.log(_time_ratio(c, "auto") / _time_ratio(c, auto_ran))) for c in configs)


def rule_from_speed(result: dict, source: str, auto_ran: str = None) -> dict:
    configs = [c for c in result["configs"] if all(k in c["variants"] for k in CANDIDATES)]
    if not configs:
        raise ValueError("the speed table has no configuration with materialized, bias and fused")
    scores, memory, memory_ok, per_config = {}, {}, {}, []
    for kernel in CANDIDATES:
        ratios = [_time_ratio(c, kernel) for c in configs]
        scores[kernel] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        peaks = [(c["variants"][kernel].get("peak_memory_mib"), c["variants"]["materialized"].get("peak_memory_mib"))
                 for c in configs]
        peaks = [(p, m) for p, m in peaks if p and m]
        memory[kernel] = math.exp(sum(math.log(p / m) for p, m in peaks) / len(peaks)) if peaks else None
        memory_ok[kernel] = all(p <= m * MEMORY_SLACK for p, m in peaks)
    for c in configs:
        per_config.append(dict(
            size=c["size"], length=c["length"],
            time_ratio_to_materialized={k: _time_ratio(c, k) for k in CANDIDATES},
            speed_ratio_to_vanilla={k: statistics.median(per_round_ratios(c, k)) if per_round_ratios(c, k)
                                    else c["variants"][k].get("train_speed_ratio") for k in CANDIDATES},
            peak_memory_mib={k: c["variants"][k].get("peak_memory_mib") for k in CANDIDATES},
            rounds=len(c["variants"]["materialized"].get("train_step_seconds_all") or [])))
    noise = noise_floor(configs, auto_ran)
    margin = max(TIE, math.exp(noise) - 1) if noise is not None else TIE
    eligible = [k for k in CANDIDATES if memory_ok[k]] or ["materialized"]
    fastest = min(eligible, key=scores.get)
    tied = [k for k in eligible if scores[k] <= scores[fastest] * (1 + margin)]
    chosen = min(tied, key=lambda k: (memory[k] if memory[k] is not None else 1.0, scores[k]))
    why = (f"{chosen}: geometric-mean time {scores[chosen]:.3f}x materialized's"
           + (f", tied within {margin:.1%} (the table's noise) with {', '.join(k for k in tied if k != chosen)},"
              f" and the least memory "
              f"({memory[chosen]:.3f}x materialized's)" if len(tied) > 1 else ", the fastest")
           + "; peak memory not above materialized's")
    return {
        "device": result.get("gpu") or result.get("device"),
        "dtype": result.get("dtype"),
        "rule": {"first_layer": chosen, "later_layers": chosen},
        "measured": {
            "what": "whole base-size model, train step (forward + backward + Adam), uniform stacks, "
                    "ratios of the per-round step times to materialized's (median over rounds)",
            "source": source,
            "chosen": chosen,
            "why": why,
            "tie_margin": margin,
            "noise": None if noise is None else {"auto_ran": auto_ran,
                                                 "largest_relative_difference": math.exp(noise) - 1},
            "geomean_ratio_to_materialized": scores,
            "geomean_memory_ratio_to_materialized": memory,
            "memory_not_worse_than_materialized": memory_ok,
            "torch": result.get("torch"),
            "configs": per_config,
        },
        "command": result.get("command"),
    }
