"""Errors that the command-line tools report as one sentence, not a traceback (the launcher's
one-line hook prints ``realformer_nmt: error: <message>``); library callers get an exception."""

import sys


class RealFormerError(Exception):
    """Base class for user-facing errors (bad flags, bad files, unsafe checkpoints)."""


class ConfigError(RealFormerError, ValueError):
    """A flag or configuration value that cannot build a correct model."""


class FlagValueError(RealFormerError):
    """A plugin flag's value that argparse cannot accept; not a ``ValueError``, so argparse lets it
    through to the one-line hook (raised only while one is installed: :func:`one_line_errors`)."""


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
