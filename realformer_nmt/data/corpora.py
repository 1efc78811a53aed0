"""Corpus dispatch, in one place: ``prepare(corpus, dest_dir)`` writes a named corpus's raw
text (``synthetic_en_de``, ``multi30k``) and runs the shared ``pipeline`` on it, leaving
fairseq binaries, ``spm.model`` and ``prepare.json`` in ``dest_dir``; ``prepared_settings``
reads back what a finished ``prepare`` recorded (used to detect stale data).
"""

import json
import os
import shutil

from ..errors import DataError
from . import multi30k, synthetic_en_de
from .pipeline import SPLITS, binarize, count_lines, dictionary_size, encode_files, log, train_sentencepiece

DEFAULT_VOCAB = {"synthetic": 1000, "multi30k": 8000}


def prepare_settings(corpus, vocab_size=None, seed=1, synthetic_sizes=None, model_type="bpe",
                     raw_dir=None, download=False):
    """The settings ``prepare`` records in ``prepare.json`` (used to detect stale data)."""
    if corpus not in DEFAULT_VOCAB:
        raise DataError(f"--corpus must be one of {sorted(DEFAULT_VOCAB)}, not {corpus!r}")
    settings = {"corpus": corpus, "vocab_size": vocab_size or DEFAULT_VOCAB[corpus], "model_type": model_type}
    if corpus == "synthetic":
        settings.update(seed=seed, sizes=dict(synthetic_sizes or {}))
    else:
        settings.update(raw_dir=os.path.abspath(raw_dir) if raw_dir else None, download=download)
    return settings


def prepare(corpus, dest_dir, raw_dir=None, download=False, vocab_size=None, work_dir=None,
            seed=1, synthetic_sizes=None, model_type="bpe"):
    """Build raw text, SentencePiece and fairseq binaries for ``corpus``; return the summary.

    Raw and piece files go to ``work_dir`` (default ``dest_dir/work``); ``dest_dir`` gets
    the binaries, ``spm.model`` and ``prepare.json``.
    """
    settings = prepare_settings(corpus, vocab_size, seed, synthetic_sizes, model_type, raw_dir, download)
    vocab_size = settings["vocab_size"]
    if vocab_size < 50:
        raise DataError(f"--vocab-size {vocab_size} is too small (use at least 50)")
    if corpus == "multi30k":
        multi30k.check_multi30k_source(raw_dir, download)
    os.makedirs(dest_dir, exist_ok=True)
    if os.path.exists(os.path.join(dest_dir, "prepare.json")):
        os.remove(os.path.join(dest_dir, "prepare.json"))  # marks dest_dir unfinished until the end
    work_dir = work_dir or os.path.join(dest_dir, "work")
    text_dir, spm_dir = os.path.join(work_dir, "raw"), os.path.join(work_dir, "spm")
    log(f"[1/4] writing raw {corpus} text to {text_dir}")
    if corpus == "synthetic":
        report = synthetic_en_de.make_synthetic_en_de(text_dir, seed=seed, **settings["sizes"])
    else:
        report = multi30k.load_multi30k(text_dir, raw_dir=raw_dir, download=download)
    log(f"[2/4] training a joint SentencePiece {model_type} model (vocab {vocab_size})")
    model = train_sentencepiece(text_dir, os.path.join(spm_dir, "spm"), vocab_size, model_type)
    log("[3/4] encoding splits into pieces")
    encode_files(model, text_dir, spm_dir)
    log(f"[4/4] fairseq-preprocess -> {dest_dir}")
    binarize(spm_dir, dest_dir)
    shutil.copyfile(model, os.path.join(dest_dir, "spm.model"))
    summary = {
        "settings": settings,
        "counts": {split: count_lines(os.path.join(text_dir, f"{split}.en")) for split in SPLITS},
        "report": report,
        "dictionary_size": dictionary_size(os.path.join(dest_dir, "dict.de.txt")),
        "dest_dir": os.path.abspath(dest_dir),
        "raw_dir": os.path.abspath(text_dir),
        "spm_dir": os.path.abspath(spm_dir),
        "spm_model": os.path.abspath(os.path.join(dest_dir, "spm.model")),
    }
    with open(os.path.join(dest_dir, "prepare.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    return summary


def prepared_settings(dest_dir):
    """The ``settings`` recorded by a finished ``prepare`` in ``dest_dir``, or None."""
    try:
        with open(os.path.join(dest_dir, "prepare.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    needed = ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "test.en-de.de.bin", "spm.model")
    if not all(os.path.exists(os.path.join(dest_dir, n)) for n in needed):
        return None
    return summary.get("settings")
