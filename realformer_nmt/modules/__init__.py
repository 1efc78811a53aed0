from .residual_attention import KERNELS, RESIDUAL_MODES, ResidualMultiheadAttention, ResidualState
from .realformer_layer import RealFormerDecoderLayer, RealFormerEncoderLayer

__all__ = [
    "KERNELS",
    "RESIDUAL_MODES",
    "ResidualMultiheadAttention",
    "ResidualState",
    "RealFormerEncoderLayer",
    "RealFormerDecoderLayer",
]
