"""RealFormer's residual attention, as one extension of fairseq's MultiheadAttention.

Layer n of a path adds its raw scores to the running sum handed over by layer n-1
and attends with the softmax of that sum (He et al., 2021, eq. 3)::

    A_n = Q_n K_n^T / sqrt(d_head) + A_{n-1}          [B, H, T, S]
    P_n = softmax(mask(A_n / c_n)),  c_n = 1 (sum) or n (mean)
    out = P_n V_n

The *unmasked* running sum ``A_n`` is what goes on to layer n+1, as in the official
reference (google-research ``realformer/realformer.py``): masks are applied after
the residual is added, never accumulated.

Everything RealFormer-specific about attention lives in this file: the sum/mean
rule, where masks go, the dtype of the running sum, and the choice of kernel.
"""

from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq import utils
from fairseq.modules import MultiheadAttention

RESIDUAL_MODES = ("sum", "mean")
KERNELS = ("auto", "materialized", "fused")

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class ResidualMultiheadAttention(MultiheadAttention):
    """fairseq ``MultiheadAttention`` that threads RealFormer's residual scores.

    Parameters and incremental-state buffers are fairseq's own (``q_proj``,
    ``k_proj``, ``v_proj``, ``out_proj``; ``prev_key``/``prev_value``), so vanilla
    transformer checkpoints load unchanged.

    Args (beyond fairseq's):
        residual: this module is on a residual path: it adds ``prev_scores`` and
            returns its own scores. Off, it is exactly fairseq's module (same
            kernels, fused where fairseq fuses) and returns ``None`` scores.
        mode: ``"sum"`` or ``"mean"`` (divide the sum by ``layer_number``
            before the softmax; the undivided sum is still what is passed on).
        layer_number: 1-based position of this layer in its stack.
    """

    def __init__(
        self,
        *args,
        residual: bool = False,
        mode: str = "sum",
        layer_number: int = 1,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if mode not in RESIDUAL_MODES:
            raise ValueError(f"residual attention mode must be one of {RESIDUAL_MODES}, got {mode!r}")
        if layer_number < 1:
            raise ValueError(f"layer_number is 1-based, got {layer_number}")
        if residual and (self.bias_k is not None or self.add_zero_attn or self.use_xformers):
            # These change the key set per layer, so scores would not line up across layers.
            raise ValueError("residual attention does not support add_bias_kv, add_zero_attn or xformers")
        self.residual = residual
        self.mode = mode
        self.layer_number = layer_number

    def extra_repr(self) -> str:
        if not self.residual:
            return "residual=False"
        return f"residual=True, mode={self.mode}, layer_number={self.layer_number}"

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[IncrementalState] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        need_head_weights: bool = False,
        prev_scores: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
        """Input ``T x B x C`` as in fairseq; returns ``(output, weights, scores)``.

        Args:
            key_padding_mask: ``[B, S]``, True at padded keys. It covers *all*
                keys, cached ones included, also in incremental decoding.
            attn_mask: additive ``[T, S]`` mask (e.g. the causal mask).
            prev_scores: ``[B, H, T, S]`` running sum from the previous layer of
                this path (``None`` for the first layer). In cached decoding
                T is the current step's rows only.

        Returns:
            output ``[T, B, C]``; weights as fairseq's (``[B, T, S]`` averaged over
            heads, or ``[H, B, T, S]`` with ``need_head_weights``; ``None`` unless
            requested); scores ``[B, H, T, S]`` (float32 running sum ``A_n``,
            unmasked), ``None`` when this module is not on a residual path.
        """
        if not self.residual:
            if prev_scores is not None:
                raise ValueError("prev_scores given to an attention module that is not on a residual path")
            if incremental_state is not None and key_padding_mask is not None and not static_kv:
                # fairseq's cache wants only the new keys' mask; it appends the rest itself.
                key_padding_mask = key_padding_mask[:, -query.size(0):]
            output, weights = super().forward(
                query, key, value, key_padding_mask=key_padding_mask,
                incremental_state=incremental_state, need_weights=need_weights,
                static_kv=static_kv, attn_mask=attn_mask, need_head_weights=need_head_weights,
            )
            return output, weights, None
        return self._residual_forward(
            query, key, value, key_padding_mask, incremental_state,
            need_weights or need_head_weights, static_kv, attn_mask, need_head_weights, prev_scores,
        )

    def _residual_forward(
        self, query, key, value, key_padding_mask, incremental_state,
        need_weights, static_kv, attn_mask, need_head_weights, prev_scores,
    ):
        tgt_len, bsz, _ = query.size()
        # fairseq's projections, key/value cache and beam sharing, stopped before its
        # masks and softmax. Any state dict (even a throwaway empty one) keeps fairseq
        # off PyTorch's fused kernel, which cannot return scores.
        logits, v = super().forward(
            query, key, value, key_padding_mask=None,
            incremental_state=incremental_state if incremental_state is not None else {},
            need_weights=False, static_kv=static_kv, attn_mask=None, before_softmax=True,
        )
        src_len = logits.size(-1)
        # The running sum is kept in float32: 48 layers of fp16 logits can overflow.
        scores = logits.view(bsz, self.num_heads, tgt_len, src_len).float()
        if prev_scores is not None:
            if prev_scores.shape != scores.shape:
                raise ValueError(
                    f"prev_scores has shape {tuple(prev_scores.shape)}, expected {tuple(scores.shape)} "
                    "(batch x heads x tgt_len x src_len of this layer)"
                )
            # in place: these fresh logits are not needed by autograd (bmm keeps q and k)
            scores = scores.add_(prev_scores)
        probs = self._masked_softmax(scores, key_padding_mask, attn_mask)
        output = self._attend(probs.type_as(v), v, tgt_len, bsz)

        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs.transpose(1, 0)  # [H, B, T, S], as fairseq returns them
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return output, weights, scores

    def _masked_softmax(self, scores: Tensor, key_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor]) -> Tensor:
        """softmax(mask(A_n / c_n)) in float32. Padded keys get the most negative
        finite value, so a row with every key padded is uniform, not NaN."""
        # ``scores`` is passed on unmasked: the first op makes a copy, later ones work in it
        logits = scores
        if self.mode == "mean" and self.layer_number > 1:
            logits = logits / self.layer_number
        if attn_mask is not None:
            mask = attn_mask.to(logits.dtype)
            logits = logits + mask if logits is scores else logits.add_(mask)
        if key_padding_mask is not None:
            pad = key_padding_mask.to(torch.bool)[:, None, None, :]
            fill = logits.masked_fill if logits is scores else logits.masked_fill_
            logits = fill(pad, torch.finfo(logits.dtype).min)
        return utils.softmax(logits, dim=-1, onnx_trace=self.onnx_trace)

    def _attend(self, probs: Tensor, v: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """Dropout, ``P V`` and the output projection; ``probs`` is ``[B, H, T, S]``."""
        probs = self.dropout_module(probs)
        kv_bsz = v.size(0) // self.num_heads
        if kv_bsz != bsz:
            # Beam search shares one encoder copy per sentence (fairseq's set_beam_size).
            attn = torch.einsum(
                "bxhts,bhsd->bxhtd",
                probs.view((kv_bsz, -1) + probs.shape[1:]),
                v.view(kv_bsz, self.num_heads, -1, self.head_dim),
            )
        else:
            attn = torch.matmul(probs, v.view(bsz, self.num_heads, -1, self.head_dim))
        # [B, H, T, D] -> [T, B, H * D]
        attn = attn.reshape(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3)
        return self.out_proj(attn.reshape(tgt_len, bsz, self.embed_dim))
