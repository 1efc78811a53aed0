"""The preparation steps every corpus shares: raw text (written by a corpus module:
``synthetic_en_de``, ``multi30k``) -> joint SentencePiece model -> ``*.spm.{en,de}`` piece
files -> ``fairseq-preprocess`` binaries. ``corpora.prepare`` runs them for a named
corpus; this module knows no corpus (the corpus modules build on it, never the reverse).
"""

import gzip
import os
import sys

from realformer_nmt.errors import DataError  # noqa: F401  (raised here; pipeline.DataError for callers)

SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")


def _write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def read_lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_split(out_dir, split, pairs, langs=LANGS):
    """Write ``split.<src>`` / ``split.<tgt>`` from (src, tgt) pairs (``langs``: the two codes)."""
    os.makedirs(out_dir, exist_ok=True)
    for i, lang in enumerate(langs):
        _write_lines(os.path.join(out_dir, f"{split}.{lang}"), [p[i] for p in pairs])


def not_utf8(path, line, raw, exc):
    """The DataError for line ``line`` (its bytes ``raw``) of ``path``, which is not UTF-8."""
    return DataError(f"{path} is not UTF-8: line {line}, byte {exc.start + 1} of the line (0x{raw[exc.start]:02x}): "
                     "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def utf8_line_count(path):
    """Lines of the file ``path`` as fairseq's text-mode reading counts them (``\\n``, ``\\r\\n``
    and ``\\r`` end a line; a last line without one counts), read a line at a time; a
    DataError naming the file, the line and the byte where it is not UTF-8."""
    count, last = 0, b""
    try:
        with open(path, "rb") as f:
            for line, raw in enumerate(f, 1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise not_utf8(path, line, raw, exc) from None
                count += raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").count(b"\n")
                last = raw
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    return count + (1 if last and not last.endswith((b"\n", b"\r")) else 0)


def read_text_lines(path, strict=False):
    """Lines of a plain or gzipped file: (lines, number of lines with invalid UTF-8).

    Only ``\\n`` ends a line; whitespace inside a line (``\\r``, tabs, ...) is collapsed
    to single spaces so that every downstream tool sees the same line count. Invalid UTF-8 is
    replaced (U+FFFD) and counted, or with ``strict`` a DataError naming the line and byte.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    lines, bad = [], 0
    for number, raw in enumerate(raw_lines, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if strict:
                raise not_utf8(path, number, raw, exc) from None
            text, bad = raw.decode("utf-8", errors="replace"), bad + 1
        lines.append(" ".join(text.lstrip("\ufeff").split()))
    return lines, bad


def read_parallel(src_path, tgt_path):
    """Aligned non-empty (src, tgt) pairs and a report of what was fixed or dropped."""
    src, src_bad = read_text_lines(src_path)
    tgt, tgt_bad = read_text_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{tgt_path} has {len(tgt)} lines but {src_path} has {len(src)}: "
                        "the files are not aligned")
    pairs = [(s, t) for s, t in zip(src, tgt) if s and t]
    report = {"lines": len(src), "kept": len(pairs), "dropped_empty": len(src) - len(pairs),
              "non_utf8_lines": {src_path: src_bad, tgt_path: tgt_bad}}
    return pairs, report


# --------------------------------------------------------------------------------------
# SentencePiece and fairseq-preprocess
# --------------------------------------------------------------------------------------

def train_sentencepiece(raw_dir, out_prefix, vocab_size, model_type="bpe", max_sentences=0, langs=LANGS,
                        **options):
    """Train a joint SentencePiece model on ``train.<src>`` + ``train.<tgt>``; return the .model path
    (``options``: as :func:`train_sentencepiece_on`'s)."""
    inputs = [os.path.join(raw_dir, f"train.{lang}") for lang in langs]
    return train_sentencepiece_on(inputs, out_prefix, vocab_size, model_type, max_sentences, **options)


def train_sentencepiece_on(inputs, out_prefix, vocab_size, model_type="bpe", max_sentences=0, **options):
    """Train a SentencePiece model on the text files ``inputs``; return the .model path.

    ``options``: further ``SentencePieceTrainer`` options (e.g. ``user_defined_symbols``,
    ``normalization_rule_name="identity"``)."""
    import sentencepiece as spm

    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=",".join(inputs), model_prefix=out_prefix, vocab_size=vocab_size,
        model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
        input_sentence_size=max_sentences, shuffle_input_sentence=True,
        num_threads=1, minloglevel=2, **options,
    )
    return out_prefix + ".model"


def encode_files(model_path, raw_dir, out_dir, splits=SPLITS, langs=LANGS):
    """Write ``{split}.spm.{lang}`` piece files for every raw split; return their prefix map."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    os.makedirs(out_dir, exist_ok=True)
    for split in splits:
        for lang in langs:
            lines = read_lines(os.path.join(raw_dir, f"{split}.{lang}"))
            pieces = sp.encode(lines, out_type=str)
            _write_lines(os.path.join(out_dir, f"{split}.spm.{lang}"), [" ".join(p) for p in pieces])
    return {split: os.path.join(out_dir, f"{split}.spm") for split in splits}


def binarize(spm_dir, dest_dir, src="en", tgt="de", joined_dictionary=True, workers=1):
    """Run ``fairseq-preprocess`` (in this process) on ``{train,valid,test}.spm.*``."""
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src, "--target-lang", tgt,
           "--destdir", dest_dir, "--workers", str(workers)]
    for split, flag in zip(SPLITS, ("--trainpref", "--validpref", "--testpref")):
        cmd += [flag, os.path.join(spm_dir, f"{split}.spm")]
    if joined_dictionary:
        cmd.append("--joined-dictionary")
    _run_preprocess(cmd)
    return dest_dir


def binarize_with_dictionaries(spm_dir, dest_dir, splits, src="en", tgt="de"):
    """Binarize ``{split}.spm.{src,tgt}`` for each of ``splits`` (e.g. ``test1``) with the
    dictionaries already in ``dest_dir`` (``--srcdict`` / ``--tgtdict``): each split goes
    through fairseq-preprocess in a scratch folder inside ``dest_dir``, and only its four
    ``<split>.<src>-<tgt>.<lang>.{bin,idx}`` files are moved in. Nothing in ``dest_dir`` is
    rewritten: a file that is already there must be byte-identical to the new one (then it
    is left alone), anything else is refused before any file moves. Returns the files
    moved in."""
    import filecmp
    import shutil
    import tempfile

    pair = f"{src}-{tgt}"
    staged = []  # (scratch file, final path)
    scratch = tempfile.mkdtemp(prefix=".add_test_sets.", dir=dest_dir)
    try:
        for split in splits:
            out = os.path.join(scratch, split)
            _run_preprocess([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", src,
                             "--target-lang", tgt, "--destdir", out, "--workers", "1",
                             "--srcdict", os.path.join(dest_dir, f"dict.{src}.txt"),
                             "--tgtdict", os.path.join(dest_dir, f"dict.{tgt}.txt"),
                             "--testpref", os.path.join(spm_dir, f"{split}.spm")])
            for lang in (src, tgt):
                for ext in ("bin", "idx"):
                    staged.append((os.path.join(out, f"test.{pair}.{lang}.{ext}"),
                                   os.path.join(dest_dir, f"{split}.{pair}.{lang}.{ext}")))
        for new, final in staged:
            if os.path.exists(final) and not filecmp.cmp(new, final, shallow=False):
                raise DataError(f"{final} exists and differs from the split binarized now: it is not replaced "
                                "(move it away to add this test set again)")
        moved = []
        for new, final in staged:
            if not os.path.exists(final):
                os.replace(new, final)
                moved.append(final)
        return moved
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fairseq_preprocess(*args):
    """Run ``fairseq-preprocess`` with ``args``; DataError on failure."""
    _run_preprocess([sys.executable, "-m", "fairseq_cli.preprocess", *map(str, args)])


def _run_preprocess(cmd):
    """``fairseq_cli.preprocess`` with ``cmd``'s arguments (after ``-m fairseq_cli.preprocess``) in
    this process, as its own process would run it: ``sys.argv`` set, its log (INFO, also its
    ``preprocess.log``) and anything it prints kept out of this process's streams, every logger
    as it was afterwards. A failure (its exit status or an exception) is a DataError whose
    message ends with the last 15 lines it wrote. One call at a time (it redirects this
    process's streams): the preparation commands call it from one thread."""
    import contextlib
    import io
    import logging
    import traceback

    args = [str(a) for a in cmd[cmd.index("fairseq_cli.preprocess") + 1:]]
    root = logging.getLogger()
    saved_root = list(root.handlers), root.level
    guard = logging.NullHandler()
    root.addHandler(guard)  # importing fairseq must not configure this process's root logger
    try:
        from fairseq import options
        from fairseq_cli import preprocess
    finally:
        root.removeHandler(guard)
    own = logging.getLogger("fairseq_cli.preprocess")
    saved_own = own.level, list(own.handlers), own.propagate
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    saved_argv, code = list(sys.argv), 0
    try:
        sys.argv[:] = [os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess"), *args]
        root.handlers[:] = [handler]  # fairseq's other loggers, as its process's stdout
        root.setLevel(logging.INFO)
        own.setLevel(logging.INFO)
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            try:
                preprocess.main(options.get_preprocessing_parser().parse_args(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=text)
            except Exception:
                traceback.print_exc(file=text)
                code = 1
    finally:
        sys.argv[:] = saved_argv
        for added in own.handlers:
            if added not in saved_own[1]:
                added.close()  # main adds a FileHandler for <destdir>/preprocess.log on every call
        own.setLevel(saved_own[0])
        own.handlers[:], own.propagate = saved_own[1], saved_own[2]
        handler.close()
        root.handlers[:] = saved_root[0]
        root.setLevel(saved_root[1])
    if code != 0:
        tail = "\n".join(text.getvalue().strip().splitlines()[-15:])
        raise DataError(f"fairseq-preprocess failed (exit {code}):\n{tail}")


def dictionary_size(path, extra=0):
    """Symbols of a model built on fairseq ``dict.txt`` ``path``: its lines, fairseq's four
    specials (``<s>``, ``<pad>``, ``</s>``, ``<unk>``) and ``extra`` (e.g. 1 for ``<mask>``)."""
    return count_lines(path) + 4 + extra


def length_ratio(spm_dir, src, tgt, split="train"):
    """Target pieces per source piece over ``split`` (bounds output length at decoding)."""
    totals = []
    for lang in (src, tgt):
        with open(os.path.join(spm_dir, f"{split}.spm.{lang}"), encoding="utf-8") as f:
            totals.append(sum(len(line.split()) for line in f))
    return totals[1] / max(1, totals[0])


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def log(message):
    """Progress line of a preparation step, on stderr (stdout carries the scripts' JSON)."""
    print(message, file=sys.stderr, flush=True)

