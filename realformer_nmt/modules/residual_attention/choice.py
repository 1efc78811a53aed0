"""Which kernel ``auto`` runs (:func:`auto_kernel`), and the measured CUDA rule it reads
from the package (:func:`cuda_kernel_rule`)."""

import json
import logging
import os
from functools import lru_cache
from importlib import resources
from typing import Dict, Optional, Tuple

import torch

from . import sdpa_probe, triton_kernel

KERNELS = ("auto", "materialized", "fused", "bias", "triton")

logger = logging.getLogger(__name__)


def auto_kernel(*, device: torch.device, training_dropout: bool, terms: int, dtype=None, head_dim=None,
                prefer_triton: Optional[bool] = None) -> str:
    """The kernel ``auto`` runs for layer ``terms`` of a path on a full (uncached) pass.

    On CPU: the first layer of a path runs ``fused`` (that call is PyTorch's own fused
    attention with query/key head dim ``d``; the next layer forms ``A_1 = Q_1 K_1^T`` once
    when it adds its scores), every later layer ``materialized``; with attention dropout
    active, ``materialized`` throughout.

    Why, measured on this project's 2-core CPU (``python scripts/benchmark_kernels.py``,
    attention alone, 6 layers, B=8, H=8, d=64, float32, forward + backward; table in
    ``results/kernel_timing_cpu.json``): ``fused`` for every layer costs 1.4-1.8x
    ``materialized`` at every length from 32 to 512, causal or not: its dot products grow
    with the layer number (query/key head dim ``n*d``; on CPU also the zero-padded values)
    and it recomputes its call in backward. ``fused`` for the first layer only was never
    slower than ``materialized`` beyond noise (0.84x-1.01x its time), and it stores one layer's
    ``T x S`` probabilities fewer. PyTorch's fused CPU kernel has no dropout (SDPA falls
    back to its unfused math kernel), hence materialized there. ``bias`` on CPU runs SDPA's
    math kernel (a mask with a gradient), no better than ``materialized``.

    On CUDA: ``triton`` wherever it applies (``triton_kernel.unsupported``: triton installed, a GPU
    of compute capability 8.0 or newer, half precision or float32, with or without attention
    dropout; ``prefer_triton=False`` turns this off, default :data:`AUTO_PREFERS_TRITON`); where
    it does not, why is said once and the rule below runs. The rule the project
    measured on a GPU, shipped in this package
    (``kernel_rule.json`` next to this module, ``{"rule": {"first_layer": K, "later_layers":
    K}}``; a program may set another with :func:`use_cuda_kernel_rule`). Measured on one
    H100 (fp16, base size, T = 128 and 512; ``results/gpu/h100-2026-11-27/``): ``bias`` for
    every layer (``materialized`` tied with it on time within that table's noise and took
    1.37x its peak memory at T = 512). Without the file: ``bias`` for every layer. ``bias``
    is replaced by ``materialized`` if no fused SDPA backend of this GPU takes a float mask
    with a gradient (then SDPA would store the probabilities anyway). The rule applied is
    logged once.
    """
    if device.type != "cuda":
        if training_dropout:
            return "materialized"
        return "fused" if terms <= FUSED_MAX_TERMS else "materialized"
    if prefer_triton is None:
        prefer_triton = AUTO_PREFERS_TRITON
    reason = triton_kernel.unsupported(device, dtype, head_dim) if prefer_triton else "not preferred"
    if reason is None:
        return "triton"
    rule = cuda_kernel_rule()
    kernel = rule["first_layer"] if terms == 1 else rule["later_layers"]
    if kernel == "triton":
        kernel = "bias"
    if prefer_triton:
        triton_kernel.log_fallback_once(reason, kernel)
    if kernel == "bias" and not sdpa_probe.bias_has_fused_backend(device):
        kernel = "materialized"
    return kernel


# Whether ``auto`` runs ``triton`` on CUDA where it applies: at fairseq's speed where the GPU is
# the bottleneck (one H200, 2026-11-28, base size, 32k tokens per batch: 0.98x-1.02x fairseq's
# train speed at T = 128 and 512 where ``bias`` ran 0.61x-0.79x; docs/performance.md).
AUTO_PREFERS_TRITON = True

