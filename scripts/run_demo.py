#!/usr/bin/env python
"""CPU demo: synthetic En->De corpus -> small RealFormer -> beam search -> sacreBLEU.

Runs ``realformer_tools/cli/run_demo.py`` from a checkout (the wheel installs it as the command
``realformer-demo``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.run_demo import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
