"""fairseq's transformer layers with :class:`ResidualMultiheadAttention`, whose ``forward`` (a copy of
fairseq's) takes the previous layer's :class:`ResidualState` per path and returns this layer's
(docs/internals.md#layers-and-loops)."""

import contextlib
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from .dropout_names import use_fairseq_dropout_names
from .residual_attention import MaskFacts, ResidualMultiheadAttention, ResidualPath, ResidualState


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's ``build_*_layer`` do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_layer(layer, offload_to_cpu=cfg.offload_activations)
    # a checkpointed layer is always wrapped by FSDP, whatever its size
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def checkpoint_layer(layer, offload_to_cpu=False):
    """``--checkpoint-activations`` for a layer that takes and returns a :class:`ResidualState`:
    PyTorch's non-reentrant checkpoint, which keeps the gradient along the residual path."""
    forward = layer.forward

    def checkpointed_forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        offload = torch.autograd.graph.save_on_cpu() if offload_to_cpu else contextlib.nullcontext()
        with offload:
            return torch_checkpoint(forward, *args, use_reentrant=False, **kwargs)

    layer.precheckpoint_forward = forward  # the attribute fairseq's unwrap_checkpoint restores
    layer.forward = checkpointed_forward
    return layer


def build_attention(layer, embed_dim, cfg, heads, xformers_att_config, residual_args, **kwargs):
    """A ResidualMultiheadAttention with fairseq's dropout and quant-noise settings."""
    return ResidualMultiheadAttention(embed_dim, heads, dropout=cfg.attention_dropout, q_noise=layer.quant_noise,
                                      qn_block_size=layer.quant_noise_block_size,
                                      xformers_att_config=xformers_att_config, **residual_args, **kwargs)


def value_args(mix: Optional[str], first: bool) -> dict:
    """The attention module's value residual arguments (none when off: fairseq's module as before)."""
    return dict(value_residual=mix, value_first=first) if mix else {}


def feed_forward(layer, x: Tensor) -> Tuple[Tensor, Tensor]:
    """The FFN sub-block with its residual and layer norm (fairseq's); ``(x, fc2's output before dropout)``."""
    residual = x
    if layer.normalize_before:
        x = layer.final_layer_norm(x)
    x = layer.activation_fn(layer.fc1(x))
    x = layer.activation_dropout_module(x)
    if getattr(layer, "ffn_layernorm", None) is not None:
        x = layer.ffn_layernorm(x)
    x = fc_result = layer.fc2(x)
    x = layer.dropout_module(x)
    if getattr(layer, "w_resid", None) is not None:
        residual = torch.mul(layer.w_resid, residual)
    x = layer.residual_connection(x, residual)
    if not layer.normalize_before:
        x = layer.final_layer_norm(x)
    return x, fc_result


