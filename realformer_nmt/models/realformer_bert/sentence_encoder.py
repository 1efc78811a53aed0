"""The sentence encoder of ``realformer_bert``, with the options that make it compute
Google's TF BERT exactly (the layout of the released RealFormer checkpoints).

Off by default (a model trained here is RoBERTa's encoder, unchanged). The options:

* ``--num-segments N``: segment (token type) embeddings added to the input. The ids come
  from the tokens, as BERT lays a pair out (``[CLS] A [SEP] B [SEP]`` = ``<s> A </s> B
  </s>``): 0 up to and including the first ``</s>``, 1 after it; padding 0. So
  ``sentence_prediction`` (``--init-token 0``, no ``--separator-token``) and
  ``masked_lm_nsp`` pairs get them with no task change.
* ``--position-offset K``: learned positions by index, token t of every row at row
  ``t + K`` of the table, padding included (BERT: ``K = 0``, positions 0..T-1), instead of
  fairseq's (counted over non-padding tokens from ``padding_idx + 1``). Padded positions
  then also keep their embeddings (fairseq zeroes them), as BERT computes them: outputs
  at padded positions equal BERT's too.
* ``--layer-norm-eps``: every LayerNorm's epsilon (BERT, tf_slim: 1e-12; fairseq: 1e-5).

The activation is fairseq's ``--activation-fn`` (BERT's tanh-approximated GELU is
``gelu_accurate``); padding is masked with the most negative float where BERT adds
-10000, which gives the same softmax in float32 (a padded key's weight
``exp(score - 10000 - max)`` underflows to exactly 0) unless a padded key scores some
9,900 above every real key of its row.
"""

from typing import Optional

import torch
from torch import Tensor, nn

from ..realformer_transformer import RealFormerTransformerEncoder


def segment_ids(tokens: Tensor, eos: int, pad: int, num_segments: int) -> Tensor:
    """BERT's token types from the tokens: 0 up to and including the first ``eos`` of a
    row, then 1 (at most ``num_segments - 1``); padding 0. ``tokens``: ``[B, T]``."""
    is_eos = tokens.eq(eos).long()
    after_first = (is_eos.cumsum(dim=1) - is_eos).clamp(max=min(1, num_segments - 1))
    return after_first.masked_fill(tokens.eq(pad), 0)


def set_layer_norm_eps(module: nn.Module, eps: float):
    """Set the epsilon of every LayerNorm under ``module`` (torch's, or apex's fused one)."""
    for m in module.modules():
        if hasattr(m, "normalized_shape") and hasattr(m, "eps"):
            m.eps = eps


class IndexPositionalEmbedding(nn.Embedding):
    """Learned positions by index, BERT's way: token t of every row gets row ``t + offset``,
    padding included. Same parameter name (``embed_positions.weight``) as fairseq's."""

    def __init__(self, max_positions: int, embedding_dim: int, offset: int = 0):
        super().__init__(max_positions + offset, embedding_dim)
        self.offset = offset
        self.max_positions = max_positions

    def forward(self, input: Tensor, incremental_state=None) -> Tensor:
        """``input``: ``[B, T]`` tokens; returns ``[1, T, C]`` (broadcast over the batch)."""
        positions = torch.arange(self.offset, self.offset + input.size(1), device=input.device)
        return super().forward(positions).unsqueeze(0)


class RealFormerBertSentenceEncoder(RealFormerTransformerEncoder):
    """The RealFormer encoder with BERT's segment embeddings and position rule, when asked."""

    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(args, dictionary, embed_tokens)
        dim = embed_tokens.embedding_dim
        offset = getattr(args, "position_offset", None)
        if offset is not None and self.embed_positions is not None:
            self.embed_positions = IndexPositionalEmbedding(self.max_source_positions, dim, offset)
            self.zero_padding_embeddings = False  # BERT computes padded positions like any other
        self.num_segments = getattr(args, "num_segments", 0) or 0
        self.segment_embeddings = nn.Embedding(self.num_segments, dim) if self.num_segments > 0 else None

    def forward_embedding(self, src_tokens: Tensor, token_embedding: Optional[Tensor] = None):
        """fairseq's (token + position embeddings, layer norm, dropout) plus the segment
        embeddings, all added before the layer norm as in BERT."""
        if token_embedding is None:
            token_embedding = self.embed_tokens(src_tokens)
        x = embed = self.embed_scale * token_embedding
        if self.segment_embeddings is not None:
            segments = segment_ids(src_tokens, self.dictionary.eos(), self.padding_idx, self.num_segments)
            x = x + self.segment_embeddings(segments)
        if self.embed_positions is not None:
            x = x + self.embed_positions(src_tokens)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        return x, embed
