#!/usr/bin/env python
"""Speed and memory of realformer_transformer against fairseq's transformer, same run.

Runs ``realformer_tools/cli/benchmark_speed.py`` from a checkout (the wheel installs it as the command
``realformer-benchmark-speed``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.benchmark_speed import command, main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(command())
