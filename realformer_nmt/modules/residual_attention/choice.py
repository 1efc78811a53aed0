"""Which kernel ``auto`` runs (:func:`auto_kernel`), and the measured CUDA rule it reads
from a file (:func:`cuda_kernel_rule`)."""

import json
import logging
import os
from functools import lru_cache
from typing import Dict, Tuple

import torch

from . import sdpa_probe, triton_kernel

KERNELS = ("auto", "materialized", "fused", "bias", "triton")

logger = logging.getLogger(__name__)


def auto_kernel(*, device: torch.device, training_dropout: bool, terms: int, dtype=None, head_dim=None,
                prefer_triton: bool = True) -> str:
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

    On CUDA: ``triton`` for every layer wherever it applies (``triton_kernel.unsupported``:
    triton installed, a GPU of compute capability 8.0 or newer, no attention dropout, half
    precision or float32; with ``prefer_triton=False`` never). Elsewhere on CUDA, the rule
    measured by the GPU check (``results/gpu/kernel_rule.json``, written by
    ``python -m realformer_tools.experiments.gpu_check --steps speed`` and shipped in the
    wheel; a user's own rule overrides it, see ``kernel_rule_source``),
    ``{"rule": {"first_layer": K, "later_layers": K}}``.
    Until a GPU has measured it: ``bias`` for every layer (it stores no probabilities and
    adds no QK work; ``fused`` grows its QK work with depth). ``bias`` is replaced by
    ``materialized`` if no fused SDPA backend of this GPU takes a float mask with a gradient
    (then SDPA would store the probabilities anyway). The rule applied is logged once.
    """
    if device.type != "cuda":
        if training_dropout:
            return "materialized"
        return "fused" if terms <= FUSED_MAX_TERMS else "materialized"
    if prefer_triton and triton_kernel.unsupported(device, dtype, training_dropout, head_dim) is None:
        return "triton"
    rule = cuda_kernel_rule()
    kernel = rule["first_layer"] if terms == 1 else rule["later_layers"]
    if kernel == "bias" and not sdpa_probe.bias_has_fused_backend(device):
        kernel = "materialized"
    return kernel


# Layers of a path (counted from its first) that ``auto`` runs fused on CPU (see ``auto_kernel``).
FUSED_MAX_TERMS = 1
KERNEL_RULE_ENV = "REALFORMER_KERNEL_RULE"
DEFAULT_CUDA_RULE = {"first_layer": "bias", "later_layers": "bias"}


# The project's measured rule: in a wheel, in realformer_nmt/modules/ (setup.py copies the committed
# results/gpu/kernel_rule.json there when it builds); in a checkout, results/gpu/ itself.
_MODULES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # realformer_nmt/modules
PACKAGED_KERNEL_RULE = os.path.join(_MODULES, "kernel_rule.json")
CHECKOUT_KERNEL_RULE = os.path.join(os.path.dirname(os.path.dirname(_MODULES)), "results", "gpu", "kernel_rule.json")


def user_kernel_rule_path() -> str:
    """The per-user rule, ``$XDG_CACHE_HOME/realformer_nmt/kernel_rule.json`` (default
    ``~/.cache/realformer_nmt/kernel_rule.json``): where the GPU check copies what it measured."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "realformer_nmt", "kernel_rule.json")


def kernel_rule_source() -> Tuple[str, str]:
    """``(path, which)`` of the CUDA rule ``auto`` reads, the first of: the file named by
    ``REALFORMER_KERNEL_RULE`` (even if missing: then the default); the user's own rule
    (``user_kernel_rule_path()``); the project's rule shipped in the package; a checkout's
    ``results/gpu/kernel_rule.json``. None there: the default (``bias`` for every layer)."""
    if os.environ.get(KERNEL_RULE_ENV):
        return os.environ[KERNEL_RULE_ENV], KERNEL_RULE_ENV
    for path, which in ((user_kernel_rule_path(), "the user's rule"), (PACKAGED_KERNEL_RULE, "the packaged rule"),
                        (CHECKOUT_KERNEL_RULE, "the checkout's rule")):
        if os.path.isfile(path):
            return path, which
    return PACKAGED_KERNEL_RULE, "no rule file"


@lru_cache(maxsize=None)
def _read_kernel_rule(path: str) -> Tuple[Dict[str, str], str]:
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return dict(DEFAULT_CUDA_RULE), "no measured rule (bias for every layer until the GPU check measures one)"
    except (OSError, ValueError) as exc:
        return dict(DEFAULT_CUDA_RULE), f"unreadable kernel rule {path} ({exc}); bias for every layer"
    rule = record.get("rule", {}) if isinstance(record, dict) else {}
    picked = {}
    for position in ("first_layer", "later_layers"):
        kernel = rule.get(position)
        picked[position] = kernel if kernel in ("materialized", "fused", "bias") else DEFAULT_CUDA_RULE[position]
    where = record.get("device", "a GPU") if isinstance(record, dict) else "a GPU"
    return picked, f"rule measured on {where} ({path})"


_LOGGED_RULES = set()


def cuda_kernel_rule() -> Dict[str, str]:
    """``{"first_layer": kernel, "later_layers": kernel}`` for ``auto`` on CUDA (logged once)."""
    path, which = kernel_rule_source()
    rule, origin = _read_kernel_rule(path)
    if path not in _LOGGED_RULES:
        _LOGGED_RULES.add(path)
        logger.info("residual attention kernel 'auto' on CUDA: first layer of a path %s, later layers %s (%s; %s)",
                    rule["first_layer"], rule["later_layers"], origin, which)
    return rule
