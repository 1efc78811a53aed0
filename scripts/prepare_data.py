#!/usr/bin/env python
"""Prepare a translation corpus for fairseq: raw text -> joint SentencePiece -> binaries.

Runs ``realformer_tools/cli/prepare_data.py`` from a checkout (the wheel installs it as the command
``realformer-prepare-data``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.prepare_data import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
