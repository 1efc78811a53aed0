"""fairseq-train creates ``--save-dir`` first and looks at its inputs later: check them
before the folder exists.

Bug (fairseq 0.12): ``fairseq_cli.train.main`` calls ``verify_checkpoint_directory``
(which creates ``--save-dir``) before it sets up the task, loads the data or reads
``--restore-file``. An input that cannot work (``--restore-file notes.txt``, a truncated
``train.*.bin``, a data dir without dictionaries) then fails after about 100 lines of
start-up log, and leaves an empty ``checkpoints/...`` folder behind.

Fix: ``fairseq_cli.train.main`` is wrapped (fairseq-train looks it up when it starts its
ranks, after ``--user-dir`` loaded the plugin) so that, on the master rank, before
fairseq's own code runs:

* a translation task's data dir is checked as ``data_dir_checks`` checks it;
* every ``.bin`` of the train and valid subsets is checked against its ``.idx``
  (``data_dir_checks.check_split_binaries``);
* an explicit ``--restore-file`` (not the default ``checkpoint_last.pt``) that exists
  must be a PyTorch checkpoint (a zip archive, or a legacy pickle): anything else is one
  line naming the flag. A ``--restore-file`` that does not exist is left to fairseq,
  which starts from scratch as it always has.

Each failure is one line naming the flag or the file, and nothing is created. Valid
inputs pass unchanged. (``fairseq-hydra-train`` binds ``main`` before the plugin loads;
there the same data checks still run when the data is opened.)

When it is no longer needed: ``fairseq-train DATA --restore-file notes.txt --save-dir x``
fails without creating ``x`` with the patch uninstalled.
"""

import argparse
import functools
import os
import zipfile

import fairseq_cli.train
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

from realformer_nmt.errors import CheckpointFileError

from . import data_dir_checks

_FIXED = "__realformer_fixed__"
_PICKLE_PROTOCOL = b"\x80"  # torch.save's legacy (non-zip) format starts with a pickle


def check_restore_file(path):
    """Raise CheckpointFileError when an existing ``--restore-file`` is no PyTorch checkpoint."""
    if not path or path == "checkpoint_last.pt" or "://" in path or not os.path.exists(path):
        return
    if os.path.isdir(path):
        raise CheckpointFileError(f"--restore-file {path} is a folder, not a checkpoint file")
    if os.path.getsize(path) == 0:
        raise CheckpointFileError(f"--restore-file {path} is empty, not a checkpoint")
    with open(path, "rb") as f:
        start = f.read(1)
    if not (zipfile.is_zipfile(path) or start == _PICKLE_PROTOCOL):
        raise CheckpointFileError(f"--restore-file {path} is not a PyTorch checkpoint (not a file torch.save "
                                  "wrote): give a checkpoint_*.pt")


def preflight(cfg):
    """The checks above, on a training config (before --save-dir is created)."""
    task = cfg.task
    if getattr(task, "_name", None) == "translation":
        data_dir_checks.check_translation_data(task)
    if getattr(task, "data", None):
        splits = [cfg.dataset.train_subset] + str(cfg.dataset.valid_subset).split(",")
        data_dir_checks.check_split_binaries(task.data, [s for s in splits if s])
    check_restore_file(cfg.checkpoint.restore_file)


def checked_main(main):
    @functools.wraps(main)
    def wrapper(cfg, *args, **kwargs):
        if isinstance(cfg, argparse.Namespace):  # fairseq's main takes either
            cfg = convert_namespace_to_omegaconf(cfg)
        if distributed_utils.is_master(cfg.distributed_training):
            preflight(cfg)
        return main(cfg, *args, **kwargs)

    setattr(wrapper, _FIXED, True)
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq_cli.train:main",
)
CHANGES = ("fairseq-train checks its data and --restore-file before it creates --save-dir")


def install():
    if not getattr(fairseq_cli.train.main, _FIXED, False):
        fairseq_cli.train.main = checked_main(fairseq_cli.train.main)


def uninstall():
    """Restore fairseq's own ``main`` (tests use this to see what fairseq does alone)."""
    if getattr(fairseq_cli.train.main, _FIXED, False):
        fairseq_cli.train.main = fairseq_cli.train.main.__wrapped__
