"""Export a ``realformer_bert`` checkpoint (or a converted Google checkpoint) to a Hugging
Face model folder: the console command ``realformer-export-hf``, the same as
``scripts/export_hf.py`` (issue 26).

A thin front: the flags and the work live in
``realformer_nmt.models.realformer_bert.hf_export.main(argv)``, imported only when the
command runs (it imports fairseq and, for the export, ``transformers``: ``pip install
'realformer-nmt[hf]'``).
"""

import importlib
import os
import sys

from ._common import user_dir

MODULE = "realformer_nmt.models.realformer_bert.hf_export"


def main(argv=None):
    # TODO(lead, issue 26): hf_export (another branch) must expose ``main(argv=None)`` that
    # parses the flags of scripts/export_hf.py and returns an exit status; this front and
    # scripts/export_hf.py then both call it. Until it is merged the command says so in one line.
    if not os.path.isfile(os.path.join(user_dir(), *MODULE.split(".")[1:]) + ".py"):
        print(f"realformer-export-hf: error: this install has no {MODULE} (the Hugging Face export)", file=sys.stderr)
        return 1
    return importlib.import_module(MODULE).main(argv)


if __name__ == "__main__":
    sys.exit(main())
