"""Corpus preparation: the shared SentencePiece + ``fairseq-preprocess`` pipeline
(``pipeline``) and one module per corpus (``synthetic_en_de``, ``multi30k``)."""

from ..errors import DataError
from . import multi30k, pipeline, synthetic_en_de
from .pipeline import prepare, prepare_settings, prepared_settings

__all__ = ["DataError", "multi30k", "pipeline", "synthetic_en_de", "prepare", "prepare_settings",
           "prepared_settings"]
