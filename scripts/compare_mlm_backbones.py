#!/usr/bin/env python
"""Post-LN vs Pre-LN vs RealFormer BERT-style encoders on a masked-LM corpus, one recipe.

Runs ``realformer_tools/cli/compare_mlm_backbones.py`` from a checkout (the wheel installs it as the command
``realformer-compare-mlm-backbones``). ``--help`` lists its flags and examples.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from realformer_tools.cli.compare_mlm_backbones import main, parse_args  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
