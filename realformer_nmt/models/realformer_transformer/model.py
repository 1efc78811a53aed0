"""The ``realformer_transformer`` model and its architectures: thin registrations over fairseq's
``transformer`` plus the ``--residual-attention-*`` flags."""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
    transformer_wmt_en_de_big,
)

from ... import residual_config
from ...errors import ConfigError
from ...modules.residual_attention import share_kernel_notes
from .decoder import RealFormerTransformerDecoder
from .encoder import RealFormerTransformerEncoder


@register_model("realformer_transformer")
class RealFormerTransformerModel(TransformerModel):
    """RealFormer encoder-decoder (He et al., 2021); with ``--residual-attention-paths none`` exactly
    fairseq's ``transformer`` (same parameter names)."""

    @classmethod
    def hub_models(cls):
        return {}

    def __prepare_scriptable__(self):
        raise ConfigError("torch.jit.script does not support realformer_transformer (TorchScript cannot "
                          "compile the residual attention subclass of fairseq's MultiheadAttention, and "
                          "is deprecated in current PyTorch): use torch.compile(model) instead, or, for a "
                          "model trained with --residual-attention-paths none, load its checkpoint with "
                          "--arch transformer, which scripts")

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        residual_config.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        realformer_base_architecture(args)  # args from old checkpoints or built by hand
        residual_config.resolve(args)  # one clear error before anything is built
        return super().build_model(args, task)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        share_kernel_notes(self)  # the kernels it runs: one line per model, encoder and decoder together
        self.register_state_dict_post_hook(residual_config.note_settings)  # checkpoints say what they computed

    @property
    def residual(self) -> residual_config.ResidualSettings:
        """The residual attention settings this model computes with."""
        return self.encoder.residual

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        residual_config.warn_on_load(self, state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return RealFormerTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return RealFormerTransformerDecoder(args, tgt_dict, embed_tokens, no_encoder_attn=args.no_cross_attention)


def _residual_defaults(args):
    if getattr(args, "residual_attention_paths", None) is None:
        args.residual_attention_paths = residual_config.default_paths(args)
    if getattr(args, "residual_attention_mode", None) is None:
        args.residual_attention_mode = residual_config.DEFAULT_MODE
    if getattr(args, "residual_attention_kernel", None) is None:
        args.residual_attention_kernel = residual_config.DEFAULT_KERNEL
    if getattr(args, "value_residual_paths", None) is None:
        args.value_residual_paths = "none"
    if getattr(args, "value_residual_mix", None) is None:
        args.value_residual_mix = residual_config.DEFAULT_VALUE_MIX


def _over(name, fairseq_architecture):
    """Register architecture ``name``: fairseq's ``fairseq_architecture`` plus the residual defaults."""
    def architecture(args):
        fairseq_architecture(args)
        _residual_defaults(args)

    architecture.__name__ = name
    return register_model_architecture("realformer_transformer", name)(architecture)


realformer_base_architecture = _over("realformer_transformer", base_architecture)
realformer_transformer_iwslt_de_en = _over("realformer_transformer_iwslt_de_en", transformer_iwslt_de_en)
realformer_transformer_wmt_en_de = _over("realformer_transformer_wmt_en_de", transformer_wmt_en_de)
realformer_transformer_wmt_en_de_big = _over("realformer_transformer_wmt_en_de_big", transformer_wmt_en_de_big)
