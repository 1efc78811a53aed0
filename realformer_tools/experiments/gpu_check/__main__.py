"""``python -m realformer_tools.experiments.gpu_check`` (``make gpu-check``)."""

import sys

from .device_run import main

if __name__ == "__main__":
    sys.exit(main())
