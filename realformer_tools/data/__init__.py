"""Corpus preparation: the shared SentencePiece + ``fairseq-preprocess`` steps
(``pipeline``, which knows no corpus), one module per corpus (``synthetic_en_de``,
``multi30k``; BERT pre-training text: ``wikitext``, ``pretraining``), the dispatch by corpus
name (``corpora.prepare``). Imports only go one way: corpora -> corpus modules -> pipeline.
BERT's WordPiece tokenizer (``--bpe wordpiece``) is the model's: ``realformer_nmt.models.realformer_bert.wordpiece``."""

from realformer_nmt.errors import DataError

from . import corpora, multi30k, pipeline, synthetic_en_de
from .corpora import prepare, prepare_settings, prepared_settings

__all__ = ["DataError", "corpora", "multi30k", "pipeline", "synthetic_en_de", "prepare",
           "prepare_settings", "prepared_settings"]
