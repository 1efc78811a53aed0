"""One clear sentence, naming the path, when a data directory or one of its binaries
cannot be used.

Bugs (fairseq 0.12):

1. ``TranslationTask.setup_task`` on a missing directory, or on one without
   ``dict.<lang>.txt``, fails deep inside with a traceback (``FileNotFoundError`` from
   ``Dictionary.load`` or "Could not infer language pair").
2. A truncated ``.bin`` (a copy cut short, a full disk during fairseq-preprocess) is
   memory-mapped as it is: training starts, and the first batch that reaches past its end
   dies in a 135-line traceback ("buffer is smaller than requested size") naming no file.

Fixes: ``setup_task`` first checks the first data path, and every indexed dataset fairseq
opens (``indexed_dataset.make_dataset``, through which ``load_indexed_dataset`` opens each
split of every task) first has its ``.bin`` checked against the size its ``.idx``
expects (:func:`check_binary`); both raise an error the CLIs print as one line naming
the file. ``train_preflight`` runs the same checks before fairseq-train creates --save-dir,
and :func:`check_pair_counts` (a split's source and target hold as many examples) there and
before fairseq-generate and fairseq-validate log anything.

When it is no longer needed: ``fairseq-train /nonexistent --task translation ...``
prints one line naming the path with the patch uninstalled, and so does a training run
on a data dir whose ``train.*.bin`` lost its last bytes.
"""

import glob
import itertools
import os
import re
import struct

import numpy as np
from fairseq import utils
from fairseq.data import data_utils, indexed_dataset
from fairseq.tasks.translation import TranslationTask

from realformer_nmt.errors import ConfigError, DataError

_FIXED = "__realformer_fixed__"
_MMAP_MAGIC = indexed_dataset.MMapIndexedDataset.Index._HDR_MAGIC  # fairseq-preprocess's default format
_LEGACY_MAGIC = indexed_dataset.IndexedDataset._HDR_MAGIC  # --dataset-impl lazy / cached
_MMAP_HEADER = struct.Struct("<9sQBQ")  # magic, version, dtype code, number of items


def check_translation_data(cfg):
    """Raise ConfigError unless the first data path is a directory with the dictionaries."""
    path = utils.split_paths(cfg.data)[0]
    if "://" in path:  # remote (iopath) storage: leave it to fairseq
        return
    if not os.path.isdir(path):
        raise ConfigError(f"data directory {path!r} does not exist (the DATA argument)")
    langs = [lang for lang in (cfg.source_lang, cfg.target_lang) if lang]
    wanted = [os.path.join(path, f"dict.{lang}.txt") for lang in langs]
    missing = [f for f in wanted if not os.path.isfile(f)]
    if missing or not glob.glob(os.path.join(path, "dict.*.txt")):
        what = missing[0] if missing else os.path.join(path, "dict.<lang>.txt")
        raise ConfigError(
            f"{what} not found: {path!r} is not a binarized corpus "
            "(make one with fairseq-preprocess or scripts/prepare_data.py)"
        )


def expected_binary_size(prefix):
    """The size in bytes that ``<prefix>.bin`` must have for the index ``<prefix>.idx``
    (None for a format this does not know); a truncated index is a DataError."""
    idx = prefix + ".idx"
    with open(idx, "rb") as f:
        head = f.read(_MMAP_HEADER.size)
    if head.startswith(_MMAP_MAGIC) and len(head) == _MMAP_HEADER.size:
        _, _, code, n = _MMAP_HEADER.unpack(head)
        if os.path.getsize(idx) < _MMAP_HEADER.size + 12 * n:  # int32 sizes, then int64 pointers
            raise DataError(f"{idx} is truncated: it is shorter than the {n} entries its header announces "
                            "(binarize the corpus again)")
        if n == 0:
            return 0
        itemsize = np.dtype(indexed_dataset._code_to_dtype[code]).itemsize
        last_size = np.fromfile(idx, dtype=np.int32, count=1, offset=_MMAP_HEADER.size + 4 * (n - 1))[0]
        last_pointer = np.fromfile(idx, dtype=np.int64, count=1, offset=_MMAP_HEADER.size + 4 * n + 8 * (n - 1))[0]
        return int(last_pointer) + int(last_size) * itemsize
    if head.startswith(_LEGACY_MAGIC):
        try:
            dataset = indexed_dataset.IndexedDataset(prefix)  # reads the index
        except (ValueError, AssertionError, struct.error) as exc:
            raise DataError(f"{idx} is truncated or corrupt (binarize the corpus again)") from exc
        return int(dataset.data_offsets[-1]) * dataset.element_size
    return None


def check_binary(prefix):
    """Raise DataError naming ``<prefix>.bin`` when it is shorter than its ``.idx`` expects."""
    expected = expected_binary_size(prefix)
    actual = os.path.getsize(prefix + ".bin")
    if expected is not None and actual < expected:
        raise DataError(f"{prefix}.bin is truncated: {actual} bytes where {prefix}.idx expects {expected} "
                        "(copy or binarize the corpus again)")


