"""Importing fairseq 0.12 configures the root logger: ``fairseq.models.wav2vec.
wav2vec2_classification`` calls ``logging.basicConfig(level=DEBUG)`` at import, and
``fairseq_cli.interactive``/``eval_lm`` and ``fairseq.tasks.frm_text_to_speech`` call it at
INFO, so a program that only imports this plugin (a script, a notebook, the hub) prints
fairseq's import-time INFO lines (e.g. "Please install tensorboardX") before its own output.

:func:`root_logging_unchanged` prevents that for the imports this package makes: when the
root logger has no handler, it gets a stand-in for Python's last-resort handler (WARNING
and above, to stderr) for the duration of the block, so fairseq's ``basicConfig`` calls
do nothing and its INFO lines are dropped, as they would be without them; the stand-in
and any handler or level set during the block are removed afterwards. When a program
configured logging first (every ``fairseq-*`` CLI does, before ``--user-dir`` loads the
plugin), nothing changes.

Not needed once importing fairseq leaves the root logger alone: ``python -c "import logging,
fairseq.models; print(logging.getLogger().handlers)"`` prints ``[]``.

:func:`silence_tensorboardx_hint` drops the one INFO line fairseq's import logs for a
speech task this project never uses (``fairseq.tasks.text_to_speech``: "Please install
tensorboardX"), also where a program configured INFO logging before importing the plugin,
unless its command line has ``--tensorboard-logdir``. A ``fairseq-*`` command imports
fairseq before ``--user-dir`` loads the plugin, so the line it prints first is fairseq's and
stays (installing ``tensorboardX`` removes it).
"""

import contextlib
import logging
import sys

TENSORBOARDX_HINT = "Please install tensorboardX"
TENSORBOARDX_HINT_LOGGER = "fairseq.tasks.text_to_speech"


class _NoTensorboardXHint(logging.Filter):
    def filter(self, record):
        asked = any(arg.startswith("--tensorboard-logdir") for arg in sys.argv)
        return asked or not str(record.msg).startswith(TENSORBOARDX_HINT)


def silence_tensorboardx_hint():
    """Drop fairseq's import-time "Please install tensorboardX" line (idempotent); call it
    before fairseq is imported."""
    logger = logging.getLogger(TENSORBOARDX_HINT_LOGGER)
    if not any(isinstance(f, _NoTensorboardXHint) for f in logger.filters):
        logger.addFilter(_NoTensorboardXHint())


@contextlib.contextmanager
def root_logging_unchanged():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    if handlers:
        yield
        return
    stand_in = logging.StreamHandler()
    stand_in.setLevel(logging.WARNING)
    root.addHandler(stand_in)
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
