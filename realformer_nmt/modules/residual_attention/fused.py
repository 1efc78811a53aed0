"""The ``fused`` kernel: the path carries every layer's projected queries and keys, and
layer n is one call of SDPA on them side by side (``A_n = [Q_1 .. Q_n] [K_1 .. K_n]^T``)."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .masks import MaskFacts, sdpa_mask, uniform_rows_without_real_keys
from .state import ResidualState


class FusedKernel:
    """The ``fused`` kernel, a part of :class:`ResidualMultiheadAttention` (its projections,
    dropout and divisor)."""

    def _fused_forward(self, query, key, value, key_padding_mask, attn_mask, prev_state, facts: MaskFacts):
        tgt_len, bsz, _ = query.size()
        q, k, v = self._project(query, key, value)  # [B, H, T|S, d]; q scaled by 1/sqrt(d)
        queries, keys = (q,), (k,)
        if prev_state is not None:
            if prev_state.keys[0].shape != k.shape or prev_state.queries[0].shape != q.shape:
                raise ValueError(
                    f"the previous layer's queries/keys have shapes {tuple(prev_state.queries[0].shape)}"
                    f"/{tuple(prev_state.keys[0].shape)}, expected {tuple(q.shape)}/{tuple(k.shape)} "
                    "(batch x heads x length x head dim of this layer)"
                )
            queries, keys = prev_state.queries + queries, prev_state.keys + keys
        terms = len(queries)
        mask, causal, padded_keys = sdpa_mask(key_padding_mask, attn_mask, q.dtype, tgt_len, k.size(2), facts)
        args = (mask, causal, padded_keys, facts.shortest, self._dropout_p(), 1.0 / self._divisor(terms), terms)
        if terms > 1 and torch.is_grad_enabled():
            # recomputed in backward: autograd keeps the per-layer q/k, never their n*d-wide concatenation
            out = checkpoint(_stacked_attention, *args, *queries, *keys, v, use_reentrant=False)
        else:
            out = _stacked_attention(*args, *queries, *keys, v)
        out = uniform_rows_without_real_keys(out, v, key_padding_mask, facts, self._dropout_p())
        output = self._project_out(out, tgt_len, bsz)
        return output, None, ResidualState(queries=queries, keys=keys, terms=terms)


def _stacked_attention(mask: Optional[Tensor], causal: bool, padded_keys: Optional[Tensor],
                       shortest: Optional[int], dropout_p: float, scale: float, terms: int, *tensors: Tensor):
    """``softmax(scale * [q_1..q_n] [k_1..k_n]^T + mask) v`` with SDPA; ``tensors`` are
    ``q_1..q_n, k_1..k_n, v``. Returns ``[B, H, T, d]``.

    ``padded_keys`` ([B, S], right padding; only with ``causal``; its rows have at least
    ``shortest`` real keys, a fact of the batch: :class:`MaskFacts`): SDPA's causal kernel
    lets a padded query row see the padded keys up to its own position, which the
    materialized kernel masks. Nothing downstream reads those rows, but every kernel gives
    the same tensor: the rows from the shortest sentence's end on are attended again,
    non-causally over the real keys (what the materialized kernel computes for a padded
    query), and the padded ones taken from there. Cost: ``T - shortest`` extra rows."""
    q = torch.cat(tensors[:terms], dim=-1) if terms > 1 else tensors[0]
    k = torch.cat(tensors[terms:2 * terms], dim=-1) if terms > 1 else tensors[terms]
    v = _pad_values(tensors[-1], q.size(-1))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                         dropout_p=dropout_p, scale=scale)  # q carries 1/sqrt(d)
    if padded_keys is not None:
        first = shortest  # the shortest sentence's length
        key_mask = torch.zeros(padded_keys.shape, dtype=q.dtype, device=q.device).masked_fill(
            padded_keys, torch.finfo(q.dtype).min)[:, None, None, :]
        tail = F.scaled_dot_product_attention(q[:, :, first:], k, v, attn_mask=key_mask,
                                              dropout_p=dropout_p, scale=scale)
        padded_rows = padded_keys[:, None, first:, None]  # self-attention: query i is key i
        out = torch.cat([out[:, :, :first], torch.where(padded_rows, tail, out[:, :, first:])], dim=2)
    return out[..., : tensors[-1].size(-1)]


def _pad_values(v: Tensor, qk_dim: int) -> Tensor:
    """Zero-pad ``v`` to the query/key head dim where PyTorch's fused kernel needs it.

    PyTorch's CPU flash kernel takes only equal query and value head dims (otherwise SDPA
    falls back to its math kernel, which stores the ``T x S`` probabilities); the extra
    output columns are zeros and are dropped. CUDA kernels take unequal dims as they are.
    """
    extra = qk_dim - v.size(-1)
    if extra == 0 or v.device.type == "cuda":
        return v
    return F.pad(v, (0, extra))
