from .decoder import RealFormerTransformerDecoder
from .encoder import RealFormerTransformerEncoder
from .model import RealFormerTransformerModel

__all__ = ["RealFormerTransformerModel", "RealFormerTransformerEncoder", "RealFormerTransformerDecoder"]
