"""``python -m realformer_nmt.experiments.gpu_check`` (``make gpu-check``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
