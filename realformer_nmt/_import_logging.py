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

fairseq's import-time "Please install tensorboardX" line (``fairseq.tasks.text_to_speech``,
on every ``fairseq-*`` command, before any plugin loads) is gone where ``tensorboardX`` is
installed (setup.py's ``tools`` extra); with it, fairseq's ``--tensorboard-logdir`` works too.
"""

import contextlib
import logging


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
