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
      ``1/sqrt(d)``) and keys of layers, one ``[B, H, T, d]`` / ``[B, H, S, d]`` tensor per
      layer (fused: every layer's; bias: this layer's).

    ``terms``: ``n``, the number of layers whose scores are in the sum (the divisor
    ``c_n`` of mean mode).
    """

    scores: Optional[Tensor] = None
    queries: Tuple[Tensor, ...] = ()
    keys: Tuple[Tensor, ...] = ()
    terms: int = 0

    @classmethod
    def of_scores(cls, scores: Tensor, terms: int = 1) -> "ResidualState":
        """A materialized state: ``scores`` is the running sum of ``terms`` layers."""
        return cls(scores=scores, terms=terms)

    @property
    def fused(self) -> bool:
        """Whether the sum is still factored into queries and keys (what ``fused`` needs)."""
        return self.scores is None

    def running_sum(self) -> Tensor:
        """``A_n`` as a float32 ``[B, H, T, S]`` tensor (float64 for a float64 model:
        :func:`sum_dtype`), whichever kernel produced it (also under autocast, which would
        otherwise run these products in half precision)."""
        device = (self.scores if self.scores is not None else self.queries[0]).device
        with torch.autocast(device_type=device.type, enabled=False):
            if self.scores is None:
                wide = sum_dtype(self.queries[0].dtype)
                q = torch.cat(self.queries, dim=-1).to(wide)
                k = torch.cat(self.keys, dim=-1).to(wide)
                return torch.matmul(q, k.transpose(-1, -2))
            total = self.scores
            for q, k in zip(self.queries, self.keys):
                bsz, heads, tgt_len, dim = q.shape
                total = torch.baddbmm(
                    total.reshape(bsz * heads, tgt_len, -1),
                    q.to(total.dtype).reshape(bsz * heads, tgt_len, dim),
                    k.to(total.dtype).reshape(bsz * heads, -1, dim).transpose(1, 2),
                ).view(bsz, heads, tgt_len, -1)
            return total
