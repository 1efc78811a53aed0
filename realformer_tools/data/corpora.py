"""Corpus dispatch, in one place: ``prepare(corpus, dest_dir)`` writes a named corpus's raw
text (``synthetic_en_de``, ``multi30k``, ``own``: the user's files) and runs the shared ``pipeline`` on it, leaving
fairseq binaries, ``spm.model`` and ``prepare.json`` in ``dest_dir``; ``iwslt14`` runs its
own recipe (fairseq's ``prepare-iwslt14.sh``: Moses tokens, subword-nmt BPE, ``code``
instead of ``spm.model``). ``prepared_settings`` reads back what a finished ``prepare``
recorded (used to detect stale data). ``add_test_sets`` adds Multi30k's 2017 test sets
(fairseq splits ``test1``, ``test2``) to a data folder prepared without them, with its own
dictionaries and SentencePiece model, touching none of its files.
"""

import json
import os
import shutil
import tempfile

from realformer_nmt.errors import DataError

from . import iwslt14, multi30k, own, synthetic_en_de
from .pipeline import (
    LANGS,
    SPLITS,
    binarize,
    binarize_with_dictionaries,
    count_lines,
    dictionary_size,
    encode_files,
    length_ratio,
    log,
    train_sentencepiece,
)

DEFAULT_VOCAB = {"synthetic": 1000, "multi30k": 8000, "own": 8000}  # SentencePiece corpora
CORPORA = ("synthetic", "multi30k", "iwslt14", "own")


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
    if corpus == "own":
        own.check_langs((src, tgt))
    settings = {"corpus": corpus, "vocab_size": vocab_size or DEFAULT_VOCAB[corpus], "model_type": model_type}
    if (src, tgt) != LANGS or corpus == "own":  # en-de data prepared before languages were a choice stays current
        settings.update(src=src, tgt=tgt)
    if corpus == "own":
        settings.update(normalization=own.NORMALIZATION)
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
    if corpus == "own":  # every file read and checked before anything is written
        own_splits, report = own.read_own(raw_dir, langs)
    os.makedirs(dest_dir, exist_ok=True)
    if os.path.exists(os.path.join(dest_dir, "prepare.json")):
        os.remove(os.path.join(dest_dir, "prepare.json"))  # marks dest_dir unfinished until the end
    work_dir = work_dir or os.path.join(dest_dir, "work")
    text_dir, spm_dir = os.path.join(work_dir, "raw"), os.path.join(work_dir, "spm")
    log(f"[1/4] writing raw {corpus} text to {text_dir}")
    if corpus == "synthetic":
        report = synthetic_en_de.make_synthetic_en_de(text_dir, seed=seed, **settings["sizes"])
    elif corpus == "own":
        own.write_own(text_dir, own_splits, langs)
    else:
        report = multi30k.load_multi30k(text_dir, raw_dir=raw_dir, download=download, langs=langs)
    normalization = {"normalization_rule_name": settings["normalization"]} if "normalization" in settings else {}
    log(f"[2/4] training a joint SentencePiece {model_type} model (vocab {vocab_size}"
        f"{', normalization ' + settings['normalization'] if normalization else ''})")
    model = train_sentencepiece(text_dir, os.path.join(spm_dir, "spm"), vocab_size, model_type, langs=langs,
                                **normalization)
    log("[3/4] encoding splits into pieces")
    encode_files(model, text_dir, spm_dir, langs=langs)
    log(f"[4/4] fairseq-preprocess -> {dest_dir}")
    binarize(spm_dir, dest_dir, src=src, tgt=tgt)
    shutil.copyfile(model, os.path.join(dest_dir, "spm.model"))
    extra, extra_report = {}, {}
    if corpus == "multi30k":  # the 2017 test sets, with the dictionaries just built (train/valid/test unchanged)
        extra, extra_report = multi30k.load_extra_test_sets(text_dir, raw_dir=raw_dir, download=download, langs=langs)
        if extra:
            log(f"[4/4] further test sets {', '.join(f'{k} = {v}' for k, v in extra.items())}")
            encode_files(model, text_dir, spm_dir, splits=tuple(extra), langs=langs)
            binarize_with_dictionaries(spm_dir, dest_dir, tuple(extra), src, tgt)
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
    if corpus == "multi30k":
        record_test_sets(summary, extra, text_dir, extra_report)
    with open(os.path.join(dest_dir, "prepare.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    return summary


def record_test_sets(summary, extra, text_dir, report):
    """Name every test split of a Multi30k data folder in its ``prepare.json`` record:
    ``test_sets`` (``{"test": "test_2016_flickr", "test1": "test_2017_flickr", ...}``) and
    ``test_set_files`` (raw source and references of each); the extra splits' line counts
    and reading reports go beside the others' (``counts``, ``report``). Keys already there
    keep their values."""
    src, tgt = summary.get("src", LANGS[0]), summary.get("tgt", LANGS[1])
    test_files = summary.get("test_files") or {
        lang_key: os.path.join(text_dir, f"test.{lang}") for lang_key, lang in (("src", src), ("tgt", tgt))}
    sets = dict(summary.get("test_sets") or {"test": multi30k.MULTI30K_FILES["test"]})
    files = dict(summary.get("test_set_files") or {"test": {"src": test_files["src"], "tgt": test_files["tgt"]}})
    for split, name in extra.items():
        sets[split] = name
        files[split] = {"src": os.path.abspath(os.path.join(text_dir, f"{split}.{src}")),
                        "tgt": os.path.abspath(os.path.join(text_dir, f"{split}.{tgt}"))}
        summary.setdefault("counts", {})[split] = count_lines(files[split]["src"])
        if split in report:
            summary.setdefault("report", {})[split] = report[split]
    summary["test_sets"], summary["test_set_files"] = sets, files
    return summary


def add_test_sets(dest_dir, raw_dir=None, download=False):
    """Add Multi30k's 2017 test sets to ``dest_dir``, a Multi30k folder ``prepare`` made
    before it binarized them: raw text (from ``raw_dir``, the folder the data was prepared
    from, or ``download``), the folder's own ``spm.model`` and dictionaries, binarized in a
    scratch folder; only the new ``test1`` / ``test2`` files are moved in (``pipeline.
    binarize_with_dictionaries``: an existing file is never rewritten) and ``prepare.json``
    is replaced atomically with the same record plus ``test_sets`` / ``test_set_files``.
    Safe while trainings read the folder. Returns the updated record."""
    path = os.path.join(dest_dir, "prepare.json")
    try:
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        raise DataError(f"--add-test-sets: {path} not found or not JSON: prepare {dest_dir} first") from None
    settings = summary.get("settings") or {}
    if settings.get("corpus", "multi30k") != "multi30k" or summary.get("bpe", "sentencepiece") != "sentencepiece":
        raise DataError(f"--add-test-sets: {dest_dir} holds {settings.get('corpus')!r}; only Multi30k has further "
                        "test sets")
    src, tgt = summary.get("src", LANGS[0]), summary.get("tgt", LANGS[1])
    if raw_dir is None and not download:
        raw_dir = settings.get("raw_dir")
        if not raw_dir:
            raise DataError(f"--add-test-sets: {path} names no raw folder: pass --raw-dir DIR or --download")
    if raw_dir is not None and not os.path.isdir(raw_dir):
        raise DataError(f"--raw-dir {raw_dir} is not a directory")
    model = os.path.join(dest_dir, "spm.model")
    for needed in (model, os.path.join(dest_dir, f"dict.{src}.txt"), os.path.join(dest_dir, f"dict.{tgt}.txt")):
        if not os.path.isfile(needed):
            raise DataError(f"--add-test-sets: {needed} not found: prepare {dest_dir} again")
    text_dir = summary.get("raw_dir") if os.path.isdir(summary.get("raw_dir") or "") else os.path.join(
        dest_dir, "work", "raw")
    spm_dir = summary.get("spm_dir") if os.path.isdir(summary.get("spm_dir") or "") else os.path.join(
        dest_dir, "work", "spm")
    scratch = tempfile.mkdtemp(prefix=".add_test_sets_text.", dir=dest_dir)
    try:
        extra, report = multi30k.load_extra_test_sets(os.path.join(scratch, "raw"), raw_dir, download, (src, tgt))
        if not extra:
            raise DataError(f"--add-test-sets: no 2017 test set ({', '.join(multi30k.EXTRA_TEST_FILES.values())}) "
                            f"for {src}-{tgt} in {raw_dir or 'the download'}")
        encode_files(model, os.path.join(scratch, "raw"), os.path.join(scratch, "spm"), splits=tuple(extra),
                     langs=(src, tgt))
        staged = [(os.path.join(scratch, "raw", f"{split}.{lang}"), os.path.join(text_dir, f"{split}.{lang}"))
                  for split in extra for lang in (src, tgt)]
        staged += [(os.path.join(scratch, "spm", f"{split}.spm.{lang}"), os.path.join(spm_dir, f"{split}.spm.{lang}"))
                   for split in extra for lang in (src, tgt)]
        _move_in(staged)
        log(f"[add-test-sets] fairseq-preprocess {', '.join(f'{k} = {v}' for k, v in extra.items())} -> {dest_dir} "
            "(the folder's own dictionaries)")
        binarize_with_dictionaries(spm_dir, dest_dir, tuple(extra), src, tgt)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record_test_sets(summary, extra, text_dir, report)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, ensure_ascii=False)
    os.replace(tmp, path)
    return summary


def _move_in(staged):
    """Move each ``(new, final)`` file in place; a final file already there must have the same
    bytes (then it stays), else nothing moves."""
    import filecmp

    for new, final in staged:
        if os.path.exists(final) and not filecmp.cmp(new, final, shallow=False):
            raise DataError(f"{final} exists and differs from the text prepared now: it is not replaced")
    for new, final in staged:
        if not os.path.exists(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            shutil.move(new, final)


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