def check_split_binaries(data, splits):
    """:func:`check_binary` for every ``.idx``/``.bin`` pair of ``splits`` (``train``,
    ``valid``, ...; epoch shards ``train1`` ... included) in each local path of ``data``."""
    wanted = re.compile(r"(?:%s)\d*" % "|".join(re.escape(s) for s in splits))
    for path in utils.split_paths(data):
        if "://" in path or not os.path.isdir(path):
            continue
        for idx in sorted(glob.glob(os.path.join(path, "*.idx"))):
            prefix = idx[: -len(".idx")]
            if wanted.fullmatch(os.path.basename(idx).split(".")[0]) and os.path.isfile(prefix + ".bin"):
                check_binary(prefix)


def example_count(prefix):
    """How many examples the indexed dataset ``<prefix>.idx`` holds, as fairseq's own index
    readers count them (None for a format without such an index)."""
    impl = indexed_dataset.infer_dataset_impl(prefix)
    try:
        if impl == "mmap":
            return len(indexed_dataset.MMapIndexedDataset.Index(prefix + ".idx"))
        if impl in ("lazy", "cached"):
            return len(indexed_dataset.IndexedDataset(prefix))
    except (ValueError, AssertionError, struct.error) as exc:
        raise DataError(f"{prefix}.idx is truncated or corrupt (binarize the corpus again)") from exc
    return None


def language_pair(task):
    """(source, target) as ``TranslationTask.setup_task`` settles them: the task's
    --source-lang/--target-lang, else fairseq's guess from the first data path's file names."""
    src, tgt = getattr(task, "source_lang", None), getattr(task, "target_lang", None)
    path = utils.split_paths(task.data)[0]
    if (src is None or tgt is None) and "://" not in path and os.path.isdir(path):
        src, tgt = data_utils.infer_language_pair(path)
    return src, tgt


def pair_prefixes(path, split, src, tgt, combine):
    """The ``(source, target)`` file prefixes ``load_langpair_dataset`` reads for ``split``
    in ``path`` (its shards ``split1``, ``split2``, ... too where it combines them)."""
    for k in itertools.count():
        split_k = split + (str(k) if k else "")
        for a, b in ((src, tgt), (tgt, src)):  # fairseq's order: src-tgt, then tgt-src
            base = os.path.join(path, f"{split_k}.{a}-{b}.")
            if os.path.isfile(base + src + ".idx") and os.path.isfile(base + src + ".bin"):
                yield base + src, base + tgt
                break
        else:
            return
        if not combine:
            return


def check_pair_counts(task, split, combine=False):
    """Raise DataError naming both files and both counts when ``split``'s source and target
    ``.idx`` hold different numbers of examples (fairseq's LanguagePairDataset would stop on
    an assertion naming no file). ``combine``: the training split, read from every data path
    (one per epoch) with its shards; otherwise the first path, as fairseq reads it."""
    src, tgt = language_pair(task)
    if not (src and tgt):
        return
    paths = utils.split_paths(task.data)
    for path in paths if combine else paths[:1]:
        if "://" in path or not os.path.isdir(path):
            continue
        for source, target in pair_prefixes(path, split, src, tgt, combine):
            if not (os.path.isfile(target + ".idx") and os.path.isfile(target + ".bin")):
                continue  # no target side (source-only data): fairseq reads the source alone
            n, m = example_count(source), example_count(target)
            if None not in (n, m) and n != m:
                raise DataError(f"{source}.idx has {n} examples but {target}.idx has {m}: a split's source and "
                                "target must pair line for line (binarize them again from text files of equal "
                                "line counts)")


def checked_make_dataset(make_dataset):
    def wrapper(path, impl, *args, **kwargs):
        if impl in ("mmap", "lazy", "cached") and os.path.isfile(path + ".idx") and os.path.isfile(path + ".bin"):
            check_binary(path)
        return make_dataset(path, impl, *args, **kwargs)

    wrapper.__wrapped__ = make_dataset
    setattr(wrapper, _FIXED, True)
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.data.indexed_dataset:make_dataset",
    "fairseq.tasks.translation:TranslationTask.setup_task",
)
CHANGES = ("a missing data dir or dictionary, or a truncated .bin, is one line naming the file")


def install():
    if not getattr(indexed_dataset.make_dataset, _FIXED, False):
        indexed_dataset.make_dataset = checked_make_dataset(indexed_dataset.make_dataset)
    setup_task = TranslationTask.__dict__["setup_task"].__func__
    if getattr(setup_task, "_checks_data", False):
        return

    def checked_setup_task(cls, cfg, **kwargs):
        check_translation_data(cfg)
        return setup_task(cls, cfg, **kwargs)

    checked_setup_task._checks_data = True
    TranslationTask.setup_task = classmethod(checked_setup_task)

