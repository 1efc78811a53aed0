"""Your own parallel text (``--corpus own --raw-dir DIR --src en --tgt de``): ``DIR`` holds
``{train,valid,test}.{src,tgt}`` (plain or ``.gz``), one sentence a line, line *n* of the two
files of a split a translation pair.

Everything is read and checked before anything is written: a file that is missing, not
UTF-8 (the file, the line and the byte named) or of another line count than its pair (both
files and both counts named) is one line (``DataError``). Whitespace inside a line is
collapsed to single spaces. In train and valid a pair with an empty side is dropped (and
counted); the test split keeps every line, so that hypothesis *n* is scored against line *n*
of your own reference file. The shared steps (``pipeline``) follow, with the SentencePiece
model trained under the ``identity`` normalization: a character seen in training comes back
from decoding exactly as written (SentencePiece's default, NFKC, would turn ``…`` into
``...``, ``ﬁ`` into ``fi`` and ``½`` into ``1⁄2``: text that no detokenized hypothesis could
match in your reference). A character never seen in training decodes as `` ⁇ ``."""

import os

from realformer_nmt.errors import DataError

from .pipeline import SPLITS, read_text_lines, write_split

NORMALIZATION = "identity"  # SentencePiece's normalization_rule_name for own data


def check_langs(langs):
    src, tgt = langs
    for flag, lang in (("--src", src), ("--tgt", tgt)):
        if not lang or not lang.replace("_", "").replace("-", "").isalnum() or lang.startswith("-"):
            raise DataError(f"{flag} {lang!r}: a language code, the file suffix (train.{lang or 'xx'})")
    if src == tgt:
        raise DataError(f"--src and --tgt are both {src!r}: give two different languages")


def raw_files(raw_dir, langs):
    """``{split: [source file, target file]}`` in ``raw_dir``; one DataError naming every
    missing file."""
    if raw_dir is None:
        raise DataError("--corpus own needs --raw-dir DIR, the folder of your train/valid/test files")
    if not os.path.isdir(raw_dir):
        raise DataError(f"--raw-dir {raw_dir} is not a directory")
    files, missing = {}, []
    for split in SPLITS:
        files[split] = []
        for lang in langs:
            found = [p for p in (os.path.join(raw_dir, f"{split}.{lang}"), os.path.join(raw_dir, f"{split}.{lang}.gz"))
                     if os.path.isfile(p)]
            files[split].append(found[0] if found else None)
            if not found:
                missing.append(f"{split}.{lang}")
    if missing:
        raise DataError(f"--raw-dir {raw_dir} has no {', '.join(missing)} (plain or .gz): --corpus own reads "
                        f"{', '.join(f'{s}.{lang}' for s in SPLITS for lang in langs)}")
    return files


def read_own(raw_dir, langs):
    """``{split: [(src, tgt), ...]}`` and a report, every file checked (nothing written)."""
    check_langs(langs)
    splits, report = {}, {}
    for split, (src_path, tgt_path) in raw_files(raw_dir, langs).items():
        src, tgt = (read_text_lines(path, strict=True)[0] for path in (src_path, tgt_path))
        if len(src) != len(tgt):
            raise DataError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: line n of the two files "
                            "must be a translation pair (nothing was written)")
        if not src:
            raise DataError(f"{src_path} and {tgt_path} are empty")
        pairs = list(zip(src, tgt)) if split == "test" else [(s, t) for s, t in zip(src, tgt) if s and t]
        splits[split] = pairs
        report[split] = {"lines": len(src), "kept": len(pairs), "dropped_empty": len(src) - len(pairs),
                         "files": [os.path.abspath(src_path), os.path.abspath(tgt_path)]}
    return splits, report


def write_own(out_dir, splits, langs):
    for split, pairs in splits.items():
        write_split(out_dir, split, pairs, langs)

