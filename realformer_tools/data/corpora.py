"""Corpus dispatch, in one place: ``prepare(corpus, dest_dir)`` writes a named corpus's raw
text (``synthetic_en_de``, ``multi30k``) and runs the shared ``pipeline`` on it, leaving
fairseq binaries, ``spm.model`` and ``prepare.json`` in ``dest_dir``; ``iwslt14`` runs its
own recipe (fairseq's ``prepare-iwslt14.sh``: Moses tokens, subword-nmt BPE, ``code``
instead of ``spm.model``). ``prepared_settings`` reads back what a finished ``prepare``
recorded (used to detect stale data).
"""

import json
import os
import shutil

from realformer_nmt.errors import DataError

from . import iwslt14, multi30k, synthetic_en_de
from .pipeline import (
    LANGS,
    SPLITS,
    binarize,
    count_lines,
    dictionary_size,
    encode_files,
    length_ratio,
    log,
    train_sentencepiece,
)

DEFAULT_VOCAB = {"synthetic": 1000, "multi30k": 8000}  # SentencePiece corpora
CORPORA = ("synthetic", "multi30k", "iwslt14")


def prepare_settings(corpus, vocab_size=None, seed=1, synthetic_sizes=None, model_type="bpe",
                     raw_dir=None, download=False, src="en", tgt="de", bpe_merges=None):
    """The settings ``prepare`` records in ``prepare.json`` (used to detect stale data)."""
    if corpus not in CORPORA:
        raise DataError(f"--corpus must be one of {sorted(CORPORA)}, not {corpus!r}")
    if corpus == "iwslt14":
        if (src, tgt) != (iwslt14.SRC, iwslt14.TGT):
            raise DataError("--corpus iwslt14 is German->English only (fairseq's recipe): drop --src/--tgt")
        if vocab_size is not None:
            raise DataError("--vocab-size is a SentencePiece setting: --corpus iwslt14 takes --bpe-merges")
        return {"corpus": corpus, "bpe_merges": bpe_merges or iwslt14.BPE_MERGES,
                "raw_dir": os.path.abspath(raw_dir) if raw_dir else None, "download": download}
    if bpe_merges is not None:
        raise DataError("--bpe-merges is a subword-nmt setting of --corpus iwslt14 (others take --vocab-size)")
    if corpus == "synthetic" and (src, tgt) != LANGS:
        raise DataError("--corpus synthetic is English->German only: drop --src/--tgt")
    if corpus == "multi30k":
        multi30k.check_langs((src, tgt))
    settings = {"corpus": corpus, "vocab_size": vocab_size or DEFAULT_VOCAB[corpus], "model_type": model_type}
    if (src, tgt) != LANGS:  # en-de data prepared before languages were a choice stays current
        settings.update(src=src, tgt=tgt)
    if corpus == "synthetic":
        settings.update(seed=seed, sizes=dict(synthetic_sizes or {}))
    else:
        settings.update(raw_dir=os.path.abspath(raw_dir) if raw_dir else None, download=download)
    return settings


def prepare(corpus, dest_dir, raw_dir=None, download=False, vocab_size=None, work_dir=None,
            seed=1, synthetic_sizes=None, model_type="bpe", src="en", tgt="de", bpe_merges=None, workers=1):
    """Build raw text, SentencePiece and fairseq binaries for ``corpus``; return the summary.

    ``iwslt14`` (German->English only) follows fairseq's recipe instead (see ``iwslt14``):
    ``bpe_merges`` subword-nmt merges, ``workers`` tokenizer and fairseq-preprocess processes.

    Raw and piece files go to ``work_dir`` (default ``dest_dir/work``); ``dest_dir`` gets
    the binaries, ``spm.model`` and ``prepare.json``. ``prepare.json`` records what the
    comparison harness reads: ``src``/``tgt``, ``bpe`` (what ``--remove-bpe`` removes),
    ``bleu`` (the scoring convention), ``test_files`` (raw test source and references) and
    ``length_ratio`` (target pieces per source piece in ``train``).
    """
    settings = prepare_settings(corpus, vocab_size, seed, synthetic_sizes, model_type, raw_dir, download,
                                src, tgt, bpe_merges)
    if corpus == "iwslt14":
        return iwslt14.prepare(dest_dir, settings, raw_dir, download, work_dir, settings["bpe_merges"], workers)
    vocab_size = settings["vocab_size"]
    langs = (src, tgt)
    if vocab_size < 50:
        raise DataError(f"--vocab-size {vocab_size} is too small (use at least 50)")
    if corpus == "multi30k":
        multi30k.check_multi30k_source(raw_dir, download, langs)
    os.makedirs(dest_dir, exist_ok=True)
    if os.path.exists(os.path.join(dest_dir, "prepare.json")):
        os.remove(os.path.join(dest_dir, "prepare.json"))  # marks dest_dir unfinished until the end
    work_dir = work_dir or os.path.join(dest_dir, "work")
    text_dir, spm_dir = os.path.join(work_dir, "raw"), os.path.join(work_dir, "spm")
    log(f"[1/4] writing raw {corpus} text to {text_dir}")
    if corpus == "synthetic":
        report = synthetic_en_de.make_synthetic_en_de(text_dir, seed=seed, **settings["sizes"])
    else:
        report = multi30k.load_multi30k(text_dir, raw_dir=raw_dir, download=download, langs=langs)
    log(f"[2/4] training a joint SentencePiece {model_type} model (vocab {vocab_size})")
    model = train_sentencepiece(text_dir, os.path.join(spm_dir, "spm"), vocab_size, model_type, langs=langs)
    log("[3/4] encoding splits into pieces")
    encode_files(model, text_dir, spm_dir, langs=langs)
    log(f"[4/4] fairseq-preprocess -> {dest_dir}")
    binarize(spm_dir, dest_dir, src=src, tgt=tgt)
    shutil.copyfile(model, os.path.join(dest_dir, "spm.model"))
    summary = {
        "settings": settings,
        "src": src,
        "tgt": tgt,
        "bpe": "sentencepiece",
        "bleu": "sacrebleu",
        "test_files": {"src": os.path.abspath(os.path.join(text_dir, f"test.{src}")),
                       "tgt": os.path.abspath(os.path.join(text_dir, f"test.{tgt}"))},
        "length_ratio": round(length_ratio(spm_dir, src, tgt), 4),
        "counts": {split: count_lines(os.path.join(text_dir, f"{split}.{src}")) for split in SPLITS},
        "report": report,
        "dictionary_size": dictionary_size(os.path.join(dest_dir, f"dict.{tgt}.txt")),
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
    src, tgt = summary.get("src", "en"), summary.get("tgt", "de")
    needed = (f"dict.{src}.txt", f"dict.{tgt}.txt", f"train.{src}-{tgt}.{src}.bin", f"test.{src}-{tgt}.{tgt}.bin",
              "code" if summary.get("bpe") == "subword_nmt" else "spm.model")
    if not all(os.path.exists(os.path.join(dest_dir, n)) for n in needed):
        return None
    return summary.get("settings")