class RealFormerEncoderLayer(TransformerEncoderLayerBase):
    """Encoder layer: ``(x, prev_state) -> (x, fc_result, state)`` on the encoder self path."""

    def __init__(self, cfg, return_fc: bool = False, residual: bool = False, mode: str = "sum",
                 kernel: str = "auto", value_residual: Optional[str] = None, value_first: bool = False):
        # read by build_self_attention, which fairseq's __init__ calls
        self._residual_args = dict(residual=residual, mode=mode, kernel=kernel,
                                   **value_args(value_residual, value_first))
        super().__init__(cfg, return_fc=return_fc)
        use_fairseq_dropout_names(self, "TransformerEncoderLayerBase")

    def build_self_attention(self, embed_dim, cfg):
        return build_attention(self, embed_dim, cfg, cfg.encoder.attention_heads, cfg.encoder.xformers_att_config,
                               self._residual_args, self_attention=True)

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None,
                prev_state: Optional[ResidualState] = None):
        """``x``: ``[T, B, C]``; returns ``(x, fc_result, state)`` (``fc_result`` None unless ``return_fc``)."""
        if attn_mask is not None:
            # fairseq's convention: 1 = masked, turned into a large finite negative
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        path = ResidualPath(prev_state)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask, need_weights=False,
                              attn_mask=attn_mask, residual_path=path)
        state = path.state
        x = self.dropout_module(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, fc_result = feed_forward(self, x)
        return x, (fc_result if self.return_fc else None), state


class RealFormerDecoderLayer(TransformerDecoderLayerBase):
    """Decoder layer: ``prev_self_state`` and ``prev_cross_state`` in, ``self_state`` and ``cross_state`` out."""

    def __init__(self, cfg, no_encoder_attn: bool = False, self_residual: bool = False, cross_residual: bool = False,
                 mode: str = "sum", kernel: str = "auto", self_value: Optional[str] = None,
                 cross_value: Optional[str] = None, value_first: bool = False):
        self._self_residual_args = dict(residual=self_residual, mode=mode, kernel=kernel,
                                        **value_args(self_value, value_first))
        self._cross_residual_args = dict(residual=cross_residual, mode=mode, kernel=kernel,
                                         **value_args(cross_value, value_first))
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        use_fairseq_dropout_names(self, "TransformerDecoderLayerBase")

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return build_attention(self, embed_dim, cfg, cfg.decoder.attention_heads, cfg.decoder.xformers_att_config,
                               self._self_residual_args, self_attention=not cfg.cross_self_attention,
                               add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)

    def build_encoder_attention(self, embed_dim, cfg):
        return build_attention(self, embed_dim, cfg, cfg.decoder.attention_heads, cfg.encoder.xformers_att_config,
                               self._cross_residual_args, encoder_decoder_attention=True,
                               kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim)

    def forward(self, x: Tensor, encoder_out: Optional[Tensor] = None, encoder_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                prev_self_attn_state: Optional[List[Tensor]] = None, prev_attn_state: Optional[List[Tensor]] = None,
                self_attn_mask: Optional[Tensor] = None, self_attn_padding_mask: Optional[Tensor] = None,
                need_attn: bool = False, need_head_weights: bool = False,
                prev_self_state: Optional[ResidualState] = None, prev_cross_state: Optional[ResidualState] = None,
                self_mask_facts: Optional[MaskFacts] = None, weights_only_if_asked: bool = False):
        """As fairseq's decoder layer, plus the two residual paths; returns ``(x, attn, self_attn_state,
        self_state, cross_state)``. ``weights_only_if_asked``: cross-attention weights only when
        ``need_attn`` asks; ``self_attn_padding_mask``: ``[B, T]``, cached positions included."""
        if need_head_weights:
            need_attn = True

        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        if prev_self_attn_state is not None:
            _restore_attn_state(self.self_attn, incremental_state, prev_self_attn_state)
        y = x
        if self.cross_self_attention:
            y, self_attn_mask, self_attn_padding_mask = self._cross_self_keys(
                x, encoder_out, encoder_padding_mask, incremental_state, self_attn_mask, self_attn_padding_mask
            )
        self_path = ResidualPath(prev_self_state)
        x, _ = self.self_attn(query=x, key=y, value=y, key_padding_mask=self_attn_padding_mask,
                              incremental_state=incremental_state, need_weights=False, attn_mask=self_attn_mask,
                              residual_path=self_path, mask_facts=self_mask_facts)
        self_state = self_path.state
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
        cross_state: Optional[ResidualState] = None
        if self.encoder_attn is not None and encoder_out is not None:
            residual = x
            if self.normalize_before:
                x = self.encoder_attn_layer_norm(x)
            if prev_attn_state is not None:
                _restore_attn_state(self.encoder_attn, incremental_state, prev_attn_state)
            cross_path = ResidualPath(prev_cross_state)
            x, attn = self.encoder_attn(
                query=x, key=encoder_out, value=encoder_out, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
                need_weights=need_attn or (not weights_only_if_asked and not self.training and self.need_attn),
                need_head_weights=need_head_weights, residual_path=cross_path)
            cross_state = cross_path.state
            x = self.dropout_module(x)
            x = self.residual_connection(x, residual)
            if not self.normalize_before:
                x = self.encoder_attn_layer_norm(x)

        x, _ = feed_forward(self, x)

        self_attn_state = None
        if self.onnx_trace and incremental_state is not None:
            saved = self.self_attn._get_input_buffer(incremental_state)
            self_attn_state = [saved["prev_key"], saved["prev_value"]]
            if self_attn_padding_mask is not None:
                self_attn_state.append(saved["prev_key_padding_mask"])
        return x, attn, self_attn_state, self_state, cross_state

    def _cross_self_keys(self, x, encoder_out, encoder_padding_mask, incremental_state,
                         self_attn_mask, self_attn_padding_mask):
        """fairseq's ``--cross-self-attention`` keys ``[encoder output; x]`` and masks widened to match."""
        assert encoder_out is not None, "--cross-self-attention needs an encoder output"
        assert self_attn_padding_mask is not None, "the decoder passes the target padding mask"
        buffer = self.self_attn._get_input_buffer(incremental_state)
        cached = incremental_state is not None and "prev_key" in buffer
        widened_mask, self_attn_padding_mask = cross_self_masks(
            encoder_out, encoder_padding_mask, self_attn_mask, self_attn_padding_mask)
        if cached:
            return x, self_attn_mask, self_attn_padding_mask  # the encoder part is cached
        return torch.cat((encoder_out, x), dim=0), widened_mask, self_attn_padding_mask


def cross_self_masks(encoder_out: Tensor, encoder_padding_mask: Optional[Tensor], self_attn_mask: Optional[Tensor],
                     self_attn_padding_mask: Tensor):
    """``(attn_mask, key_padding_mask)`` of the keys ``[encoder output; target]``: the target's masks widened."""
    enc_pad = encoder_padding_mask
    if enc_pad is None:
        enc_pad = self_attn_padding_mask.new_zeros(encoder_out.size(1), encoder_out.size(0))
    self_attn_padding_mask = torch.cat((enc_pad.to(self_attn_padding_mask.dtype), self_attn_padding_mask), dim=1)
    if self_attn_mask is not None:
        self_attn_mask = torch.cat((self_attn_mask.new_zeros(self_attn_mask.size(0), encoder_out.size(0)),
                                    self_attn_mask), dim=1)
    return self_attn_mask, self_attn_padding_mask


def _restore_attn_state(attn_module, incremental_state, state: List[Tensor]):
    """Seed an attention module's key/value cache from ``[prev_key, prev_value(, mask)]``."""
    assert incremental_state is not None
    saved: Dict[str, Optional[Tensor]] = {"prev_key": state[0], "prev_value": state[1]}
    if len(state) >= 3:
        saved["prev_key_padding_mask"] = state[2]
    attn_module._set_input_buffer(incremental_state, saved)
