"""``fairseq-train`` whose every rank writes its own checkpoints (fairseq's own: rank 0
alone), so a test can compare what each node of a multi-node run trained. The same
command line as ``fairseq-train``; each node gives its own ``--save-dir``."""

import sys

from fairseq_cli import train  # as fairseq-train: importing it first sets up its log format

# fairseq saves on the data-parallel master only (Trainer.should_save_checkpoint_on_current_rank)
train.Trainer.should_save_checkpoint_on_current_rank = property(lambda self: True)

if __name__ == "__main__":
    from realformer_tools.launch import fixes_installed  # as realformer-fairseq runs fairseq-train

    with fixes_installed():
        sys.exit(train.cli_main())
