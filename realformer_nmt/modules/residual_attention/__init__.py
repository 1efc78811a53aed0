"""RealFormer's residual attention, as one extension of fairseq's MultiheadAttention.

Layer n of a path adds its raw scores to the running sum handed over by the previous
layer of the path and attends with the softmax of that sum (He et al., 2021, eq. 3)::

    A_n = Q_n K_n^T / sqrt(d_head) + A_{n-1}          [B, H, T, S]
    P_n = softmax(mask(A_n / c_n)),  c_n = 1 (sum) or n (mean)
    out = P_n V_n

The *unmasked* running sum ``A_n`` goes on to the next layer, as in the official reference
(google-research ``realformer/realformer.py``): masks are applied after the residual is
added, never accumulated. Kernels ``materialized``, ``bias``, ``triton`` (``auto`` picks)
compute the same function (docs/internals.md#kernels). One concept per file: ``state.py`` (the
state, the sum/mean rule), ``module.py`` (the module, the kernel per call), the kernels
``materialized.py``, ``bias.py``, ``triton_kernel.py`` (``triton.py``: its Triton code),
``masks.py``, ``choice.py`` (what ``auto`` runs), ``sdpa_probe.py``; ``value_residual.py``: value
residual (ResFormer), the first layer's values mixed into every later layer's of a path.
"""

from .choice import DEFAULT_CUDA_RULE, KERNELS, PACKAGED_KERNEL_RULE, auto_kernel, cuda_kernel_rule, kernel_rule_source
from .masks import MaskFacts
from .module import KernelNotes, ResidualMultiheadAttention, share_kernel_notes
from .sdpa_probe import bias_has_fused_backend, mask_grad_backends
from .state import RESIDUAL_MODES, ResidualPath, ResidualState, divisor
from .value_residual import VALUE_MIXES, ValueResidual

__all__ = [
    "DEFAULT_CUDA_RULE", "KernelNotes", "KERNELS", "MaskFacts", "PACKAGED_KERNEL_RULE", "RESIDUAL_MODES",
    "ResidualMultiheadAttention", "ResidualPath", "ResidualState", "auto_kernel", "bias_has_fused_backend",
    "cuda_kernel_rule", "divisor", "kernel_rule_source", "mask_grad_backends", "share_kernel_notes", "VALUE_MIXES",
    "ValueResidual",
]
