"""Raw text -> SentencePiece -> ``fairseq-preprocess --only-source``: a data dir for
encoder pre-training (``--task masked_lm`` and ``--task masked_lm_nsp``).

``prepare_pretraining(raw_dir, out_dir)`` writes into ``out_dir``: ``dict.txt``,
``train.{bin,idx}``, ``valid.{bin,idx}``, ``spm.model`` and ``prepare.json`` (the summary).
Each line of the binarized text is one paragraph; documents are separated by one empty
line, which fairseq stores as an EOS-only item: ``--sample-break-mode complete_doc`` of
``masked_lm`` and the sentence pairs of ``masked_lm_nsp`` read document boundaries from it.

Raw files: ``train.txt`` (or ``wiki.train.tokens``) for training; when the directory has
none, ``test.txt`` (or ``wiki.test.tokens``): the WikiText-2 copy in ``shared/data`` has
only ``test.txt`` and ``valid.txt``, so its test split is the training text here.
``valid.txt`` (or ``wiki.valid.tokens``) is the validation text.

Resumable: intermediate files go to ``work_dir`` (default ``out_dir/work``) and every
finished step is recorded in ``work_dir/steps.json`` under a key of the settings and the
input files' SHA-256; a re-run with the same key skips the steps already done (and
everything when ``prepare.json`` says the data dir is complete), a changed input or
setting starts over.
"""

import hashlib
import json
import os
import shutil

from realformer_nmt.errors import DataError

from . import pipeline, wikitext

SPLITS = ("train", "valid")
DEFAULT_VOCAB = 8000
MIN_VOCAB = 50
RAW_CANDIDATES = {
    "train": ("train.txt", "wiki.train.tokens", "test.txt", "wiki.test.tokens"),
    "valid": ("valid.txt", "wiki.valid.tokens"),
}
FLAGS = {"train": "--train-file", "valid": "--valid-file"}


def raw_dir_hint():
    """What --raw-dir must hold, for the error about one that is missing."""
    return (f"give a folder of raw text holding {' or '.join(RAW_CANDIDATES['train'][:2])} and "
            f"{' or '.join(RAW_CANDIDATES['valid'])} (WikiText-2's archive has the wiki.*.tokens files)")
# WikiText writes an out-of-vocabulary word as the literal "<unk>": one SentencePiece
# symbol, which fairseq's dictionary reads as its own <unk> (SentencePiece's unknown
# piece is renamed so the two do not clash).
UNK_LITERAL = "<unk>"
SPM_OPTIONS = dict(user_defined_symbols=[UNK_LITERAL], unk_piece="<spm_unk>",
                   max_sentence_length=1 << 16)  # WikiText paragraphs exceed spm's default 4192 bytes
STEPS = ("documents", "sentencepiece", "pieces", "binarize")
OUTPUTS = ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", "spm.model")


