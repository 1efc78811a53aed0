"""Errors that the command-line tools report as one sentence, not a traceback.

Library callers (hub interface, tests) get an ordinary exception; when one of these
reaches the top of a fairseq CLI uncaught, the hook below prints
``realformer_nmt: error: <message>`` and exits with status 1.
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
    this one reaches the hook below and is the only line printed (exit status 1)."""


class UnsafeCheckpointError(RealFormerError):
    """A checkpoint that holds objects fairseq checkpoints never contain."""


class CheckpointFileError(RealFormerError, OSError):
    """A checkpoint file that is missing, unreadable, truncated or not a torch checkpoint."""


class DataError(RealFormerError, ValueError):
    """A missing, unreadable or inconsistent corpus file (reported as one line by the CLIs)."""


_previous_hook = sys.excepthook


def _one_line_excepthook(exc_type, exc, tb):
    if issubclass(exc_type, RealFormerError):
        print(f"realformer_nmt: error: {exc}", file=sys.stderr)
        return
    _previous_hook(exc_type, exc, tb)


def install_excepthook():
    """Make uncaught RealFormerErrors print one line (exit status stays 1)."""
    if sys.excepthook is not _one_line_excepthook:
        sys.excepthook = _one_line_excepthook
