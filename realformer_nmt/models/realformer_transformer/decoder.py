"""Transformer decoder whose layer loop carries the decoder self-attention and the
encoder-decoder (cross) attention paths."""

from typing import Dict, List, Optional, Tuple

import torch
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase
from torch import Tensor

from ... import residual_config
from ...errors import ConfigError
from ...modules.dropout_names import use_fairseq_dropout_names
from ...modules.realformer_layer import RealFormerDecoderLayer, cross_self_masks, wrap_layer
from ...modules.residual_attention import MaskFacts, ResidualState, share_kernel_notes


class RealFormerTransformerDecoder(TransformerDecoderBase):
    """fairseq's ``TransformerDecoderBase`` with :class:`RealFormerDecoderLayer` layers and two score paths."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        cfg = TransformerConfig.from_namespace(cfg)
        if cfg.base_layers:
            raise ConfigError("--base-layers is not supported by realformer_transformer: it inserts BASE "
                              "mixture-of-experts layers, which have no attention, between the decoder "
                              "layers (use transformer_lm-style BASE models without RealFormer)")
        # read by build_decoder_layer during fairseq's __init__
        self.residual = residual_config.resolve(cfg)
        self._layers_built = 0  # the first layer of a value residual path has no mix
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        use_fairseq_dropout_names(self, "TransformerDecoder")
        share_kernel_notes(self)  # what its layers say about their kernels, said once per decoder

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        paths, first = self.residual.paths, self._layers_built == 0
        self._layers_built += 1
        layer = RealFormerDecoderLayer(cfg, no_encoder_attn=no_encoder_attn, self_residual="decoder" in paths,
                                       cross_residual="cross" in paths, mode=self.residual.mode,
                                       kernel=self.residual.kernel, self_value=self.residual.value_mix_of("decoder"),
                                       cross_value=self.residual.value_mix_of("cross"), value_first=first)
        return wrap_layer(layer, cfg)

    def extract_features_scriptable(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                                    incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                                    full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                                    alignment_heads: Optional[int] = None):
        """fairseq's decoder pass (a copy) whose loop threads the ``self_state``/``cross_state`` paths."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        enc: Optional[Tensor] = None
        padding_mask: Optional[Tensor] = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            padding_mask = encoder_out["encoder_padding_mask"][0]

        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)

        # padding over every target position, cached steps included (docs/internals.md#layers-and-loops)
        target_padding = prev_output_tokens.eq(self.padding_idx)

        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]

        x = self.embed_scale * self.embed_tokens(prev_output_tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        self_attn_mask: Optional[Tensor] = None
        if incremental_state is None and not full_context_alignment:
            self_attn_mask = self.buffered_future_mask(x)
        self_facts, has_pads = self._self_mask_facts(target_padding, self_attn_mask, enc, padding_mask)
        self_attn_padding_mask: Optional[Tensor] = None
        if self.cross_self_attention or has_pads:
            self_attn_padding_mask = target_padding

        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        self_state: Optional[ResidualState] = None
        cross_state: Optional[ResidualState] = None
        for idx, layer in enumerate(self.layers):
            x, layer_attn, _, self_state, cross_state = layer(
                x, enc, padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=bool(idx == alignment_layer),
                need_head_weights=bool(idx == alignment_layer),
                prev_self_state=self_state, prev_cross_state=cross_state, self_mask_facts=self_facts,
                weights_only_if_asked=True,  # only the alignment layer's are kept (as in fairseq)
            )
            inner_states.append(x)
            if layer_attn is not None and idx == alignment_layer:
                attn = layer_attn.float().to(x)

        if attn is not None:
            if alignment_heads is not None:
                attn = attn[:alignment_heads]
            attn = attn.mean(dim=0)  # average probabilities over heads

        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

    def _self_mask_facts(self, target_padding: Tensor, self_attn_mask: Optional[Tensor], enc: Optional[Tensor],
                         encoder_padding_mask: Optional[Tensor]) -> Tuple[Optional[MaskFacts], bool]:
        """``(facts, has_pads)``: the :class:`MaskFacts` of the self path's masks, for every layer (None
        where no kernel needs them), and whether the target has padding."""
        on_path = "decoder" in self.residual.paths or "decoder" in self.residual.value_paths  # our kernels run
        if (self_attn_mask is None or not on_path or torch.compiler.is_compiling()
                or (self.cross_self_attention and enc is None)):
            return None, self.cross_self_attention or bool(target_padding.any())
        if self.cross_self_attention:  # the masks every layer widens over the encoder positions
            attn_mask, padding = cross_self_masks(enc, encoder_padding_mask, self_attn_mask, target_padding)
            return MaskFacts.of(padding, attn_mask), True
        facts = MaskFacts.of(target_padding, self_attn_mask)
        return facts, facts.shortest < target_padding.size(1)
