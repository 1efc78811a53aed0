"""Errors that the command-line tools report as one sentence, not a traceback.

Library callers (hub interface, tests) get an ordinary exception. The project's commands,
and fairseq commands run through the tools' launcher (``realformer-fairseq``), print it as
one line, ``realformer_nmt: error: <message>`` (exit status 1). In a plain fairseq command
Python prints its traceback, whose last line is the same message.
"""

import sys


class RealFormerError(Exception):
    """Base class for user-facing errors (bad flags, bad files, unsafe checkpoints)."""


class ConfigError(RealFormerError, ValueError):
    """A flag or configuration value that cannot build a correct model."""


class FlagValueError(RealFormerError):
    """A plugin flag's value that argparse cannot accept. Raised from the flag's ``type``
    function and deliberately not a ``ValueError``: argparse would catch that and print the
    host tool's whole usage (about 175 lines for fairseq-train) before its one-line error;
    this one reaches the hook below and is the only line printed (exit status 1). Raised
    only while such a hook is installed (:func:`one_line_errors`); without it the flag gets
    argparse's own error, as any fairseq flag does."""


class UnsafeCheckpointError(RealFormerError):
    """A checkpoint that holds objects fairseq checkpoints never contain."""


class CheckpointFileError(RealFormerError, OSError):
    """A checkpoint file that is missing, unreadable, truncated or not a torch checkpoint."""


class DataError(RealFormerError, ValueError):
    """A missing, unreadable or inconsistent corpus file (reported as one line by the CLIs)."""


# the attribute that marks a ``sys.excepthook`` printing uncaught RealFormerErrors as one line
# (the tools' launcher installs one; the plugin installs nothing)
MARKER = "realformer_one_line_errors"


def one_line_errors() -> bool:
    """Whether uncaught RealFormerErrors print one line (such a hook is installed)."""
    return bool(getattr(sys.excepthook, MARKER, False))
