"""Transformer layers that thread residual attention scores, and nothing else.

They are fairseq's ``TransformerEncoderLayerBase`` / ``TransformerDecoderLayerBase``
(same sub-modules, parameter names and Post-LN/Pre-LN switch) whose attention
modules are :class:`ResidualMultiheadAttention`. ``forward`` takes the previous
layer's scores for each path and returns this layer's next to the hidden states.
"""

from typing import Dict, List, Optional

import torch
from torch import Tensor

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from .residual_attention import ResidualMultiheadAttention


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's ``build_*_layer`` do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # a checkpointed layer is always wrapped by FSDP, whatever its size
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def build_attention(layer, embed_dim, cfg, heads, xformers_att_config, residual_args, **kwargs):
    """A ResidualMultiheadAttention with fairseq's dropout and quant-noise settings."""
    return ResidualMultiheadAttention(
        embed_dim,
        heads,
        dropout=cfg.attention_dropout,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
        xformers_att_config=xformers_att_config,
        **residual_args,
        **kwargs,
    )


def feed_forward(layer, x: Tensor) -> Tensor:
    """The position-wise FFN sub-block with its residual and layer norm (fairseq's)."""
    residual = x
    if layer.normalize_before:
        x = layer.final_layer_norm(x)
    x = layer.activation_fn(layer.fc1(x))
    x = layer.activation_dropout_module(x)
    if getattr(layer, "ffn_layernorm", None) is not None:
        x = layer.ffn_layernorm(x)
    x = layer.fc2(x)
    x = layer.dropout_module(x)
    if getattr(layer, "w_resid", None) is not None:
        residual = torch.mul(layer.w_resid, residual)
    x = layer.residual_connection(x, residual)
    if not layer.normalize_before:
        x = layer.final_layer_norm(x)
    return x


class RealFormerEncoderLayer(TransformerEncoderLayerBase):
    """Encoder layer: ``(x, prev_scores) -> (x, scores)`` on the encoder self path."""

    def __init__(self, cfg, residual: bool = False, mode: str = "sum", layer_number: int = 1):
        # read by build_self_attention, which fairseq's __init__ calls
        self._residual_args = dict(residual=residual, mode=mode, layer_number=layer_number)
        super().__init__(cfg)

    def build_self_attention(self, embed_dim, cfg):
        return build_attention(
            self, embed_dim, cfg, cfg.encoder.attention_heads, cfg.encoder.xformers_att_config,
            self._residual_args, self_attention=True,
        )

    def forward(
        self,
        x: Tensor,
        encoder_padding_mask: Optional[Tensor],
        attn_mask: Optional[Tensor] = None,
        prev_scores: Optional[Tensor] = None,
    ):
        """``x``: ``[T, B, C]``; ``prev_scores``: ``[B, H, T, T]`` or None.
        Returns ``(x, scores)``; scores is None off the residual path."""
        if attn_mask is not None:
            # fairseq's convention: 1 = masked, turned into a large finite negative
            attn_mask = attn_mask.masked_fill(
                attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4
            )
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _, scores = self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=encoder_padding_mask,
            need_weights=False,
            attn_mask=attn_mask,
            prev_scores=prev_scores,
        )
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        return feed_forward(self, x), scores


class RealFormerDecoderLayer(TransformerDecoderLayerBase):
    """Decoder layer: two paths, ``prev_self_scores`` and ``prev_cross_scores`` in,
    this layer's ``self_scores`` and ``cross_scores`` out."""

    def __init__(
        self,
        cfg,
        no_encoder_attn: bool = False,
        self_residual: bool = False,
        cross_residual: bool = False,
        mode: str = "sum",
        layer_number: int = 1,
    ):
        self._self_residual_args = dict(residual=self_residual, mode=mode, layer_number=layer_number)
        self._cross_residual_args = dict(residual=cross_residual, mode=mode, layer_number=layer_number)
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return build_attention(
            self, embed_dim, cfg, cfg.decoder.attention_heads, cfg.decoder.xformers_att_config,
            self._self_residual_args, self_attention=True,
            add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return build_attention(
            self, embed_dim, cfg, cfg.decoder.attention_heads, cfg.encoder.xformers_att_config,
            self._cross_residual_args, encoder_decoder_attention=True,
            kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
        )

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state: Optional[List[Tensor]] = None,
        prev_attn_state: Optional[List[Tensor]] = None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
        prev_self_scores: Optional[Tensor] = None,
        prev_cross_scores: Optional[Tensor] = None,
    ):
        """As fairseq's decoder layer, plus the two score paths.

        ``self_attn_padding_mask`` is ``[B, S]`` over all self-attention keys (cached
        ones included). Returns ``(x, attn, self_attn_state, self_scores, cross_scores)``.
        """
        if need_head_weights:
            need_attn = True

        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        if prev_self_attn_state is not None:
            _restore_attn_state(self.self_attn, incremental_state, prev_self_attn_state)
        x, _, self_scores = self.self_attn(
            query=x,
            key=x,
            value=x,
            key_padding_mask=self_attn_padding_mask,
            incremental_state=incremental_state,
            need_weights=False,
            attn_mask=self_attn_mask,
            prev_scores=prev_self_scores,
        )
        if self.c_attn is not None:
            tgt_len, bsz = x.size(0), x.size(1)
            x = x.view(tgt_len, bsz, self.nh, self.head_dim)
            x = torch.einsum("tbhd,h->tbhd", x, self.c_attn)
            x = x.reshape(tgt_len, bsz, self.embed_dim)
        if self.attn_ln is not None:
            x = self.attn_ln(x)
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        attn: Optional[Tensor] = None
        cross_scores: Optional[Tensor] = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            if prev_attn_state is not None:
                _restore_attn_state(self.encoder_attn, incremental_state, prev_attn_state)
            x, attn, cross_scores = self.encoder_attn(
                query=x,
                key=encoder_out,
                value=encoder_out,
                key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state,
                static_kv=True,
                need_weights=need_attn or (not self.training and self.need_attn),
                need_head_weights=need_head_weights,
                prev_scores=prev_cross_scores,
            )
            x = self.dropout_module(x)
            x = self.residual_connection(x, residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)

        x = feed_forward(self, x)

        self_attn_state = None
        if self.onnx_trace and incremental_state is not None:
            saved = self.self_attn._get_input_buffer(incremental_state)
            self_attn_state = [saved["prev_key"], saved["prev_value"]]
            if self_attn_padding_mask is not None:
                self_attn_state.append(saved["prev_key_padding_mask"])
        return x, attn, self_attn_state, self_scores, cross_scores


def _restore_attn_state(attn_module, incremental_state, state: List[Tensor]):
    """Seed an attention module's key/value cache from ``[prev_key, prev_value(, mask)]``."""
    assert incremental_state is not None
    saved: Dict[str, Optional[Tensor]] = {"prev_key": state[0], "prev_value": state[1]}
    if len(state) >= 3:
        saved["prev_key_padding_mask"] = state[2]
    attn_module._set_input_buffer(incremental_state, saved)
