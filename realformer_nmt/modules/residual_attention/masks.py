"""The masks as the SDPA kernels need them: the facts of a batch's masks, established
once per forward (:class:`MaskFacts`), SDPA's mask for them, and the rows that see no real key."""

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


class MaskFacts(NamedTuple):
    """What the SDPA and triton kernels branch on about the masks of a path, established once per
    forward (``causal``, ``shortest``, ``dead_rows`` ``[B, 1, T, 1]``, ``future``;
    docs/internals.md#masks)."""

    causal: bool = False
    shortest: Optional[int] = None
    dead_rows: Optional[Tensor] = None
    future: bool = False

    @classmethod
    def of(cls, key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor]) -> "MaskFacts":
        """The facts of ``key_padding_mask`` (``[B, S]``, True at padded keys) and ``attn_mask``
        (additive ``[T, S]``), with one host read at most (none with padding alone or compiling)."""
        if attn_mask is None:
            return cls()
        pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
        dead = None
        if pad is not None:  # [B, T]: no key both real and allowed by attn_mask
            dead = ~(~pad[:, None, :] & ~torch.isneginf(attn_mask)[None]).any(dim=-1)
        if torch.compiler.is_compiling():
            return cls(dead_rows=None if dead is None else dead[:, None, :, None])
        checks = []  # 0-dim integer tensors, read together
        square = attn_mask.dim() == 2 and attn_mask.size(0) == attn_mask.size(1)
        if square:
            future = torch.ones(attn_mask.shape, dtype=torch.bool, device=attn_mask.device).triu(1)
            checks.append(torch.isneginf(attn_mask).eq(future).all() & attn_mask.masked_fill(future, 0).eq(0).all())
        if pad is not None:
            checks += [(pad[:, 1:] | ~pad[:, :-1]).all(),  # right padding: real keys, then padding
                       (~pad).sum(-1).min(), dead.any()]
        values = torch.stack([c.long() for c in checks]).tolist()  # the one host read
        causal = bool(values[0]) if square else False
        if pad is None:
            return cls(causal=causal, future=causal)
        right_padded, shortest, any_dead = values[-3:]
        return cls(causal=causal and bool(right_padded), shortest=int(shortest),
                   dead_rows=dead[:, None, :, None] if any_dead else None, future=causal)


def sdpa_mask(key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor], dtype: torch.dtype,
              tgt_len: int, src_len: int, facts: MaskFacts) -> Tuple[Optional[Tensor], bool, Optional[Tensor]]:
    """``(attn_mask, is_causal, padded_keys)`` for SDPA, with the materialized kernel's semantics at
    every position; rows of padded queries under ``is_causal`` are redone from ``padded_keys``."""
    if facts.causal and attn_mask is not None and attn_mask.shape == (tgt_len, src_len):
        padded = key_padding_mask is not None and facts.shortest is not None and facts.shortest < src_len
        return None, True, (key_padding_mask.to(torch.bool) if padded else None)
    mask: Optional[Tensor] = None
    if attn_mask is not None:
        mask = attn_mask.to(dtype)
    if key_padding_mask is not None:
        pad = key_padding_mask.to(torch.bool)[:, None, None, :]
        if mask is None:
            mask = torch.zeros(pad.shape, dtype=dtype, device=pad.device)
        else:
            mask = mask.expand(pad.size(0), 1, tgt_len, src_len)
        mask = mask.masked_fill(pad, torch.finfo(dtype).min)
    return mask, False, None


def uniform_rows_without_real_keys(out: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                                   facts: MaskFacts, dropout_p: float) -> Tensor:
    """SDPA's ``out`` with the rows that see no real key replaced by the materialized kernel's: the
    uniform average of the padded keys' values, a constant of the scores."""
    dead = facts.dead_rows  # [B, 1, T, 1]
    if dead is None or key_padding_mask is None:
        return out
    if dead.size(0) != out.size(0) or dead.size(2) != out.size(2):
        raise ValueError(f"mask_facts.dead_rows has shape {tuple(dead.shape)}, expected "
                         f"({out.size(0)}, 1, {out.size(2)}, 1) (batch x 1 x tgt_len x 1 of this call)")
    weights = dead & key_padding_mask.to(torch.bool)[:, None, None, :]  # [B, 1, T, S]
    weights = weights.to(v.dtype)
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1)
    weights = F.dropout(weights, p=dropout_p, training=dropout_p > 0)
    return torch.where(dead, torch.matmul(weights, v), out)
