"""The residual state a path hands from layer to layer, and the sum/mean rule."""

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

RESIDUAL_MODES = ("sum", "mean")


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The running sum's dtype for inputs of ``dtype``: float32, or float64 for a float64
    model (48 layers of fp16 logits can overflow; a float64 model stays float64, so that
    the kernels can be checked against each other in float64)."""
    return torch.promote_types(dtype, torch.float32)


def divisor(mode: str, terms: int) -> float:
    """``c_n`` of ``softmax(mask(A_n / c_n))``: 1 in ``sum`` mode, ``n`` (the number of
    layers whose scores are in ``A_n``) in ``mean`` mode. The undivided ``A_n`` is what a
    layer passes on."""
    return float(terms) if mode == "mean" else 1.0


class ResidualState(NamedTuple):
    """What one layer of a residual path hands to the same module of the next layer.

    The running sum is ``A_n = scores + sum_i queries[i] @ keys[i]^T``:

    * ``scores``: a ``[B, H, T, S]`` float32 (float64 model: float64) part of it, or None (materialized: all of
      ``A_n``; bias: ``A_{n-1}``; in cached decoding only the current step's rows, ``T = 1``);
    * ``queries``, ``keys``: terms not yet multiplied out, the projected queries (scaled by
      ``1/sqrt(d)``) and keys of a layer, ``[B, H, T, d]`` / ``[B, H, S, d]`` (bias: this
      layer's).

    ``terms``: ``n``, the number of layers whose scores are in the sum (the divisor
    ``c_n`` of mean mode). ``rebuild``: the triton kernel's record of how its backward rebuilds
    ``scores`` (None from the other kernels).
    """

    scores: Optional[Tensor] = None
    queries: Tuple[Tensor, ...] = ()
    keys: Tuple[Tensor, ...] = ()
    terms: int = 0
    rebuild: Optional[tuple] = None

    @classmethod
    def of_scores(cls, scores: Tensor, terms: int = 1) -> "ResidualState":
        """A materialized state: ``scores`` is the running sum of ``terms`` layers."""
        return cls(scores=scores, terms=terms)

    def running_sum(self) -> Tensor:
        """``A_n`` as a float32 ``[B, H, T, S]`` tensor (float64 for a float64 model:
        :func:`sum_dtype`), whichever kernel produced it (also
        under autocast, which would otherwise run these products in half precision). The
        products are :class:`ScoresInFloat32`'s: no float32 copy of a query or key is kept."""
        device = (self.scores if self.scores is not None else self.queries[0]).device
        with torch.autocast(device_type=device.type, enabled=False):
            if self.scores is None:
                return ScoresInFloat32.apply(None, torch.cat(self.queries, dim=-1), torch.cat(self.keys, dim=-1))
            total = self.scores
            for q, k in zip(self.queries, self.keys):
                total = ScoresInFloat32.apply(total, q, k)
            return total


class ResidualPath:
    """One path's residual state through one attention call, in the caller's hands:
    ``ResidualMultiheadAttention.forward(..., residual_path=path)`` reads the previous
    layer's :class:`ResidualState` from ``path.state`` (None before the first layer) and
    leaves its own there, while returning fairseq's ``(attn, attn_weights)``. The module
    keeps no tensor: the state lives as long as the caller keeps the container."""

    __slots__ = ("state",)

    def __init__(self, state: Optional[ResidualState] = None):
        self.state = state


def _batched(x: Tensor) -> Tensor:
    """``[B, H, L, X]`` -> ``[B * H, L, X]`` (a copy where the layout needs one)."""
    return x.reshape(-1, x.size(-2), x.size(-1))


class ScoresInFloat32(torch.autograd.Function):
    """``total + q k^T`` (``total`` None: ``q k^T``) as a float32 ``[B, H, T, S]`` tensor
    (float64 for float64 inputs: :func:`sum_dtype`),
    from ``q`` ``[B, H, T, d]`` and ``k`` ``[B, H, S, d]`` in their own dtype, keeping only
    ``q`` and ``k`` themselves for backward (autograd of a product of float32 copies keeps
    the copies: per layer, two float32 tensors the size of q and k, until backward).

    The float32 product of the upcast inputs: on CUDA half-precision inputs go to the
    tensor cores with float32 accumulation and output (``out_dtype``; products of
    half-precision numbers are exact in float32), elsewhere they are upcast for the product
    only. Backward is the float32 product's: ``grad k`` and ``grad^T q`` in float32 on
    upcast inputs, cast to the inputs' dtype."""

    @staticmethod
    def forward(ctx, total, q, k):
        ctx.save_for_backward(q, k)
        shape = q.shape[:-1] + k.shape[-2:-1]
        q3, kt = _batched(q), _batched(k).transpose(1, 2)
        t3 = None if total is None else _batched(total)
        out = None
        if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            try:
                out = (torch.bmm(q3, kt, out_dtype=torch.float32) if t3 is None
                       else torch.baddbmm(t3, q3, kt, out_dtype=torch.float32))
            except (TypeError, RuntimeError, NotImplementedError):  # a torch without out_dtype
                out = None
        if out is None:
            wide = sum_dtype(q.dtype)
            out = torch.bmm(q3.to(wide), kt.to(wide)) if t3 is None else torch.baddbmm(t3, q3.to(wide), kt.to(wide))
        return out.view(shape)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors
        g3 = _batched(grad)
        grad_q = grad_k = None
        if ctx.needs_input_grad[1]:
            grad_q = torch.bmm(g3, _batched(k).to(g3.dtype)).to(q.dtype).view(q.shape)
        if ctx.needs_input_grad[2]:
            grad_k = torch.bmm(g3.transpose(1, 2), _batched(q).to(g3.dtype)).to(k.dtype).view(k.shape)
        return (grad if ctx.needs_input_grad[0] else None), grad_q, grad_k
