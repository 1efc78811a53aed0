"""The helpers the commands share now live in ``realformer_tools/cli/_common.py``; this name
is kept for scripts that still import it (``from _cli import comma_list, emit_json``)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli._common import comma_list, emit_json, user_dir  # noqa: E402,F401
