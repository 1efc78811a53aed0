"""RealFormer's residual attention, as one extension of fairseq's MultiheadAttention.

Layer n of a path adds its raw scores to the running sum handed over by the previous
layer of the path and attends with the softmax of that sum (He et al., 2021, eq. 3)::

    A_n = Q_n K_n^T / sqrt(d_head) + A_{n-1}          [B, H, T, S]
    P_n = softmax(mask(A_n / c_n)),  c_n = 1 (sum) or n (mean)
    out = P_n V_n

``n`` counts the layers whose scores are in the sum: a layer skipped by layerdrop adds
nothing and is not counted, so training with layerdrop, a pruned model
(``--*-layers-to-keep``) and the full model all compute the paper's running mean.

The *unmasked* running sum ``A_n`` is what goes on to the next layer, as in the official
reference (google-research ``realformer/realformer.py``): masks are applied after the
residual is added, never accumulated.

Everything RealFormer-specific about attention lives in this package, one concept per file:

* ``state.py``: :class:`ResidualState` (what a layer hands to the next) and the sum/mean rule;
* ``module.py``: :class:`ResidualMultiheadAttention`, which picks the kernel of each call;
* ``materialized.py``, ``fused.py``, ``bias.py``: the kernels (below); ``triton_kernel.py``
  the ``triton`` kernel's module side (where it applies, its fallback), ``triton.py`` its
  Triton kernels (imported only when it runs: triton is optional);
* ``masks.py``: :class:`MaskFacts`, the facts of a batch's masks the SDPA kernels branch
  on, established once per forward by whoever builds the masks; SDPA's masks; the rows
  that see no real key;
* ``choice.py``: what ``auto`` runs (:func:`auto_kernel`) and the measured CUDA rule file;
* ``sdpa_probe.py``: which SDPA backend takes ``bias``'s mask with its gradient.

Kernels (``--residual-attention-kernel``); all compute the same function:

* ``materialized``: the running sum is a ``[B, H, T, S]`` float32 tensor handed from layer
  to layer (fp16/bf16 logits are summed in float32: 48 layers of fp16 logits overflow);
  the softmax is formed explicitly, so its ``T x S`` probabilities are stored for backward.
* ``bias``: layer n calls PyTorch's ``scaled_dot_product_attention`` (SDPA) with the
  previous layers' sum as an additive mask, ``softmax(q k^T / c_n + B_n) v`` with
  ``B_n = A_{n-1} / c_n + mask``, and hands ``A_n = A_{n-1} + Q_n K_n^T / sqrt(d)`` on,
  formed with one float32 ``baddbmm`` only when the next layer asks for it (the last layer
  of a path never does). When the mask needs a gradient (training), the SDPA call is
  restricted (``torch.nn.attention.sdpa_kernel``) to a backend that returns it: on CUDA
  only the memory-efficient kernel (cuDNN attention returns no mask gradient), so per layer
  one ``T x S`` bias in the input dtype is stored instead of the float32 sum plus
  probabilities; the running sum itself stays float32. If that backend refuses a call,
  the call runs ``materialized`` (logged once), never a kernel that loses the gradient. On
  CPU, SDPA's math kernel runs such a call (same function, materialized's cost).
* ``fused``: since ``A_n = sum_i Q_i K_i^T / sqrt(d) = [Q_1 .. Q_n] [K_1 .. K_n]^T / sqrt(d)``,
  the path carries the projected queries and keys of its layers (``[B, H, T, d]`` and
  ``[B, H, S, d]`` each) and layer n is one call of SDPA on them side by side (query/key
  head dim ``n*d``): no ``T x S`` score or probability tensor is ever stored. The sum over
  layers is part of the kernel's dot product, accumulated in float32 by SDPA's fused
  kernels (flash / memory-efficient) whatever the input dtype. For n > 1 the call is
  recomputed in backward (``torch.utils.checkpoint``) instead of keeping its
  ``n*d``-wide inputs, so what a path stores grows with its depth as one ``[B, H, T, d]``
  query and key per layer, the tensors the projections produce anyway. On CPU,
  PyTorch's fused kernel needs equal query and value head dims, so values are
  zero-padded to ``n*d`` there (their extra output columns are zeros and dropped).
* ``triton``: flash-style Triton kernels that read ``A_{n-1}``, write ``A_n`` (float32,
  raw and unmasked, the state handed on, as ``materialized``'s) and apply padding and the
  causal mask and attention dropout inside; a path stores every second ``A_n`` (never its
  last) and two per-row statistics per layer, no probabilities: backward rebuilds ``A_n``
  bit for bit (``triton.py``). Where it does not apply (no triton, float64 on CUDA, another
  ``attn_mask`` than fairseq's causal one; on CPU outside Triton's interpreter) a call runs
  what ``auto`` would without it, said once.
* ``auto`` (default): per layer and call, :func:`auto_kernel` (the rule and the
  measurements behind it are written there); on CUDA ``triton`` wherever it applies.

No kernel reads a tensor's value on the host per layer (each read stalls a GPU's launch
queue): what ``fused`` and ``bias`` branch on (is ``attn_mask`` fairseq's causal mask, are
the keys right-padded, the shortest length, rows with no visible key) is a
:class:`MaskFacts`, established with one host read per forward where the masks are built
(the decoder, for its self path; padding alone needs none) and handed to every layer.

Calls that need ``T x S`` tensors anyway use ``materialized`` whatever the setting:
cached decoding (one query row per step: only that row of scores flows between layers,
which is cheap) and calls that return attention weights (``--print-alignment``, analysis).
A path can go from fused to materialized or bias (``A_n = Q K^T`` is formed once), never
back.

Query rows that see no real key (every key they may attend to is padding: the first rows
of a left-padded target under the causal mask) attend uniformly to the padded keys they may
see, in every kernel; their output is a constant of the scores, so no kernel sends a
gradient from them to the queries, keys or earlier layers' scores (SDPA would, through an
additive mask that only rounds the scores away: those rows are recomputed from detached
scores where they occur).
"""

from .choice import (
    DEFAULT_CUDA_RULE,
    FUSED_MAX_TERMS,
    KERNELS,
    PACKAGED_KERNEL_RULE,
    auto_kernel,
    cuda_kernel_rule,
    kernel_rule_source,
    use_cuda_kernel_rule,
)
from .masks import MaskFacts
from .module import IncrementalState, ResidualMultiheadAttention
from .sdpa_probe import bias_has_fused_backend, mask_grad_backends
from .state import RESIDUAL_MODES, ResidualPath, ResidualState, divisor

__all__ = [
    "DEFAULT_CUDA_RULE",
    "FUSED_MAX_TERMS",
    "IncrementalState",
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
    "use_cuda_kernel_rule",
]
