from .residual_attention import RESIDUAL_MODES, ResidualMultiheadAttention
from .realformer_layer import RealFormerDecoderLayer, RealFormerEncoderLayer

__all__ = [
    "RESIDUAL_MODES",
    "ResidualMultiheadAttention",
    "RealFormerEncoderLayer",
    "RealFormerDecoderLayer",
]
