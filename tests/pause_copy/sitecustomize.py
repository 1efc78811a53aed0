"""Test-only: kill a real ``fairseq-train`` exactly while it copies a checkpoint.

Put this folder first on ``PYTHONPATH`` of a run with ``REALFORMER_NMT_TEST_PAUSE_COPY=<file
name>`` (e.g. ``checkpoint_last.pt``): Python imports this ``sitecustomize`` at start-up, and
the first time the atomic checkpoint copy (``realformer_tools.fairseq_fixes.atomic_checkpoint_copies``) is
about to move its written and fsynced ``<file name>.copy.tmp`` onto an existing ``<file
name>``, it prints :data:`PAUSE_MARKER` and the destination on stderr and sleeps, so that
``tests/test_reliability_resume.py`` can ``kill -9`` the process at that moment (the one
where fairseq's own in-place copy leaves a truncated file) instead of by chance. Without the
variable it changes nothing.
"""

import os
import sys
import time

PAUSE_ENV = "REALFORMER_NMT_TEST_PAUSE_COPY"
PAUSE_MARKER = "test hook: copy written, paused before replacing"
TMP_SUFFIX = ".copy.tmp"
FOLDER = os.path.dirname(os.path.abspath(__file__))

_name = os.environ.get(PAUSE_ENV)
if _name:
    _replace = os.replace

    def _pausing_replace(src, dst, *args, **kwargs):
        src_path, dst_path = os.fspath(src), os.fspath(dst)
        if (os.path.basename(dst_path) == _name and src_path == dst_path + TMP_SUFFIX
                and os.path.exists(dst_path)):
            print(f"{PAUSE_MARKER} {dst_path}", file=sys.stderr, flush=True)
            time.sleep(600)  # the test kills the process here
        return _replace(src, dst, *args, **kwargs)

    os.replace = _pausing_replace
