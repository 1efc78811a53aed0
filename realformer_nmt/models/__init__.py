from .realformer_transformer import RealFormerTransformerModel  # noqa: F401  (registers it)
