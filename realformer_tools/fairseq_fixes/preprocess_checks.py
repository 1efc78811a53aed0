"""fairseq-preprocess refuses parallel text it cannot use, before it writes anything.

Bugs (fairseq 0.12):

1. ``fairseq-preprocess`` binarizes a source and a target file of different line counts
   without a word (a test source of 503 lines against a 502-line reference): the data is
   unusable, and ``fairseq-train``/``fairseq-generate`` die later with a 26-line
   ``AssertionError: Source and target must contain the same number of examples`` naming no
   file.
2. A file that is not UTF-8 (a Latin-1 ``train.en``) ends in a ``UnicodeDecodeError``
   traceback from a worker, after ``--destdir``, the dictionaries and some binaries were
   written.

Fix: ``fairseq_cli.preprocess.main`` is wrapped (``cli_main`` looks it up when it runs):
before fairseq's own code (which first creates ``--destdir``), every file of
``--trainpref``/``--validpref``/``--testpref`` (each comma-separated prefix, both languages
unless ``--only-source``) is read: one that is not UTF-8 is one line naming the file, the
line and the byte; two files of one prefix whose line counts differ are one line naming both
files and both counts (lines counted as fairseq reads them). Nothing is written then. Valid
input passes unchanged (the files are only read).

When it is no longer needed: ``fairseq-preprocess`` with a 3-line ``train.en`` and a 2-line
``train.de`` exits non-zero without creating ``--destdir`` with the patch uninstalled.
"""

import functools
import os

import fairseq_cli.preprocess

from realformer_nmt.errors import DataError

from ..data.pipeline import utf8_line_count

_FIXED = "__realformer_fixed__"


def text_files(args):
    """``[(prefix, [file, ...])]``: the files fairseq-preprocess will read for each prefix."""
    langs = [args.source_lang] + ([] if args.only_source else [args.target_lang])
    out = []
    for flag in ("trainpref", "validpref", "testpref"):
        value = getattr(args, flag, None)
        for prefix in (value.split(",") if value else []):
            out.append((prefix, [f"{prefix}.{lang}" if lang else prefix for lang in langs]))
    return out


def check_text(args):
    """The checks above; DataError (one line) for the first file or pair that fails."""
    for _, files in text_files(args):
        counts = {}
        for path in files:
            if not os.path.isfile(path):  # fairseq names a missing file itself
                continue
            counts[path] = utf8_line_count(path)
        if len(set(counts.values())) > 1:
            (src, n_src), (tgt, n_tgt) = counts.items()
            raise DataError(f"{src} has {n_src} lines but {tgt} has {n_tgt}: line n of the two files must be a "
                            "translation pair (nothing was written)")


def checked_main(main):
    @functools.wraps(main)
    def wrapper(args, *rest, **kwargs):
        check_text(args)
        return main(args, *rest, **kwargs)

    setattr(wrapper, _FIXED, True)
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq_cli.preprocess:main",
)
CHANGES = ("fairseq-preprocess refuses parallel files of different line counts, and text that is not UTF-8, "
           "in one line before it writes anything")


def install():
    if not getattr(fairseq_cli.preprocess.main, _FIXED, False):
        fairseq_cli.preprocess.main = checked_main(fairseq_cli.preprocess.main)


def uninstall():
    """Restore fairseq's own ``main`` (tests use this to see what fairseq does alone)."""
    if getattr(fairseq_cli.preprocess.main, _FIXED, False):
        fairseq_cli.preprocess.main = fairseq_cli.preprocess.main.__wrapped__
