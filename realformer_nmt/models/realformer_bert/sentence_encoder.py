"""The sentence encoder of ``realformer_bert``, with the options (off by default) that make it compute
Google's TF BERT exactly: ``--num-segments``, ``--position-offset``, ``--layer-norm-eps``
(docs/internals.md#bert)."""

from typing import Optional

import torch
from torch import Tensor, nn

from ..realformer_transformer import RealFormerTransformerEncoder


def segment_ids(tokens: Tensor, eos: int, pad: int, num_segments: int) -> Tensor:
    """BERT's token types from ``tokens`` ``[B, T]``: 0 up to and including the first ``eos``, then 1; padding 0."""
    is_eos = tokens.eq(eos).long()
    after_first = (is_eos.cumsum(dim=1) - is_eos).clamp(max=min(1, num_segments - 1))
    return after_first.masked_fill(tokens.eq(pad), 0)


def set_layer_norm_eps(module: nn.Module, eps: float):
    """Set the epsilon of every LayerNorm under ``module`` (torch's, or apex's fused one)."""
    for m in module.modules():
        if hasattr(m, "normalized_shape") and hasattr(m, "eps"):
            m.eps = eps


class IndexPositionalEmbedding(nn.Embedding):
    """Learned positions by index, BERT's way: token t of every row gets row ``t + offset``."""

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
        """fairseq's embeddings plus the segment embeddings, all added before the layer norm as in BERT."""
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
