"""RealFormer (He et al., 2021, "RealFormer: Transformer Likes Residual Attention") for
Hugging Face ``transformers``: the configuration.

Self-contained (``transformers`` only); written into each exported model folder by
realformer-nmt's ``scripts/export_hf.py``.
"""

from transformers import PretrainedConfig


class RealFormerConfig(PretrainedConfig):
    r"""BERT's configuration (same names and meanings) plus RealFormer's residual attention
    and the options that reproduce a fairseq ``realformer_bert`` checkpoint exactly.

    Args (beyond ``BertConfig``'s):
        residual_attention (bool): each layer adds the previous layer's raw attention scores
            to its own before the softmax (RealFormer). False: plain BERT.
        residual_attention_mode (str): ``"sum"`` (the paper's default) or ``"mean"``
            (the running sum divided by the number of layers in it; the paper's xLarge).
        position_offset (int or None): ``0``: BERT's learned positions, token t at row t
            (``type_vocab_size`` segment embeddings; Google's checkpoints). ``None``:
            fairseq/RoBERTa positions, counted over non-padding tokens from
            ``pad_token_id + 1``.
        zero_padding_embeddings (bool): zero the embeddings of padded positions after the
            embedding layer norm (fairseq's encoder does; BERT does not).
        embedding_layer_norm (bool): a layer norm over the summed embeddings (BERT: True).
        normalize_before (bool): Pre-LN layers and a final layer norm (default: Post-LN, BERT).
        embed_scale (float): the token embeddings are multiplied by this (BERT: 1.0).
        pooler_act (str): the pooler's activation (BERT: ``"tanh"``).
        classification_head (str or None): the fairseq classification head the pooler (and
            the NSP or sequence classifier) came from, when the export had one.
    """

    model_type = "realformer"

    def __init__(
        self,
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,
        type_vocab_size=2,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        classifier_dropout=None,
        residual_attention=True,
        residual_attention_mode="sum",
        position_offset=0,
        zero_padding_embeddings=False,
        embedding_layer_norm=True,
        normalize_before=False,
        embed_scale=1.0,
        pooler_act="tanh",
        classification_head=None,
        tie_word_embeddings=True,
        **kwargs,
    ):
        if residual_attention_mode not in ("sum", "mean"):
            raise ValueError(f"residual_attention_mode must be 'sum' or 'mean', not {residual_attention_mode!r}")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_attention_heads "
                             f"{num_attention_heads}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.classifier_dropout = classifier_dropout
        self.residual_attention = residual_attention
        self.residual_attention_mode = residual_attention_mode
        self.position_offset = position_offset
        self.zero_padding_embeddings = zero_padding_embeddings
        self.embedding_layer_norm = embedding_layer_norm
        self.normalize_before = normalize_before
        self.embed_scale = embed_scale
        self.pooler_act = pooler_act
        self.classification_head = classification_head
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)
