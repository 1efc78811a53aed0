"""The residual state a path hands from layer to layer, and the sum/mean rule."""

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

RESIDUAL_MODES = ("sum", "mean")


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The running sum's dtype for inputs of ``dtype``: float32, or float64 for a float64 model."""
    return torch.promote_types(dtype, torch.float32)


def divisor(mode: str, terms: int) -> float:
    """``c_n`` of ``softmax(mask(A_n / c_n))``: 1 in ``sum`` mode, ``n`` = ``terms`` in ``mean`` mode."""
    return float(terms) if mode == "mean" else 1.0


class ResidualState(NamedTuple):
    """What one layer of a residual path hands to the same module of the next layer: the running
    sum ``A_n = scores + sum_i queries[i] @ keys[i]^T`` of ``terms`` layers, ``[B, H, T, S]``
    (docs/internals.md#the-residual-attention-rule; ``terms`` 0: no scores), and with value
    residual ``first_value``, the path's ``V_1`` (``value_residual.py``; None: off)."""

    scores: Optional[Tensor] = None
    queries: Tuple[Tensor, ...] = ()
    keys: Tuple[Tensor, ...] = ()
    terms: int = 0
    rebuild: Optional[tuple] = None
    first_value: Optional[Tensor] = None

    @classmethod
    def of_scores(cls, scores: Tensor, terms: int = 1) -> "ResidualState":
        """A materialized state: ``scores`` is the running sum of ``terms`` layers."""
        return cls(scores=scores, terms=terms)

    def running_sum(self) -> Tensor:
        """``A_n`` as a float32 ``[B, H, T, S]`` tensor (:func:`sum_dtype`), also under autocast."""
        device = (self.scores if self.scores is not None else self.queries[0]).device
        with torch.autocast(device_type=device.type, enabled=False):
            if self.scores is None:
                return ScoresInFloat32.apply(None, torch.cat(self.queries, dim=-1), torch.cat(self.keys, dim=-1))
            total = self.scores
            for q, k in zip(self.queries, self.keys):
                total = ScoresInFloat32.apply(total, q, k)
            return total


class ResidualPath:
    """One path's residual state through one attention call: ``forward(..., residual_path=path)``
    reads the previous layer's :class:`ResidualState` from ``path.state`` and leaves its own there."""

    __slots__ = ("state",)

    def __init__(self, state: Optional[ResidualState] = None):
        self.state = state


def _batched(x: Tensor) -> Tensor:
    """``[B, H, L, X]`` -> ``[B * H, L, X]`` (a copy where the layout needs one)."""
    return x.reshape(-1, x.size(-2), x.size(-1))


class ScoresInFloat32(torch.autograd.Function):
    """``total + q k^T`` (``total`` None: ``q k^T``) as a float32 ``[B, H, T, S]`` tensor from ``q``
    ``[B, H, T, d]`` and ``k`` ``[B, H, S, d]``, keeping only ``q`` and ``k`` for backward
    (docs/internals.md#the-running-sums-precision)."""

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
