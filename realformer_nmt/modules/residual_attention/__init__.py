"""RealFormer's residual attention, as one extension of fairseq's MultiheadAttention.

Layer n of a path adds its raw scores to the running sum handed over by the previous
layer of the path and attends with the softmax of that sum (He et al., 2021, eq. 3)::

    A_n = Q_n K_n^T / sqrt(d_head) + A_{n-1}          [B, H, T, S]
    P_n = softmax(mask(A_n / c_n)),  c_n = 1 (sum) or n (mean)
    out = P_n V_n

``n`` counts the layers whose scores are in the sum (a layer skipped by layerdrop adds
nothing and is not counted). The *unmasked* running sum ``A_n`` goes on to the next layer,
as in the official reference (google-research ``realformer/realformer.py``): masks are
applied after the residual is added, never accumulated.

One concept per file: ``state.py`` (:class:`ResidualState`, what a layer hands on, the
caller's :class:`ResidualPath` it travels in, the sum/mean rule); ``module.py``
(:class:`ResidualMultiheadAttention`, which picks the kernel of each call); the kernels
``materialized.py``, ``bias.py`` and ``triton_kernel.py`` (whose Triton code, ``triton.py``,
is imported only when it runs); ``masks.py`` (:class:`MaskFacts`, the facts of a batch's
masks the SDPA and triton kernels branch on, read once per forward where the masks are
built); ``choice.py`` (what ``auto`` runs); ``sdpa_probe.py`` (which SDPA backend returns
a mask's gradient).

Kernels (``--residual-attention-kernel``), all computing the same function:

* ``materialized``: the float32 ``[B, H, T, S]`` running sum handed from layer to layer,
  an explicit softmax (the reference; cached decoding and asked-for attention weights
  always run it: one query row per step flows between layers);
* ``bias``: layer n is one SDPA call with ``A_{n-1} / c_n + mask`` as its additive mask
  (restricted, when the mask needs a gradient, to a backend that returns it; a refused
  call runs ``materialized``); ``A_n`` is formed by the next layer that asks for it;
* ``triton``: flash-style kernels that read ``A_{n-1}`` and write ``A_n`` (float32), with
  padding, the causal mask and attention dropout inside; backward rebuilds ``A_n``. Where
  it does not apply, a call runs what ``auto`` would without it, said once;
* ``auto`` (default): :func:`auto_kernel`: ``materialized`` on CPU; on CUDA ``triton``
  wherever it applies, else the measured rule.

Query rows that see no real key (the first rows of a left-padded target under the causal
mask) attend uniformly to the padded keys they may see, in every kernel, and send no
gradient back (docs/performance.md has the kernels' measurements and memory).
"""

from .choice import (
    DEFAULT_CUDA_RULE,
    KERNELS,
    PACKAGED_KERNEL_RULE,
    auto_kernel,
    cuda_kernel_rule,
    kernel_rule_source,
)
from .masks import MaskFacts
from .module import IncrementalState, KernelNotes, ResidualMultiheadAttention, share_kernel_notes
from .sdpa_probe import bias_has_fused_backend, mask_grad_backends
from .state import RESIDUAL_MODES, ResidualPath, ResidualState, divisor

__all__ = [
    "DEFAULT_CUDA_RULE",
    "IncrementalState",
    "KernelNotes",
    "KERNELS",
    "MaskFacts",
    "PACKAGED_KERNEL_RULE",
    "RESIDUAL_MODES",
    "ResidualMultiheadAttention",
    "ResidualPath",
    "ResidualState",
    "auto_kernel",
    "bias_has_fused_backend",
    "cuda_kernel_rule",
    "divisor",
    "kernel_rule_source",
    "mask_grad_backends",
    "share_kernel_notes",
]
