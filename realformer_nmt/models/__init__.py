from .realformer_bert import RealFormerBertModel  # noqa: F401  (registers it)
from .realformer_transformer import RealFormerTransformerModel  # noqa: F401  (registers it)
