#!/usr/bin/env python
"""Convert one of Google's released RealFormer BERT checkpoints to fairseq.

Runs ``realformer_tools/cli/convert_google_checkpoint.py`` from a checkout (the wheel installs it as the command
``realformer-convert-google-checkpoint``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.convert_google_checkpoint import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
