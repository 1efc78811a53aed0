from .model import RealFormerBertEncoder, RealFormerBertModel

__all__ = ["RealFormerBertModel", "RealFormerBertEncoder"]
