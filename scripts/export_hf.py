#!/usr/bin/env python
"""Export a fairseq realformer_bert checkpoint to a Hugging Face transformers folder.

Runs ``realformer_tools/cli/export_hf.py`` from a checkout (the wheel installs it as the command
``realformer-export-hf``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.export_hf import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
