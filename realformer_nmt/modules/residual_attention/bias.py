"""The ``bias`` kernel: layer n is one SDPA call with the previous layers' sum as its
additive mask, ``softmax(q k^T / c_n + B_n) v`` with ``B_n = A_{n-1} / c_n + mask``."""

import contextlib
import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import sdpa_probe
from .masks import MaskFacts, sdpa_mask, uniform_rows_without_real_keys
from .state import ResidualState

logger = logging.getLogger(__name__)


class BiasKernel:
    """The ``bias`` kernel, a part of :class:`ResidualMultiheadAttention` (its first layer of
    a path is plain SDPA; a call SDPA refuses runs materialized)."""

    def _bias_forward(self, query, key, value, key_padding_mask, attn_mask, prev_state, facts: MaskFacts):
        if prev_state is None:  # nothing to add yet
            return self._first_layer_forward(query, key, value, key_padding_mask, attn_mask, facts)
        tgt_len, bsz, _ = query.size()
        q, k, v = self._project(query, key, value)  # [B, H, T|S, d]; q scaled by 1/sqrt(d)
        prev = prev_state.running_sum()  # A_{n-1}, float32 (one baddbmm after a bias layer)
        expected = (bsz, self.num_heads, tgt_len, k.size(2))
        if tuple(prev.shape) != expected:
            raise ValueError(f"the previous layer's scores have shape {tuple(prev.shape)}, expected {expected} "
                             "(batch x heads x tgt_len x src_len of this layer)")
        terms = prev_state.terms + 1
        divisor = self._divisor(terms)
        bias = _additive_bias(prev, divisor, key_padding_mask, attn_mask, q.dtype, facts.future)
        # a mask that needs a gradient: only a backend that returns it (see mask_grad_backends)
        restricted = bias.requires_grad
        if restricted:
            from torch.nn.attention import sdpa_kernel
        try:
            with sdpa_kernel(sdpa_probe.mask_grad_backends(q.device)) if restricted else contextlib.nullcontext():
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self._dropout_p(),
                                                     scale=1.0 / divisor)
        except RuntimeError as exc:
            if not (restricted and _is_no_kernel_error(exc)):
                raise
            self.notes.say(logging.WARNING, "bias kernel on %s: SDPA's %s backend refused a call whose mask needs a "
                           "gradient (%s); such calls run materialized (said once per model)", q.device,
                           "/".join(b.name for b in sdpa_probe.mask_grad_backends(q.device)), str(exc).splitlines()[0],
                           log=logger)
            return self._materialized_forward(query, key, value, key_padding_mask, None, False, False,
                                              attn_mask, False, prev_state)
        out = uniform_rows_without_real_keys(out, v, key_padding_mask, facts, self._dropout_p())
        output = self._project_out(out, tgt_len, bsz)
        # A_n = A_{n-1} + q k^T is formed by the next layer that asks for it
        return output, None, ResidualState(scores=prev, queries=(q,), keys=(k,), terms=terms)

    def _first_layer_forward(self, query, key, value, key_padding_mask, attn_mask, facts: MaskFacts):
        """The first layer of a path: SDPA on this layer's scores; its queries and keys are handed on."""
        tgt_len, bsz, _ = query.size()
        q, k, v = self._project(query, key, value)  # [B, H, T|S, d]; q scaled by 1/sqrt(d)
        mask, causal, padded_keys = sdpa_mask(key_padding_mask, attn_mask, q.dtype, tgt_len, k.size(2), facts)
        dropout_p = self._dropout_p()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout_p,
                                             scale=1.0)  # q carries 1/sqrt(d)
        if padded_keys is not None:
            # padded query rows see padded keys under is_causal: redo them (docs/internals.md#masks)
            first = facts.shortest
            key_mask = torch.zeros(padded_keys.shape, dtype=q.dtype, device=q.device).masked_fill(
                padded_keys, torch.finfo(q.dtype).min)[:, None, None, :]
            tail = F.scaled_dot_product_attention(q[:, :, first:], k, v, attn_mask=key_mask, dropout_p=dropout_p,
                                                  scale=1.0)
            padded_rows = padded_keys[:, None, first:, None]  # self-attention: query i is key i
            out = torch.cat([out[:, :, :first], torch.where(padded_rows, tail, out[:, :, first:])], dim=2)
        out = uniform_rows_without_real_keys(out, v, key_padding_mask, facts, dropout_p)
        return self._project_out(out, tgt_len, bsz), None, ResidualState(queries=(q,), keys=(k,), terms=1)


def _additive_bias(prev: Tensor, divisor: float, key_padding_mask: Optional[Tensor],
                   attn_mask: Optional[Tensor], dtype: torch.dtype, causal_mask: bool = False) -> Tensor:
    """``B_n = A_{n-1} / c_n + mask`` in the input dtype, ``[B, H, T, S]``, padded keys replaced by the
    dtype's most negative finite value; ``causal_mask``: ``attn_mask`` is fairseq's future mask
    (docs/internals.md#the-bias-kernel)."""
    if divisor == 1.0 and dtype != prev.dtype and (attn_mask is None or causal_mask):
        bias = prev.to(dtype)  # a copy: never written into A_{n-1}
        if attn_mask is not None:
            bias.masked_fill_(torch.isneginf(attn_mask), float("-inf"))
    elif divisor != 1.0:
        bias = prev / divisor
        if attn_mask is not None:
            bias.add_(attn_mask.to(bias.dtype))
    elif attn_mask is not None:
        bias = prev + attn_mask.to(prev.dtype)
    else:
        bias = prev.clone() if key_padding_mask is not None else prev  # never written into A_{n-1}
    if key_padding_mask is not None:
        bias.masked_fill_(key_padding_mask.to(torch.bool)[:, None, None, :], torch.finfo(dtype).min)
    return bias.to(dtype)


def _is_no_kernel_error(exc: RuntimeError) -> bool:
    message = str(exc)
    return "No available kernel" in message or "No viable backend" in message
