"""The ``materialized`` kernel: the running sum is a ``[B, H, T, S]`` float32 tensor, the
softmax is formed explicitly (fairseq's projections, cache and beam sharing)."""

from typing import Optional

import torch
from fairseq import utils
from fairseq.modules import MultiheadAttention
from torch import Tensor

from .state import ResidualState, sum_dtype


def cache_for_scores(incremental_state):
    """The ``incremental_state`` for fairseq's forward with ``before_softmax=True``: a new, empty one
    per uncached call, else fairseq would take its fused path (docs/internals.md#the-materialized-kernel)."""
    return incremental_state if incremental_state is not None else {}


class MaterializedKernel:
    """The ``materialized`` kernel, a part of :class:`ResidualMultiheadAttention` (which is
    fairseq's ``MultiheadAttention``)."""

    def _materialized_forward(self, query, key, value, key_padding_mask, incremental_state, need_weights, static_kv,
                              attn_mask, need_head_weights, prev_state):
        tgt_len, bsz, _ = query.size()
        # fairseq's projections, key/value cache and beam sharing, stopped before its
        # masks and softmax (applied below, over every key, with the running sum)
        logits, v = MultiheadAttention.forward(self, query, key, value, key_padding_mask=None,
                                               incremental_state=cache_for_scores(incremental_state),
                                               need_weights=False, static_kv=static_kv, attn_mask=None,
                                               before_softmax=True)
        src_len = logits.size(-1)
        scores = logits.view(bsz, self.num_heads, tgt_len, src_len).to(sum_dtype(logits.dtype))
        terms = 1
        own = scores.clone() if self.need_own_weights else None  # before the residual is added in place
        if prev_state is not None:
            prev = prev_state.running_sum()
            if prev.shape != scores.shape:
                raise ValueError(f"the previous layer's scores have shape {tuple(prev.shape)}, expected "
                                 f"{tuple(scores.shape)} (batch x heads x tgt_len x src_len of this layer)")
            # in place: these fresh logits are not needed by autograd (bmm keeps q and k)
            scores = scores.add_(prev)
            terms += prev_state.terms
        probs = self._masked_softmax(scores, key_padding_mask, attn_mask, self._divisor(terms))
        if own is not None:  # the same masks, no running sum, no divisor
            self.own_weights = self._masked_softmax(own, key_padding_mask, attn_mask, 1.0).detach().transpose(1, 0)
        output = self._attend(probs.type_as(v), v, tgt_len, bsz)

        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs.transpose(1, 0)  # [H, B, T, S], as fairseq returns them
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return output, weights, ResidualState(scores=scores, terms=terms)

    def _masked_softmax(self, scores: Tensor, key_padding_mask: Optional[Tensor],
                        attn_mask: Optional[Tensor], divisor: float) -> Tensor:
        """softmax(mask(A_n / c_n)) in the sum's dtype; a row with every key padded is uniform, not NaN."""
        # ``scores`` is passed on unmasked: the first op makes a copy, later ones work in it
        logits = scores
        if divisor != 1.0:
            logits = logits / divisor
        if attn_mask is not None:
            mask = attn_mask.to(logits.dtype)
            logits = logits + mask if logits is scores else logits.add_(mask)
        if key_padding_mask is not None:
            pad = key_padding_mask.to(torch.bool)[:, None, None, :]
            fill = logits.masked_fill if logits is scores else logits.masked_fill_
            logits = fill(pad, torch.finfo(logits.dtype).min)
        if logits.dtype == torch.float64:  # fairseq's softmax is float32; a float64 model stays float64
            return torch.softmax(logits, dim=-1)
        return utils.softmax(logits, dim=-1, onnx_trace=self.onnx_trace)

    def _attend(self, probs: Tensor, v: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """Dropout, ``P V`` and the output projection; ``probs`` is ``[B, H, T, S]``."""
        probs = self.dropout_module(probs)
        kv_bsz = v.size(0) // self.num_heads
        if kv_bsz != bsz:
            # Beam search shares one encoder copy per sentence (fairseq's set_beam_size).
            attn = torch.einsum("bxhts,bhsd->bxhtd", probs.view((kv_bsz, -1) + probs.shape[1:]),
                                v.view(kv_bsz, self.num_heads, -1, self.head_dim))
        else:
            attn = torch.matmul(probs, v.view(bsz, self.num_heads, -1, self.head_dim))
        return self._project_out(attn, tgt_len, bsz)
