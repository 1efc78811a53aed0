"""The ``realformer_bert`` model: fairseq's RoBERTa with the RealFormer encoder, and its architectures
(the paper's Table 1; ``realformer_bert_google_*`` compute exactly Google's TF BERT). With
``--residual-attention-paths none`` it computes exactly ``roberta`` (docs/internals.md#bert).
"""

import logging
import os

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr, safe_hasattr

from ... import residual_config
from ...modules.residual_attention import share_kernel_notes
from .hub_interface import RealFormerBertHubInterface
from .sentence_encoder import RealFormerBertSentenceEncoder, set_layer_norm_eps

logger = logging.getLogger(__name__)

PATHS = ("encoder",)  # an encoder-only model has one attention path
GOOGLE_NSP_HEAD = "next_sentence"  # where converted Google checkpoints keep BERT's pooler + NSP classifier
MEAN_ABOVE_LAYERS = 24  # deeper stacks default to the running mean (paper, xLarge)


@register_model("realformer_bert")
class RealFormerBertModel(RobertaModel):
    """BERT-style RealFormer encoder (He et al., 2021) with RoBERTa's heads and interfaces."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        share_kernel_notes(self)  # the kernels it runs: one line per model
        self.register_state_dict_post_hook(residual_config.note_settings)  # checkpoints say what they computed

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        bpe=None, **kwargs):
        """The hub interface of a checkpoint in ``model_name_or_path``; ``bpe`` (options as keywords):
        default the checkpoint's own, ``wordpiece`` for a folder with a ``vocab.txt``."""
        from fairseq import hub_utils

        vocab = os.path.join(model_name_or_path, "vocab.txt")
        if bpe is None and os.path.isfile(vocab):
            bpe = "wordpiece"
            kwargs.setdefault("wordpiece_vocab", vocab)
        if bpe is not None:
            kwargs["bpe"] = bpe
        x = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                      archive_map=cls.hub_models(), load_checkpoint_heads=True, **kwargs)
        return RealFormerBertHubInterface(x["args"], x["task"], x["models"][0])

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        residual_config.add_args(parser, available=PATHS)
        group = residual_config.argument_group(parser, "BERT-exact options (Google's TF BERT; off by default)")
        group.add_argument("--num-segments", type=int, metavar="N",
                           help="segment (token type) embeddings added to the input, ids derived from the tokens "
                                "as BERT lays a pair out: 0 up to and including the first </s>, then 1 (<s> A </s> "
                                "B </s>); padding 0. Default: 0 (none, RoBERTa)")
        group.add_argument("--position-offset", type=int, metavar="K",
                           help="learned positions by index, token t at row t + K, padding included, and padded "
                                "positions keep their embeddings (BERT: 0). Default: fairseq's (counted over "
                                "non-padding tokens from padding_idx + 1; padded positions zeroed)")
        group.add_argument("--layer-norm-eps", type=float, metavar="EPS",
                           help="epsilon of every LayerNorm (BERT: 1e-12). Default: 1e-5 (fairseq)")
        group.add_argument("--pooler-init-head", metavar="NAME",
                           help="a classification head that is new when a checkpoint is restored (fine-tuning) "
                                "starts its dense (pooler) layer from the restored head NAME, as BERT fine-tunes "
                                "its pre-trained pooler (converted Google checkpoints: next_sentence). Default: none")

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
        residual_config.warn_on_load(self, state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def upgrade_state_dict_named(self, state_dict, name):
        """RoBERTa's; with ``--pooler-init-head NAME``, a new head's dense layer starts from head NAME's."""
        source = safe_getattr(self.args, "pooler_init_head", None)
        prefix = name + "." if name != "" else ""
        heads = prefix + "classification_heads."
        if source and heads + source + ".dense.weight" in state_dict:
            for head, module in self.classification_heads.items():
                fresh = not any(k.startswith(f"{heads}{head}.") for k in state_dict)
                pooler = {p: state_dict[f"{heads}{source}.dense.{p}"] for p in ("weight", "bias")}
                if fresh and pooler["weight"].shape == module.dense.weight.shape:
                    logger.info("classification head %s: dense layer from the restored %s head (--pooler-init-head)",
                                head, source)
                    for p, value in module.state_dict().items():  # the new classifier keeps its fresh weights
                        state_dict[f"{heads}{head}.{p}"] = value
                    for p, value in pooler.items():
                        state_dict[f"{heads}{head}.dense.{p}"] = value.clone()
        super().upgrade_state_dict_named(state_dict, name)


class RealFormerBertEncoder(RobertaEncoder):
    """RoBERTa's encoder (embeddings, LM head) around the RealFormer sentence encoder."""

    def __init__(self, args, dictionary):
        super().__init__(args, dictionary)
        eps = safe_getattr(args, "layer_norm_eps", None)
        if eps is not None:
            set_layer_norm_eps(self, eps)  # the sentence encoder's and the LM head's

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = RealFormerBertSentenceEncoder(args, dictionary, embed_tokens)
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
    if safe_getattr(args, "value_residual_paths", None) is None:
        args.value_residual_paths = "none"
    if safe_getattr(args, "value_residual_mix", None) is None:
        args.value_residual_mix = residual_config.DEFAULT_VALUE_MIX


def _dims(args, layers, hidden, heads, ffn):
    args.encoder_layers = safe_getattr(args, "encoder_layers", layers)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", hidden)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", heads)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", ffn)


