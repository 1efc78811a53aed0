#!/usr/bin/env python
"""Attention entropy and adjacent-layer JSD per layer and head, with the paper's violin

Runs ``realformer_tools/cli/analyze_attention.py`` from a checkout (the wheel installs it as the command
``realformer-analyze-attention``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.analyze_attention import command, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(command())
