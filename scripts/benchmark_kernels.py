#!/usr/bin/env python
"""Residual-attention kernels timed against each other: the measurements behind

Runs ``realformer_tools/cli/benchmark_kernels.py`` from a checkout (the wheel installs it as the command
``realformer-benchmark-kernels``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.benchmark_kernels import command, main  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(command())
