"""Corpus preparation: the shared SentencePiece + ``fairseq-preprocess`` steps
(``pipeline``, which knows no corpus), one module per corpus (``synthetic_en_de``,
``multi30k``; BERT pre-training text: ``wikitext``, ``pretraining``), the dispatch by corpus
name (``corpora.prepare``), and BERT's WordPiece tokenizer as fairseq's ``--bpe wordpiece``
(``wordpiece``). Imports only go one way: corpora -> corpus modules -> pipeline."""

from ..errors import DataError
from . import corpora, multi30k, pipeline, synthetic_en_de, wordpiece  # wordpiece registers --bpe wordpiece
from .corpora import prepare, prepare_settings, prepared_settings

__all__ = ["DataError", "corpora", "multi30k", "pipeline", "synthetic_en_de", "wordpiece", "prepare",
           "prepare_settings", "prepared_settings"]