# Layers of a path (counted from its first) that ``auto`` runs fused on CPU (see ``auto_kernel``).
FUSED_MAX_TERMS = 1
DEFAULT_CUDA_RULE = {"first_layer": "bias", "later_layers": "bias"}
RULE_KERNELS = ("materialized", "fused", "bias", "triton")  # triton: only where it applies, else bias


# Where the CUDA rule comes from: the rule the project measured, shipped inside this package as
# data (kernel_rule.json next to this module, read with importlib.resources, so a wheel and a
# checkout read the same file and nothing outside the package is consulted), unless a program
# names another with use_cuda_kernel_rule(). On the command line, --residual-attention-kernel
# materialized|bias|fused bypasses auto altogether.
RULE_FILE = "kernel_rule.json"
PACKAGED_KERNEL_RULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), RULE_FILE)
_override = None  # (rule, where) set by use_cuda_kernel_rule


def use_cuda_kernel_rule(rule=None) -> None:
    """Override the packaged CUDA rule of ``auto`` in this process: a ``kernel_rule.json``
    path, a ``{"first_layer": K, "later_layers": K}`` dict, or None for the packaged rule
    again. A kernel outside :data:`RULE_KERNELS` is an error."""
    global _override
    if rule is None:
        _override = None
        return
    if isinstance(rule, dict):
        picked, where = dict(rule), "use_cuda_kernel_rule({...})"
    else:
        with open(rule, encoding="utf-8") as f:
            record = json.load(f)
        picked, where = dict(record.get("rule", {})), f"use_cuda_kernel_rule({rule})"
    bad = {k: v for k, v in picked.items() if k in DEFAULT_CUDA_RULE and v not in RULE_KERNELS}
    if set(picked) != set(DEFAULT_CUDA_RULE) or bad:
        raise ValueError(f"a CUDA kernel rule needs first_layer and later_layers among {', '.join(RULE_KERNELS)}; "
                         f"got {picked}")
    _override = (picked, where)


def kernel_rule_source() -> Tuple[str, str]:
    """``(where, which)`` of the CUDA rule ``auto`` applies: the override of
    :func:`use_cuda_kernel_rule`, else the rule shipped in this package."""
    if _override is not None:
        return _override[1], "set by the program"
    return PACKAGED_KERNEL_RULE, "the packaged rule"


def _packaged_rule_text() -> str:
    return resources.files(__package__).joinpath(RULE_FILE).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def _read_packaged_rule() -> Tuple[Dict[str, str], str]:
    try:
        record = json.loads(_packaged_rule_text())
    except FileNotFoundError:
        return dict(DEFAULT_CUDA_RULE), "no measured rule in the package (bias for every layer)"
    except (OSError, ValueError) as exc:
        return dict(DEFAULT_CUDA_RULE), f"unreadable packaged kernel rule ({exc}); bias for every layer"
    rule = record.get("rule", {}) if isinstance(record, dict) else {}
    picked = {}
    for position in ("first_layer", "later_layers"):
        kernel = rule.get(position)
        picked[position] = kernel if kernel in RULE_KERNELS else DEFAULT_CUDA_RULE[position]
    where = record.get("device", "a GPU") if isinstance(record, dict) else "a GPU"
    return picked, f"rule measured on {where}"


_LOGGED_RULES = set()


def cuda_kernel_rule() -> Dict[str, str]:
    """``{"first_layer": kernel, "later_layers": kernel}`` for ``auto`` on CUDA (logged once)."""
    where, which = kernel_rule_source()
    rule, origin = (dict(_override[0]), "set by the program") if _override is not None else _read_packaged_rule()
    key = (where, tuple(sorted(rule.items())))
    if key not in _LOGGED_RULES:
        _LOGGED_RULES.add(key)
        logger.info("residual attention kernel 'auto' on CUDA: first layer of a path %s, later layers %s (%s; %s)",
                    rule["first_layer"], rule["later_layers"], origin, which)
    return rule