def complete_dictionary(dict_path, spm_model):
    """Append to fairseq ``dict_path`` (count 0) every piece ``spm_model`` can produce that it
    lacks; return how many. Control pieces and SentencePiece's unknown piece are not pieces
    of text; the ``<unk>`` literal is fairseq's own ``<unk>``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    with open(dict_path, encoding="utf-8") as f:
        present = {line.rsplit(" ", 1)[0] for line in f if line.strip()}
    present |= {"<s>", "<pad>", "</s>", UNK_LITERAL}
    missing = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
               if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in present]
    with open(dict_path, "a", encoding="utf-8") as f:
        f.writelines(f"{piece} 0\n" for piece in missing)
    return len(missing)


def find_raw_files(raw_dir, train_file=None, valid_file=None):
    """``{"train": path, "valid": path}``: explicit names (relative to ``raw_dir``), or the
    first of ``RAW_CANDIDATES`` that exists."""
    if not os.path.isdir(raw_dir):
        raise DataError(f"--raw-dir {raw_dir} is not a directory: {raw_dir_hint()}")
    files = {}
    for split, given in (("train", train_file), ("valid", valid_file)):
        if given:
            path = given if os.path.isabs(given) else os.path.join(raw_dir, given)
            if not os.path.isfile(path):
                raise DataError(f"{path} not found ({FLAGS[split]})")
        else:
            found = [os.path.join(raw_dir, n) for n in RAW_CANDIDATES[split]
                     if os.path.isfile(os.path.join(raw_dir, n))]
            if not found:
                raise DataError(f"--raw-dir {raw_dir} has no {split} text (looked for "
                                f"{', '.join(RAW_CANDIDATES[split])}; or name it with {FLAGS[split]})")
            path = found[0]
        files[split] = os.path.abspath(path)
    if files["train"] == files["valid"]:
        raise DataError(f"{files['train']} is both the train and the valid text")
    return files


def pretraining_settings(raw_dir, vocab_size=None, train_file=None, valid_file=None, model_type="bpe",
                         full_vocabulary=False):
    """What ``prepare_pretraining`` records, and its key (settings + inputs' SHA-256)."""
    vocab_size = DEFAULT_VOCAB if vocab_size is None else vocab_size
    if vocab_size < MIN_VOCAB:
        raise DataError(f"--vocab-size {vocab_size} is too small (use at least {MIN_VOCAB})")
    if model_type not in ("bpe", "unigram"):
        raise DataError(f"--model-type must be bpe or unigram, not {model_type!r}")
    files = find_raw_files(raw_dir, train_file, valid_file)
    settings = {
        "raw_files": files,
        "sha256": {split: _sha256(path) for split, path in files.items()},
        "vocab_size": vocab_size,
        "model_type": model_type,
    }
    if full_vocabulary:  # recorded only when on: data prepared before the flag keeps its key
        settings["full_vocabulary"] = True
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return settings, key


def prepare_pretraining(raw_dir, out_dir, vocab_size=None, work_dir=None, train_file=None,
                        valid_file=None, model_type="bpe", log=None, full_vocabulary=False):
    """Build the pre-training data dir ``out_dir``; return the summary (also in prepare.json).

    ``full_vocabulary``: ``dict.txt`` gets every piece SentencePiece can produce (those the
    train text never produced with count 0, after fairseq's own entries, whose ids stay the
    same), so a piece of new text is never fairseq's ``<unk>`` and the model's vocabulary is
    exactly the SentencePiece model's: what ``scripts/export_hf.py`` needs to export a
    tokenizer with fairseq's ids. Off by default here (the committed results used the
    dictionary of the train text alone); ``scripts/prepare_pretraining_data.py`` turns it on
    unless given ``--no-full-vocabulary``."""
    log = log or pipeline.log
    settings, key = pretraining_settings(raw_dir, vocab_size, train_file, valid_file, model_type,
                                         full_vocabulary)
    done = prepared(out_dir)
    if done is not None and done.get("key") == key:
        log(f"{out_dir} is already prepared from these inputs and settings: nothing to do")
        return done

    work_dir = os.path.abspath(work_dir or os.path.join(out_dir, "work"))
    text_dir, spm_dir = os.path.join(work_dir, "text"), os.path.join(work_dir, "spm")
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(text_dir, exist_ok=True)
    _remove(os.path.join(out_dir, "prepare.json"))  # marks out_dir unfinished until the end
    steps_path = os.path.join(work_dir, "steps.json")
    steps = _read_json(steps_path) or {}
    if steps.get("key") != key:
        steps = {"key": key}
    texts = {split: os.path.join(text_dir, f"{split}.txt") for split in SPLITS}
    pieces = {split: os.path.join(spm_dir, f"{split}.spm") for split in SPLITS}
    spm_model = os.path.join(spm_dir, "spm.model")

    def finished(step, *paths):
        if step in steps and all(os.path.exists(p) for p in paths):
            log("  (done before, skipped)")
            return True
        return False

    def record(step, value):
        steps[step] = value
        for later in STEPS[STEPS.index(step) + 1:]:  # built from the old output: redo
            steps.pop(later, None)
        _write_json(steps_path, steps)

    log(f"[1/4] documents from {settings['raw_files']['train']} (train) and "
        f"{settings['raw_files']['valid']} (valid) -> {text_dir}")
    if not finished("documents", *texts.values()):
        stats = {}
        for split in SPLITS:
            documents, stats[split] = wikitext.read_documents(
                settings["raw_files"][split], flag=FLAGS[split])
            _atomic_write_lines(texts[split], _document_lines(documents))
            log(f"  {split}: {stats[split]['documents']} documents, {stats[split]['text_lines']} lines, "
                f"{stats[split]['words']} words (split at {stats[split]['documents_by'].replace('_', ' ')})")
        record("documents", stats)

    vocab = settings["vocab_size"]
    log(f"[2/4] SentencePiece {settings['model_type']} model, vocabulary {vocab}, trained on the train text")
    if not finished("sentencepiece", spm_model):
        prefix = os.path.join(spm_dir, "spm.tmp")
        pipeline.train_sentencepiece_on([texts["train"]], prefix, vocab, settings["model_type"], **SPM_OPTIONS)
        os.replace(prefix + ".model", spm_model)
        _remove(prefix + ".vocab")
        record("sentencepiece", True)

    log(f"[3/4] encoding into pieces -> {spm_dir}")
    if not finished("pieces", *pieces.values()):
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=spm_model)
        counts = {}
        for split in SPLITS:
            lines = pipeline.read_lines(texts[split])
            encoded = [" ".join(p) for p in sp.encode(lines, out_type=str)]
            _atomic_write_lines(pieces[split], encoded)
            counts[split] = sum(len(line.split()) for line in encoded)
            log(f"  {split}: {counts[split]} pieces")
        record("pieces", counts)

    log(f"[4/4] fairseq-preprocess --only-source -> {out_dir}")
    if not finished("binarize", *(os.path.join(out_dir, n) for n in OUTPUTS if n != "spm.model")):
        _remove(os.path.join(out_dir, "dict.txt"))  # fairseq-preprocess refuses to overwrite it
        dict_flags = []
        if settings.get("full_vocabulary"):
            dict_dir = os.path.join(work_dir, "dict")
            _remove(os.path.join(dict_dir, "dict.txt"))
            pipeline.fairseq_preprocess("--only-source", "--trainpref", pieces["train"], "--destdir", dict_dir,
                                        "--dict-only", "--workers", 1)
            added = complete_dictionary(os.path.join(dict_dir, "dict.txt"), spm_model)
            log(f"  --full-vocabulary: {added} SentencePiece pieces the train text never produced added to dict.txt")
            dict_flags = ["--srcdict", os.path.join(dict_dir, "dict.txt")]
        pipeline.fairseq_preprocess(
            "--only-source", "--trainpref", pieces["train"], "--validpref", pieces["valid"],
            "--destdir", out_dir, "--workers", 1, *dict_flags,
        )
        record("binarize", True)
    shutil.copyfile(spm_model, os.path.join(out_dir, "spm.model"))

    summary = {
        "key": key,
        "settings": settings,
        "documents": steps["documents"],
        "pieces": steps["pieces"],
        "dictionary_size": pipeline.dictionary_size(os.path.join(out_dir, "dict.txt"), extra=1),  # + <mask>
        "out_dir": os.path.abspath(out_dir),
        "work_dir": work_dir,
        "spm_model": os.path.abspath(os.path.join(out_dir, "spm.model")),
    }
    _write_json(os.path.join(out_dir, "prepare.json"), summary)
    return summary


def prepared(out_dir):
    """The summary of a finished ``prepare_pretraining`` in ``out_dir``, or None."""
    summary = _read_json(os.path.join(out_dir, "prepare.json"))
    if not summary or not all(os.path.exists(os.path.join(out_dir, n)) for n in OUTPUTS):
        return None
    return summary


def _document_lines(documents):
    """One line per paragraph, one empty line between documents."""
    lines = []
    for i, doc in enumerate(documents):
        if i:
            lines.append("")
        lines.extend(doc)
    return lines


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(tmp, path)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def _remove(path):
    if os.path.exists(path):
        os.remove(path)

