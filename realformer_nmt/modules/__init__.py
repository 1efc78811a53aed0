from .realformer_layer import RealFormerDecoderLayer, RealFormerEncoderLayer
from .residual_attention import KERNELS, RESIDUAL_MODES, ResidualMultiheadAttention, ResidualState

__all__ = ["KERNELS", "RESIDUAL_MODES", "ResidualMultiheadAttention", "ResidualState", "RealFormerEncoderLayer",
           "RealFormerDecoderLayer"]