@register_model_architecture("realformer_bert", "realformer_bert")
def realformer_bert_architecture(args):
    """RoBERTa's defaults (BERT-base dims, positions up to 512) plus the residual attention defaults."""
    args.max_positions = safe_getattr(args, "max_positions", 512)
    args.num_segments = safe_getattr(args, "num_segments", 0)
    args.position_offset = safe_getattr(args, "position_offset", None)
    args.layer_norm_eps = safe_getattr(args, "layer_norm_eps", None)
    args.pooler_init_head = safe_getattr(args, "pooler_init_head", None)
    roberta_base_architecture(args)
    _residual_defaults(args)


def _google_defaults(args):
    """What Google's TF BERT computes (the released RealFormer checkpoints)."""
    args.num_segments = safe_getattr(args, "num_segments", 2)
    args.position_offset = safe_getattr(args, "position_offset", 0)
    args.layer_norm_eps = safe_getattr(args, "layer_norm_eps", 1e-12)
    args.activation_fn = safe_getattr(args, "activation_fn", "gelu_accurate")
    args.pooler_init_head = safe_getattr(args, "pooler_init_head", GOOGLE_NSP_HEAD)


def _sized(name, base, dims):
    """Register architecture ``name``: ``dims`` (layers, hidden size, heads, FFN size) over ``base``."""
    def architecture(args):
        _dims(args, *dims)
        base(args)

    architecture.__name__ = name
    return register_model_architecture("realformer_bert", name)(architecture)


# Google's released RealFormer BERT checkpoints (scripts/convert_google_checkpoint.py):
# the Table 1 sizes with BERT's exact layout and numerics.
@register_model_architecture("realformer_bert", "realformer_bert_google")
def realformer_bert_google(args):
    _google_defaults(args)
    realformer_bert_architecture(args)


# The paper's Table 1: layers, hidden size, attention heads, FFN (intermediate) size.
SIZES = {"small": (4, 512, 8, 2048), "base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096),
         "xlarge": (36, 1536, 24, 6144)}
realformer_bert_small = _sized("realformer_bert_small", realformer_bert_architecture, SIZES["small"])
realformer_bert_base = _sized("realformer_bert_base", realformer_bert_architecture, SIZES["base"])
realformer_bert_large = _sized("realformer_bert_large", realformer_bert_architecture, SIZES["large"])
realformer_bert_xlarge = _sized("realformer_bert_xlarge", realformer_bert_architecture, SIZES["xlarge"])
realformer_bert_google_small = _sized("realformer_bert_google_small", realformer_bert_google, SIZES["small"])
realformer_bert_google_base = _sized("realformer_bert_google_base", realformer_bert_google, SIZES["base"])
realformer_bert_google_large = _sized("realformer_bert_google_large", realformer_bert_google, SIZES["large"])
realformer_bert_google_xlarge = _sized("realformer_bert_google_xlarge", realformer_bert_google, SIZES["xlarge"])
