"""Which kernel ``auto`` runs (:func:`auto_kernel`) and the measured CUDA rule it reads from the package."""

import json
import logging
import os
from functools import lru_cache
from importlib import resources
from typing import Dict, Optional, Tuple

import torch

from . import sdpa_probe, triton_kernel

KERNELS = ("auto", "materialized", "bias", "triton")

logger = logging.getLogger(__name__)


def auto_kernel(*, device: torch.device, training_dropout: bool, terms: int, dtype=None, head_dim=None,
                prefer_triton: Optional[bool] = None, notes=None) -> str:
    """The kernel ``auto`` runs for layer ``terms`` of a path on a full (uncached) pass: ``materialized``
    on CPU; on CUDA ``triton`` where it applies in fp16 / bf16 (unless ``prefer_triton=False``), else the
    packaged rule, ``bias`` becoming ``materialized`` without a fused SDPA backend
    (docs/internals.md#what-auto-runs)."""
    if device.type != "cuda":
        return "materialized"
    if prefer_triton is None:
        prefer_triton = AUTO_PREFERS_TRITON
    reason = triton_kernel.unsupported(device, dtype, head_dim) if prefer_triton else "not preferred"
    if reason is None and dtype == torch.float32 and not torch.is_autocast_enabled(device.type):  # --amp: half
        reason = AUTO_FLOAT32
    if reason is None:
        return "triton"
    rule, origin = cuda_kernel_rule(), _read_packaged_rule()[1]
    kernel = rule["first_layer"] if terms == 1 else rule["later_layers"]
    if kernel == "triton":
        kernel = "bias"
    if notes is not None:
        notes.say(logging.INFO, "residual attention kernel 'auto' on CUDA: first layer of a path %s, later layers %s "
                  "(%s; %s)", rule["first_layer"], rule["later_layers"], origin, PACKAGED_KERNEL_RULE, log=logger)
    if prefer_triton:
        triton_kernel.note_fallback(notes, reason, kernel)
    if kernel == "bias" and not sdpa_probe.bias_has_fused_backend(device):
        kernel = "materialized"
    return kernel


# Whether ``auto`` runs ``triton`` on CUDA where it applies (measured: docs/internals.md#what-auto-runs).
AUTO_PREFERS_TRITON = True
# ... but not in float32 until a GPU measures it there (docs/performance.md#the-triton-kernel)
AUTO_FLOAT32 = ("auto does not choose it in float32 on CUDA: its IEEE float32 dot products use no tensor cores "
                "(an earlier version took 86 s for 25 updates on an H100 where bias took 7 s); "
                "--residual-attention-kernel triton runs it")

DEFAULT_CUDA_RULE = {"first_layer": "bias", "later_layers": "bias"}
RULE_KERNELS = ("materialized", "bias", "triton")  # triton: only where it applies, else bias
# The rule the project measured, shipped inside this package as data (read with importlib.resources).
RULE_FILE = "kernel_rule.json"
PACKAGED_KERNEL_RULE = os.path.join(os.path.dirname(os.path.abspath(__file__)), RULE_FILE)


def cuda_kernel_rule() -> Dict[str, str]:
    """``{"first_layer": kernel, "later_layers": kernel}``: the packaged rule of ``auto`` on CUDA."""
    return dict(_read_packaged_rule()[0])


def kernel_rule_source() -> Tuple[str, str]:
    """``(where, which)`` of the CUDA rule ``auto`` applies: the file shipped in this package."""
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
