"""Errors that the command-line tools report as one sentence, not a traceback.

Library callers (hub interface, tests) get an ordinary exception. The project's commands
print it as one line; in a fairseq CLI, the hook below (installed with the fixes to fairseq,
``fairseq_fixes_switch``, never by importing the plugin) prints
``realformer_nmt: error: <message>`` when one reaches the top uncaught (exit status 1).
Without it Python prints its traceback, whose last line is the same message.
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
    only while that hook is installed (:func:`one_line_errors`); without it the flag gets
    argparse's own error, as any fairseq flag does."""


class UnsafeCheckpointError(RealFormerError):
    """A checkpoint that holds objects fairseq checkpoints never contain."""


class CheckpointFileError(RealFormerError, OSError):
    """A checkpoint file that is missing, unreadable, truncated or not a torch checkpoint."""


class DataError(RealFormerError, ValueError):
    """A missing, unreadable or inconsistent corpus file (reported as one line by the CLIs)."""


_previous_hook = None  # the hook in place when install_excepthook replaced it


def _one_line_excepthook(exc_type, exc, tb):
    if issubclass(exc_type, RealFormerError):
        print(f"realformer_nmt: error: {exc}", file=sys.stderr)
        return
    (_previous_hook or sys.__excepthook__)(exc_type, exc, tb)


def one_line_errors() -> bool:
    """Whether uncaught RealFormerErrors print one line (the hook below is installed)."""
    return sys.excepthook is _one_line_excepthook


def install_excepthook():
    """Make uncaught RealFormerErrors print one line (exit status stays 1); idempotent."""
    global _previous_hook
    if sys.excepthook is not _one_line_excepthook:
        _previous_hook = sys.excepthook
        sys.excepthook = _one_line_excepthook
