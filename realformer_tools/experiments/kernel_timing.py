"""Where each residual-attention kernel is faster: the measurements behind ``auto``.

Attention alone (no FFN, no embeddings): a stack of ``layers`` self-attention modules
of one residual path, forward + backward, next to fairseq's vanilla attention
(PyTorch's fused kernel, no residual) as the yardstick. Variants:

* every kernel on every layer (``materialized``, ``bias``, ``triton``: every entry of
  ``KERNELS`` but ``auto``);
* ``F+L``: kernel ``F`` on the first layer of the path and ``L`` on every later one
  (the committed CPU table also measured a ``fused`` kernel, since removed, and hybrids of it).

Variants are interleaved round by round in one process, so machine load hits all alike;
medians are reported, with ratios. On CUDA each variant's peak memory over a step
(``torch.cuda.max_memory_allocated`` above what was allocated before it) is recorded
too. The CUDA rule of ``auto`` is not derived here: attention alone says nothing about
whether a training step is host-bound, so the rule comes from whole-model rows where the
GPU is the bottleneck (``gpu_check/rule.py``).
"""

import statistics
import time
from typing import Dict, List, Optional

import torch

from realformer_nmt.modules.residual_attention import KERNELS, ResidualMultiheadAttention, ResidualPath

# every kernel a layer can run (``auto`` only chooses among these)
CONCRETE_KERNELS = tuple(k for k in KERNELS if k != "auto")


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
        path = ResidualPath(state)
        h, _ = m(h, h, h, key_padding_mask=key_padding_mask, attn_mask=attn_mask, residual_path=path,
                 need_weights=False)
        state = path.state
    h.float().pow(2).mean().backward()


def position_variants(layers: int, kernels=CONCRETE_KERNELS) -> Dict[str, List[str]]:
    """``{name: per-layer kernels}``: first layer ``F``, later layers ``L``; named ``F``
    when ``F == L``, else ``F+L``."""
    out = {}
    for first in kernels:
        for later in kernels:
            out[first if first == later else f"{first}+{later}"] = [first] + [later] * (layers - 1)
    return out


def variants_for(layers: int, kernels=CONCRETE_KERNELS) -> Dict[str, List[Optional[str]]]:
    out: Dict[str, List[Optional[str]]] = {"vanilla": [None] * layers}
    if layers == 1:
        out.update({k: [k] for k in kernels})
    else:
        out.update(position_variants(layers, kernels))
    return out


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_config(*, length: int, causal: bool, layers: int, batch: int, embed_dim: int, heads: int,
                dropout: float, rounds: int, warmup: int, device, dtype,
                log=print) -> dict:
    variants = variants_for(layers)
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


def run(lengths, causal_modes, layers, batch, embed_dim, heads, dropout, rounds, warmup,
        device, dtype, log=print) -> dict:
    configs = [
        time_config(length=T, causal=c, layers=layers, batch=batch, embed_dim=embed_dim, heads=heads,
                    dropout=dropout, rounds=rounds, warmup=warmup,
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
