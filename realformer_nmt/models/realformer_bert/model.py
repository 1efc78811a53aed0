"""The ``realformer_bert`` model: fairseq's RoBERTa with the RealFormer encoder.

Built the way fairseq's own Linformer plugin builds ``linformer_roberta``: a
``RobertaModel`` subclass whose ``RobertaEncoder.build_encoder`` returns another
sentence encoder, here the core :class:`RealFormerTransformerEncoder` (the one copy of
the residual attention loop). Everything else is RoBERTa's: embeddings, LM head,
classification heads, ``--max-positions``, the hub interface, fairseq's ``masked_lm``,
``sentence_prediction`` and ``sentence_ranking`` tasks. With
``--residual-attention-paths none`` it computes exactly ``roberta`` (same state dict).

Architectures: the paper's Table 1 (He et al., 2021) on top of RoBERTa's defaults
(GELU, Post-LN, dropout 0.1, embedding layer norm, learned positions up to 512).
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr, safe_hasattr

from ... import residual_config
from ..realformer_transformer import RealFormerTransformerEncoder

PATHS = ("encoder",)  # an encoder-only model has one attention path
MEAN_ABOVE_LAYERS = 24  # deeper stacks default to the running mean (paper, xLarge)


@register_model("realformer_bert")
class RealFormerBertModel(RobertaModel):
    """BERT-style RealFormer encoder (He et al., 2021) with RoBERTa's heads and interfaces.

    ``from_pretrained(dir, checkpoint_file=..., bpe="sentencepiece",
    sentencepiece_model=...)`` returns fairseq's ``RobertaHubInterface``.
    """

    @classmethod
    def hub_models(cls):
        return {}

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        residual_config.add_args(parser, available=PATHS)

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        realformer_bert_architecture(args)  # args from old checkpoints or built by hand
        residual_config.resolve(args, available=PATHS)  # one clear error before building
        if not safe_hasattr(args, "max_positions"):
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        encoder = RealFormerBertEncoder(args, task.source_dictionary)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        return cls(args, encoder)

    @property
    def residual(self) -> residual_config.ResidualSettings:
        """The residual attention settings this model computes with."""
        return self.encoder.sentence_encoder.residual

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        tag = residual_config.tagged_settings(state_dict)
        if tag is not None:
            trained_with, path = tag
            residual_config.warn_if_changed(trained_with, self.residual, what=path)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


class RealFormerBertEncoder(RobertaEncoder):
    """RoBERTa's encoder (embeddings, LM head) around the RealFormer sentence encoder."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = RealFormerTransformerEncoder(args, dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        return encoder


def _residual_defaults(args):
    if safe_getattr(args, "residual_attention_paths", None) is None:
        args.residual_attention_paths = residual_config.format_paths(PATHS)
    if safe_getattr(args, "residual_attention_mode", None) is None:
        deep = args.encoder_layers > MEAN_ABOVE_LAYERS
        args.residual_attention_mode = "mean" if deep else residual_config.DEFAULT_MODE
    if safe_getattr(args, "residual_attention_kernel", None) is None:
        args.residual_attention_kernel = residual_config.DEFAULT_KERNEL


def _dims(args, layers, hidden, heads, ffn):
    args.encoder_layers = safe_getattr(args, "encoder_layers", layers)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", hidden)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", heads)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", ffn)


@register_model_architecture("realformer_bert", "realformer_bert")
def realformer_bert_architecture(args):
    """RoBERTa's defaults (BERT-base dims) plus the residual attention defaults.

    Learned positions up to 512 as BERT's, whatever ``--tokens-per-sample`` (``roberta``
    sizes its table to ``--tokens-per-sample`` unless ``--max-positions`` is given)."""
    args.max_positions = safe_getattr(args, "max_positions", 512)
    roberta_base_architecture(args)
    _residual_defaults(args)


# The paper's Table 1: layers, hidden size, attention heads, FFN (intermediate) size.
@register_model_architecture("realformer_bert", "realformer_bert_small")
def realformer_bert_small(args):
    _dims(args, 4, 512, 8, 2048)
    realformer_bert_architecture(args)


@register_model_architecture("realformer_bert", "realformer_bert_base")
def realformer_bert_base(args):
    _dims(args, 12, 768, 12, 3072)
    realformer_bert_architecture(args)


@register_model_architecture("realformer_bert", "realformer_bert_large")
def realformer_bert_large(args):
    _dims(args, 24, 1024, 16, 4096)
    realformer_bert_architecture(args)


@register_model_architecture("realformer_bert", "realformer_bert_xlarge")
def realformer_bert_xlarge(args):
    _dims(args, 36, 1536, 24, 6144)
    realformer_bert_architecture(args)
