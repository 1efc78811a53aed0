"""Corpus preparation: the shared SentencePiece + ``fairseq-preprocess`` pipeline
(``pipeline``) and one module per corpus (``synthetic_en_de``, ``multi30k``); BERT's
WordPiece tokenizer as fairseq's ``--bpe wordpiece`` (``wordpiece``)."""

from ..errors import DataError
from . import multi30k, pipeline, synthetic_en_de, wordpiece  # wordpiece registers --bpe wordpiece
from .pipeline import prepare, prepare_settings, prepared_settings

__all__ = ["DataError", "multi30k", "pipeline", "synthetic_en_de", "wordpiece", "prepare", "prepare_settings",
           "prepared_settings"]
