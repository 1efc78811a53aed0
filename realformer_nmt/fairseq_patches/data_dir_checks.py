"""One clear sentence, naming the path, when a translation data directory cannot be used.

Bug (fairseq 0.12): ``TranslationTask.setup_task`` on a missing directory, or on one
without ``dict.<lang>.txt``, fails deep inside with a traceback (``FileNotFoundError``
from ``Dictionary.load`` or "Could not infer language pair").

Fix: ``setup_task`` first checks the first data path and raises ``ConfigError``, which
the CLIs print as one line naming the path and the file.

When it is no longer needed: ``fairseq-train /nonexistent --task translation ...``
prints one line naming the path with the patch uninstalled.
"""

import glob
import os

from fairseq import utils
from fairseq.tasks.translation import TranslationTask

from ..errors import ConfigError


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


def install():
    setup_task = TranslationTask.__dict__["setup_task"].__func__
    if getattr(setup_task, "_checks_data", False):
        return

    def checked_setup_task(cls, cfg, **kwargs):
        check_translation_data(cfg)
        return setup_task(cls, cfg, **kwargs)

    checked_setup_task._checks_data = True
    TranslationTask.setup_task = classmethod(checked_setup_task)

