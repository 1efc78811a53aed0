"""``fairseq-train`` whose every rank writes its own checkpoints (fairseq's own: rank 0
alone), so that the GPU check can compare the parameters each rank trained, bit for bit.
The same command line as ``fairseq-train``; each rank is given its own ``--save-dir``. It
runs with the fixes to fairseq 0.12, as the launcher runs fairseq-train (the data fixes as
``REALFORMER_NMT_DATA_FIXES`` says).

    python -m realformer_tools.experiments.every_rank_saves DATA ... --save-dir DIR/rank0 ...
"""

import logging
import os
import sys

from fairseq_cli import train

from realformer_tools.fairseq_fixes import fixes_installed
from realformer_tools.launch import DATA_FIXES_ENV, switch_asked

# fairseq-train's log format (fairseq_cli/train.py sets it when imported first; run as a
# module of this package, the package was imported before it)
logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                    level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)

# fairseq saves on the data-parallel master only (Trainer.should_save_checkpoint_on_current_rank)
train.Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)

if __name__ == "__main__":
    with fixes_installed(data_fixes=switch_asked(DATA_FIXES_ENV)):
        sys.exit(train.cli_main())
