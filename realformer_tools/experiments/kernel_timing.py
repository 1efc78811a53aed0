"""Where each residual-attention kernel is faster: the measurements behind ``auto``.

Attention alone (no FFN, no embeddings): a stack of ``layers`` self-attention modules
of one residual path, forward + backward, next to fairseq's vanilla attention
(PyTorch's fused kernel, no residual) as the yardstick. Variants:

* every kernel on every layer (``materialized``, ``fused``, ``bias``, ...: every entry of
  ``KERNELS`` but ``auto``);
* ``F+L``: kernel ``F`` on the first layer of the path and ``L`` on every later one (a
  path can go from fused to another kernel, never back to fused), the two positions
  ``auto`` decides separately;
* ``fused<=m``: fused for the first ``m`` layers, materialized after.

Variants are interleaved round by round in one process, so machine load hits all alike;
medians are reported, with ratios. On CUDA each variant's peak memory over a step
(``torch.cuda.max_memory_allocated`` above what was allocated before it) is recorded
too, and :func:`derive_rule` turns a run into the rule ``auto`` applies on that device
(:func:`kernel_rule` writes it in the schema of the packaged rule,
``realformer_nmt/modules/residual_attention/kernel_rule.json``).
"""

import math
import statistics
import time
from typing import Dict, List, Optional

import torch

from realformer_nmt.modules.residual_attention import KERNELS, ResidualMultiheadAttention

# every kernel a layer can run (``auto`` only chooses among these)
CONCRETE_KERNELS = tuple(k for k in KERNELS if k != "auto")
# a candidate may use this much more peak memory than all-materialized and still count as
# "not worse" (allocator rounding; CUDA peaks are otherwise deterministic)
MEMORY_SLACK = 1.01


def build_stack(kernels: List[Optional[str]], embed_dim: int, heads: int, dropout: float, device, dtype):
    """One module per entry: a kernel name (residual) or None (fairseq's vanilla module)."""
    torch.manual_seed(0)
    mods = []
    for kernel in kernels:
        residual = kernel is not None
        mods.append(ResidualMultiheadAttention(
            embed_dim, heads, dropout=dropout, self_attention=True, residual=residual,
            kernel=kernel or "auto",
        ).to(device=device, dtype=dtype).train())
    return mods


def stack_step(mods, x, attn_mask, key_padding_mask):
    """Forward + backward through the stack (each layer feeds the next)."""
    state = None
    h = x
    for m in mods:
        h, _, state = m(h, h, h, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                        prev_state=state, need_weights=False)
    h.float().pow(2).mean().backward()


def position_variants(layers: int, kernels=CONCRETE_KERNELS) -> Dict[str, List[str]]:
    """``{name: per-layer kernels}``: first layer ``F``, later layers ``L``; named ``F``
    when ``F == L``, else ``F+L``. A later layer runs fused only after a fused first layer."""
    out = {}
    for first in kernels:
        for later in kernels:
            if later == "fused" and first != "fused":
                continue
            out[first if first == later else f"{first}+{later}"] = [first] + [later] * (layers - 1)
    return out


def variants_for(layers: int, switch_points: List[int], kernels=CONCRETE_KERNELS) -> Dict[str, List[Optional[str]]]:
    out: Dict[str, List[Optional[str]]] = {"vanilla": [None] * layers}
    if layers == 1:
        out.update({k: [k] for k in kernels})
    else:
        out.update(position_variants(layers, kernels))
    for m in switch_points:
        if 1 < m < layers and "fused" in kernels:
            out[f"fused<={m}"] = ["fused"] * m + ["materialized"] * (layers - m)
    return out


