"""Transformer encoder whose layer loop carries the encoder self-attention path."""

from typing import List, Optional

import torch
from fairseq.models.transformer import TransformerConfig, TransformerEncoderBase
from torch import Tensor

from ... import residual_config
from ...modules.dropout_names import use_fairseq_dropout_names
from ...modules.realformer_layer import RealFormerEncoderLayer, wrap_layer
from ...modules.residual_attention import ResidualState, share_kernel_notes


class RealFormerTransformerEncoder(TransformerEncoderBase):
    """fairseq's ``TransformerEncoderBase`` with :class:`RealFormerEncoderLayer` layers."""

    # the paths the whole model may put on residual attention (encoder-only models: "encoder")
    RESIDUAL_PATHS = residual_config.PATHS
    # fairseq zeroes the embeddings of padding positions (BERT does not; see realformer_bert)
    zero_padding_embeddings = True

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        cfg = TransformerConfig.from_namespace(cfg)
        # read by build_encoder_layer during fairseq's __init__
        self.residual = residual_config.resolve(cfg, available=self.RESIDUAL_PATHS)
        self._layers_built = 0  # the first layer of the value residual path has no mix
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        use_fairseq_dropout_names(self, "TransformerEncoder")
        share_kernel_notes(self)  # what its layers say about their kernels, said once per encoder

    def build_encoder_layer(self, cfg):
        first, self._layers_built = self._layers_built == 0, self._layers_built + 1
        layer = RealFormerEncoderLayer(cfg, return_fc=self.return_fc, residual="encoder" in self.residual.paths,
                                       mode=self.residual.mode, kernel=self.residual.kernel,
                                       value_residual=self.residual.value_mix_of("encoder"), value_first=first)
        return wrap_layer(layer, cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None):
        """fairseq's encoder pass (a copy) whose loop threads the residual state; fairseq's output dict."""
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = encoder_padding_mask.any()

        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if self.zero_padding_embeddings:
            # zero the embeddings of padding positions, as fairseq does
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x) * has_pads.type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C

        encoder_states = [x] if return_all_hiddens else []
        fc_results: List[Optional[Tensor]] = []
        # read once (fairseq reads has_pads at every layer)
        layer_padding_mask = encoder_padding_mask if has_pads else None
        state: Optional[ResidualState] = None
        for layer in self.layers:
            x, fc_result, state = layer(x, encoder_padding_mask=layer_padding_mask, prev_state=state)
            if return_all_hiddens:
                encoder_states.append(x)
                fc_results.append(fc_result)

        if self.layer_norm is not None:
            x = self.layer_norm(x)

        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {
            "encoder_out": [x],  # T x B x C
            "encoder_padding_mask": [encoder_padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C
            "encoder_states": encoder_states,  # List[T x B x C]
            "fc_results": fc_results,  # List[T x B x C]
            "src_tokens": [],
            "src_lengths": [src_lengths],
        }
