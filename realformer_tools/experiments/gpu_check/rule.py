"""The CUDA rule for ``auto`` from a whole-model speed table (``scripts/benchmark_speed.py``'s
JSON), in the schema of the packaged ``kernel_rule.json``, from the rows that can decide.

* Rows: only GPU-bound ones, where every variant's GPU was busy at least
  ``benchmark.GPU_BOUND`` of its step (the benchmark's ``host_bound`` is False). A host-bound
  row times Python and kernel launches: on one H200 at 4-8k tokens per batch the per-round
  ratios ranged 0.5x-1.4x for every variant, so no kernel could be told apart there. The rows
  left out are listed with the reason.
* Candidates: the kernels ``auto`` chooses among on CUDA (``materialized``, ``bias``,
  ``triton``) that every such row measured.
* Score: the geometric mean over the rows of each kernel's median per-round speed ratio to
  vanilla ``transformer`` (the same process, the same rounds).
* Tie margin: the rows' own spread, the largest half-range of a candidate's per-round ratios
  relative to its median, over the rows (at least ``MIN_TIE``). Kernels within it of the
  fastest are tied; a tie goes to the least geometric-mean peak memory.
"""

import math
import statistics

from ..benchmark import GPU_BOUND, per_round_ratios

CANDIDATES = ("materialized", "bias", "triton")
MIN_TIE = 0.01


def _geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def row_summary(config, kernels):
    """One row as the rule records it: where, how busy the GPU was, each kernel's median
    per-round speed ratio to vanilla with its range, and its peak memory ratio."""
    speed = {}
    for k in kernels:
        ratios = per_round_ratios(config, k) or [config["variants"][k]["train_speed_ratio"]]
        speed[k] = dict(median=statistics.median(ratios), low=min(ratios), high=max(ratios), rounds=len(ratios))
    return dict(size=config["size"], tokens_per_batch=config.get("tokens_per_batch"), length=config["length"],
                dtype=config.get("dtype"), gpu_busy_min=config.get("gpu_busy_min"), speed_ratio_to_vanilla=speed,
                peak_memory_ratio_to_vanilla={k: config["variants"][k].get("peak_memory_ratio") for k in kernels})


def rule_from_speed(result: dict, source: str) -> dict:
    configs = [c for c in result["configs"] if "vanilla" in c["variants"]]
    decisive = [c for c in configs if c.get("host_bound") is False]
    excluded = [dict(size=c["size"], tokens_per_batch=c.get("tokens_per_batch"), length=c["length"],
                     dtype=c.get("dtype"), why="host-bound: GPU busy " + (
                         "not measured" if c.get("gpu_busy_min") is None
                         else f"{100 * c['gpu_busy_min']:.0f}% of a step, below {100 * GPU_BOUND:.0f}%"))
                for c in configs if c not in decisive]
    kernels = [k for k in CANDIDATES if decisive and all(k in c["variants"] for c in decisive)]
    if not kernels:
        raise ValueError(f"no GPU-bound row (GPU busy >= {100 * GPU_BOUND:.0f}% of a step for every variant) "
                         "measured a candidate kernel: the table cannot decide the rule")
    rows = [row_summary(c, kernels) for c in decisive]
    scores = {k: _geomean([r["speed_ratio_to_vanilla"][k]["median"] for r in rows]) for k in kernels}
    memory = {k: _geomean([r["peak_memory_ratio_to_vanilla"][k] for r in rows
                           if r["peak_memory_ratio_to_vanilla"][k]]) for k in kernels}
    spread = max((s["high"] - s["low"]) / 2 / s["median"] for r in rows for s in r["speed_ratio_to_vanilla"].values())
    margin = max(MIN_TIE, spread)
    fastest = max(kernels, key=scores.get)
    tied = [k for k in kernels if scores[k] * (1 + margin) >= scores[fastest]]
    chosen = min(tied, key=lambda k: (memory[k] if memory[k] is not None else math.inf, -scores[k]))
    why = (f"{chosen}: {scores[chosen]:.3f}x vanilla's train speed (geometric mean of {len(rows)} GPU-bound rows)"
           + (f", tied within the rows' spread ({margin:.1%}) with {', '.join(k for k in tied if k != chosen)} and "
              "the least peak memory" if len(tied) > 1
              else f", the fastest by more than the rows' spread ({margin:.1%})"))
    return {
        "device": result.get("gpu") or result.get("device"),
        "dtype": ", ".join(sorted({r["dtype"] for r in rows if r["dtype"]})),
        "tokens_per_batch": sorted({r["tokens_per_batch"] for r in rows if r["tokens_per_batch"]}),
        "rule": {"first_layer": chosen, "later_layers": chosen},
        "measured": {
            "what": "whole model, train step (forward + backward + Adam), each kernel on every layer; median of the "
                    "per-round ratios to vanilla transformer in the same process",
            "source": source, "chosen": chosen, "why": why, "gpu_bound": GPU_BOUND, "tie_margin": margin,
            "geomean_speed_ratio_to_vanilla": scores, "geomean_memory_ratio_to_vanilla": memory,
            "torch": result.get("torch"), "rows": rows, "excluded_rows": excluded,
        },
        "command": result.get("command"),
    }
