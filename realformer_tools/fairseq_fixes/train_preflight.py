"""fairseq-train creates ``--save-dir`` first and looks at its inputs later, in each rank it
starts: check them at once, in the process the user started, before the folder exists.
fairseq-generate and fairseq-validate likewise check their subset before they log anything.

Bugs (fairseq 0.12):

1. ``fairseq_cli.train.main`` calls ``verify_checkpoint_directory`` (which creates
   ``--save-dir``) before it sets up the task, loads the data or reads ``--restore-file``.
   An input that cannot work (``--restore-file notes.txt``, a truncated ``train.*.bin``, a
   data dir without dictionaries) then fails after about 100 lines of start-up log, and
   leaves an empty ``checkpoints/...`` folder behind. With several ranks
   (``--distributed-world-size N``, GPUs or ``--cpu``) ``main`` runs only in the ranks, so
   a check there fails in each rank: log lines, then a 41-line ``ProcessRaisedException``.
2. A split whose source and target were binarized from files of different line counts
   (plain fairseq-preprocess accepts them) stops fairseq-train, fairseq-generate and
   fairseq-validate when the split is loaded, after 20 to 70 lines of log, on
   ``AssertionError: Source and target must contain the same number of examples`` naming no
   file (fairseq-train has created ``--save-dir`` by then).

Fix: the checks below run right after the command line becomes a config:
``convert_namespace_to_omegaconf`` as ``fairseq_cli.train``, ``.generate`` and
``.validate`` look it up (fairseq-train's ``cli_main`` calls it before it starts any rank;
fairseq-generate's and fairseq-validate's ``main`` first thing) is wrapped; and
``fairseq_cli.train.main`` is wrapped to run the training checks on the master rank (for
programs that call ``main`` with a config of their own). fairseq-train:

* a translation task's data dir is checked as ``data_dir_checks`` checks it;
* every ``.bin`` of the train and valid subsets is checked against its ``.idx``
  (``data_dir_checks.check_split_binaries``);
* a translation task's train split (every data path, every shard ``train1`` ...) and valid
  subsets have as many source examples as target ones (their ``.idx``, read by fairseq's
  own index readers: ``data_dir_checks.check_pair_counts``);
* an explicit ``--restore-file`` (not the default ``checkpoint_last.pt``) that exists
  must be a PyTorch checkpoint (a zip archive, or a legacy pickle): anything else is one
  line naming the flag. A ``--restore-file`` that does not exist is left to fairseq,
  which starts from scratch as it always has.

fairseq-generate: the same data dir, binaries and pair counts for ``--gen-subset`` (its task
is the command line's); fairseq-validate: binaries and pair counts for each
``--valid-subset`` where the data dir has a language pair (its task is the checkpoint's).

Each failure is one line naming the flag or the files, printed before anything else, and
nothing is created. Valid inputs pass unchanged. (``fairseq-hydra-train`` binds ``main``
before the plugin loads; there the data dir and ``.bin`` checks still run when the data is
opened.)

When it is no longer needed: ``fairseq-train DATA --restore-file notes.txt --save-dir x``
fails without creating ``x`` with the patch uninstalled, and so does ``fairseq-train
nodata --cpu --distributed-world-size 2 --save-dir x`` in one line; fairseq-generate on a
split of 51 source and 50 target examples names the files.
"""

import argparse
import functools
import os
import zipfile

import fairseq_cli.generate
import fairseq_cli.train
import fairseq_cli.validate
from fairseq import tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks.translation import TranslationTask

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


def _reads_pairs(task) -> bool:
    """The task reads language pairs as fairseq's translation task does (it or a subclass)."""
    cls = tasks.TASK_REGISTRY.get(getattr(task, "_name", None))
    return isinstance(cls, type) and issubclass(cls, TranslationTask) and bool(getattr(task, "data", None))


def _subsets(value):
    return [s for s in str(value or "").split(",") if s]


def preflight(cfg):
    """The training checks above, on a training config (before --save-dir is created)."""
    task = cfg.task
    if getattr(task, "_name", None) == "translation":
        data_dir_checks.check_translation_data(task)
    valid = [] if cfg.dataset.disable_validation else _subsets(cfg.dataset.valid_subset)
    if getattr(task, "data", None):
        data_dir_checks.check_split_binaries(task.data, [cfg.dataset.train_subset, *valid])
    if _reads_pairs(task):
        data_dir_checks.check_pair_counts(task, cfg.dataset.train_subset, combine=True)
        for subset in valid:
            data_dir_checks.check_pair_counts(task, subset)
    check_restore_file(cfg.checkpoint.restore_file)


def generate_preflight(cfg):
    """fairseq-generate's checks: its --gen-subset (its task is the command line's)."""
    task = cfg.task
    if getattr(task, "_name", None) == "translation":
        data_dir_checks.check_translation_data(task)
    _check_subsets(task, [cfg.dataset.gen_subset])


def validate_preflight(cfg):
    """fairseq-validate's checks: each --valid-subset (its task is the checkpoint's: only
    what the data dir's own files say)."""
    _check_subsets(cfg.task, _subsets(cfg.dataset.valid_subset))


def _check_subsets(task, subsets):
    if getattr(task, "data", None) and subsets:
        data_dir_checks.check_split_binaries(task.data, subsets)
    if _reads_pairs(task):
        for subset in subsets:
            data_dir_checks.check_pair_counts(task, subset)


def checked_config(convert, check):
    """``convert_namespace_to_omegaconf`` as one command looks it up: the config it makes is
    checked (``check``) before the command goes on."""
    @functools.wraps(convert)
    def wrapper(args, *more, **kwargs):
        cfg = convert(args, *more, **kwargs)
        check(cfg)
        return cfg

    setattr(wrapper, _FIXED, True)
    return wrapper


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
_CONFIGS = ((fairseq_cli.train, preflight), (fairseq_cli.generate, generate_preflight),
            (fairseq_cli.validate, validate_preflight))
REPLACES = (
    "fairseq_cli.train:main",
    "fairseq_cli.train:convert_namespace_to_omegaconf",
    "fairseq_cli.generate:convert_namespace_to_omegaconf",
    "fairseq_cli.validate:convert_namespace_to_omegaconf",
)
CHANGES = ("fairseq-train checks its data and --restore-file before it creates --save-dir or starts a rank; "
           "fairseq-train, -generate and -validate refuse a split whose source and target counts differ")


def install():
    if not getattr(fairseq_cli.train.main, _FIXED, False):
        fairseq_cli.train.main = checked_main(fairseq_cli.train.main)
    for module, check in _CONFIGS:
        if not getattr(module.convert_namespace_to_omegaconf, _FIXED, False):
            module.convert_namespace_to_omegaconf = checked_config(module.convert_namespace_to_omegaconf, check)


def uninstall():
    """Restore fairseq's own functions (tests use this to see what fairseq does alone)."""
    if getattr(fairseq_cli.train.main, _FIXED, False):
        fairseq_cli.train.main = fairseq_cli.train.main.__wrapped__
    for module, _ in _CONFIGS:
        if getattr(module.convert_namespace_to_omegaconf, _FIXED, False):
            module.convert_namespace_to_omegaconf = module.convert_namespace_to_omegaconf.__wrapped__