def split_variant(name: str, layers: int):
    """``(first, later)`` kernels of a position variant, or None (vanilla, hybrids)."""
    parts = name.split("+")
    if len(parts) > 2 or any(p not in CONCRETE_KERNELS for p in parts):
        return None
    return parts[0], parts[-1]


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_config(*, length: int, causal: bool, layers: int, batch: int, embed_dim: int, heads: int,
                dropout: float, switch_points: List[int], rounds: int, warmup: int, device, dtype,
                log=print) -> dict:
    variants = variants_for(layers, switch_points)
    stacks = {name: build_stack(k, embed_dim, heads, dropout, device, dtype) for name, k in variants.items()}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(length, batch, embed_dim, generator=g).to(device=device, dtype=dtype).requires_grad_(True)
    attn_mask = None
    if causal:
        attn_mask = torch.full((length, length), float("-inf"), device=device).triu(1).to(dtype)
    times = {name: [] for name in variants}
    cuda = torch.device(device).type == "cuda"
    peaks = {}
    for r in range(warmup + rounds):
        for name, mods in stacks.items():
            _sync(device)
            if cuda and r == warmup:
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            stack_step(mods, x, attn_mask, None)
            _sync(device)
            if cuda and r == warmup:
                peaks[name] = (torch.cuda.max_memory_allocated() - before) / 2**20
            if r >= warmup:
                times[name].append(time.perf_counter() - start)
            x.grad = None
            for m in mods:
                m.zero_grad(set_to_none=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    best = min((n for n in medians if n != "vanilla"), key=medians.get)
    result = {
        "length": length, "causal": causal, "layers": layers, "batch": batch,
        "median_seconds": medians,
        "ratio_to_materialized": {n: medians[n] / medians["materialized"] for n in medians},
        "ratio_to_vanilla": {n: medians[n] / medians["vanilla"] for n in medians},
        "fastest_residual": best,
        # CUDA: peak allocated during the first timed step over what was allocated before it
        "peak_memory_mib": peaks or None,
    }
    log(f"T={length:4d} causal={causal!s:5s} layers={layers}: "
        + "  ".join(f"{n} {medians[n] * 1000:.1f}ms" for n in medians) + f"  -> {best}")
    return result


def run(lengths, causal_modes, layers, batch, embed_dim, heads, dropout, switch_points, rounds, warmup,
        device, dtype, log=print) -> dict:
    configs = [
        time_config(length=T, causal=c, layers=layers, batch=batch, embed_dim=embed_dim, heads=heads,
                    dropout=dropout, switch_points=switch_points, rounds=rounds, warmup=warmup,
                    device=device, dtype=dtype, log=log)
        for c in causal_modes for T in lengths
    ]
    return {
        "what": "attention only, forward + backward, median seconds per step of a stack",
        "device": str(device), "dtype": str(dtype).replace("torch.", ""),
        "embed_dim": embed_dim, "heads": heads, "head_dim": embed_dim // heads, "dropout": dropout,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "device_name": device_name(device), "layers": layers,
        "configs": configs,
    }


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def derive_rule(result: dict) -> dict:
    """The fastest ``(first layer, later layers)`` kernels over a :func:`run`, among those
    whose peak memory is nowhere above all-``materialized`` (where measured), ``triton`` aside
    (``auto`` runs it wherever it applies; the rule is for the rest).

    Score: the geometric mean over the run's configurations (lengths, masks) of each
    position variant's time relative to all-materialized. Returns ``{"rule":
    {"first_layer", "later_layers"}, "scores", "memory_ok"}``.
    """
    layers = result["layers"]
    scores, memory_ok = {}, {}
    for name in result["configs"][0]["median_seconds"]:
        if split_variant(name, layers) is None:
            continue
        ratios = [c["ratio_to_materialized"][name] for c in result["configs"]]
        scores[name] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        memory_ok[name] = all(
            c["peak_memory_mib"][name] <= c["peak_memory_mib"]["materialized"] * MEMORY_SLACK
            for c in result["configs"] if c.get("peak_memory_mib")
        )
    # triton is measured, not a candidate: auto runs it only where preferred (choice.AUTO_PREFERS_TRITON)
    eligible = [n for n in scores if memory_ok[n] and "triton" not in split_variant(n, layers)] or ["materialized"]
    best = min(eligible, key=scores.get)
    first, later = split_variant(best, layers)
    return {"rule": {"first_layer": first, "later_layers": later}, "scores": scores, "memory_ok": memory_ok,
            "chosen": best}


def kernel_rule(result: dict, command: str) -> dict:
    """A rule file in the schema ``auto`` reads on CUDA (the package's ``kernel_rule.json``)::

        {"device": "<gpu name>", "dtype": "float16",
         "rule": {"first_layer": "<kernel>", "later_layers": "<kernel>"},
         "measured": {...}, "command": "..."}

    ``rule``: kernels among ``CONCRETE_KERNELS``, the fastest per position with peak
    memory not above ``materialized`` (:func:`derive_rule`). ``measured``: per
    configuration, every variant's median seconds, ratio to materialized and peak MiB,
    plus the geometric-mean scores the rule was chosen by.
    """
    derived = derive_rule(result)
    return {
        "device": result["device_name"],
        "dtype": result["dtype"],
        "rule": derived["rule"],
        "measured": {
            "what": result["what"],
            "chosen": derived["chosen"],
            "geomean_ratio_to_materialized": derived["scores"],
            "memory_not_worse_than_materialized": derived["memory_ok"],
            "layers": result["layers"], "batch": result["configs"][0]["batch"],
            "embed_dim": result["embed_dim"], "heads": result["heads"], "torch": result["torch"],
            "configs": [
                {k: c[k] for k in ("length", "causal", "median_seconds", "ratio_to_materialized",
                                   "peak_memory_mib")}
                for c in result["configs"]
            ],
        },
        "command": command,
    }
