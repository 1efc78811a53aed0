"""An uncaught ``RealFormerError`` (a bad flag of ours, a refused checkpoint, a missing data
file) ends a fairseq command with one line, not a traceback.

Not a fairseq bug: the errors the other fixes raise are sentences meant for the user, and
Python prints them under a traceback whose last line is the same sentence. With this hook
installed (``sys.excepthook``; the launcher's other fixes and its own handling print the
same line), ``realformer_nmt: error: <message>`` is printed (exit status 1); every other
exception goes to the hook that was in place. The plugin's flags raise ``FlagValueError``
(one line) only while a hook marked ``realformer_one_line_errors`` is installed
(``realformer_nmt.errors.one_line_errors``); without it a bad value gets argparse's own
error, as any fairseq flag does.

When it is no longer needed: when no other fix raises a ``RealFormerError`` (they are
fairseq's to fix).
"""

import sys

from realformer_nmt.errors import MARKER, RealFormerError

REPLACES = ("sys:excepthook",)
CHANGES = "an uncaught RealFormerError prints one line (realformer_nmt: error: ...), not a traceback"


def _hook(previous):
    def one_line_excepthook(exc_type, exc, tb):
        if issubclass(exc_type, RealFormerError):
            print(f"realformer_nmt: error: {exc}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    setattr(one_line_excepthook, MARKER, True)
    return one_line_excepthook


def install():
    if not getattr(sys.excepthook, MARKER, False):
        sys.excepthook = _hook(sys.excepthook)
