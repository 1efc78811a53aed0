"""Fixes to fairseq 0.12 itself: nothing here is RealFormer.

Each module fixes one fairseq bug, says in its docstring which one and how to tell
when fairseq no longer needs the fix, and has an idempotent ``install()``. They are all
installed from one place, :func:`install_all`, which ``import realformer_nmt`` (and so
``--user-dir realformer_nmt``) calls. They come in two groups:

* :data:`ALWAYS_ON`: fixes that make fairseq run at all on today's stack (torch >= 2.6,
  numpy 2, Python 3.11), or turn a crash or a traceback into one line. They act only where
  fairseq alone would fail, so a command that runs without them computes the same numbers
  with them (``tests/test_vanilla_unchanged.py``).
* :data:`DATA_FIXES`: fixes that change what fairseq trains on or scores. They are off
  unless asked for with the environment variable ``REALFORMER_NMT_DATA_FIXES=1``
  (:data:`SWITCH`), read when the plugin is imported, so that it works alike for
  ``fairseq-train``, ``fairseq-hydra-train``, ``fairseq-validate``, ``fairseq-generate``
  and a program that imports the package. With it unset (or ``0``), vanilla
  ``transformer``/``roberta`` runs with the plugin loaded compute exactly what fairseq
  computes alone; with it on, the log says so once. The comparison harnesses
  (``compare_backbones.py``, ``compare_mlm_backbones.py``) and the demo turn it on for
  every run and record it in their results.

| module                      | fairseq problem fixed                                        | group     |
| --------------------------- | ------------------------------------------------------------ | --------- |
| safe_checkpoint_loading     | torch >= 2.6 cannot load fairseq checkpoints; loading safely | always on |
| atomic_checkpoint_copies    | kill -9 during a checkpoint copy loses the run               | always on |
| interactive_utf8            | fairseq-interactive dies on invalid UTF-8                    | always on |
| batch_thread_exit           | finished runs abort (SIGABRT) at exit on Python 3.11         | always on |
| data_dir_checks             | tracebacks instead of one line for a bad data dir or .bin    | always on |
| cpu_bf16                    | --bf16 is TPU-only (bf16 on CPU); --fp16 on CPU dies late    | always on |
| numpy2_compat               | numpy 2 removals: eos token blocks, --num-batch-buckets      | always on |
| cpu_distributed             | CPU ranks: pytorch_ddp dies; --cpu --distributed-world-size  | always on |
| arch_choices                | a mistyped --arch prints 116 lines of usage                  | always on |
| train_preflight             | a bad --restore-file or .bin fails late, after --save-dir    | always on |
| keep_last_batch             | up to 7 sentences silently dropped per batching (#5036)      | data fix  |
| epoch_workers               | --num-workers >= 1: masks/pairs drawn once, not per epoch    | data fix  |
"""

import logging
import multiprocessing
import os

from realformer_nmt.errors import ConfigError

from . import (
    arch_choices,
    atomic_checkpoint_copies,
    batch_thread_exit,
    cpu_bf16,
    cpu_distributed,
    data_dir_checks,
    epoch_workers,
    interactive_utf8,
    keep_last_batch,
    numpy2_compat,
    safe_checkpoint_loading,
    train_preflight,
)

logger = logging.getLogger(__name__)

SWITCH = "REALFORMER_NMT_DATA_FIXES"

ALWAYS_ON = (
    safe_checkpoint_loading,
    atomic_checkpoint_copies,
    interactive_utf8,
    batch_thread_exit,
    data_dir_checks,
    cpu_bf16,
    numpy2_compat,
    cpu_distributed,
    arch_choices,
    train_preflight,
)
DATA_FIXES = (keep_last_batch, epoch_workers)
PATCHES = ALWAYS_ON + DATA_FIXES

_announced = False


def data_fixes_asked(environ=None) -> bool:
    """Whether ``REALFORMER_NMT_DATA_FIXES`` asks for the data fixes: ``1`` yes; unset, empty
    or ``0`` no; anything else is refused with one line."""
    value = (os.environ if environ is None else environ).get(SWITCH, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{SWITCH}={value!r}: set it to 1 (fairseq's data handling fixed) or 0 / leave it "
                          "unset (fairseq's own)")
    return value == "1"


def with_data_fixes(env):
    """A copy of the environment ``env`` for child fairseq commands, with the data fixes on."""
    return dict(env, **{SWITCH: "1"})


def install_all(data_fixes=None):
    """Install every always-on fix, and the data fixes when ``data_fixes`` (None: as
    :data:`SWITCH` says) asks for them, announcing that once (idempotent)."""
    global _announced
    for patch in ALWAYS_ON:
        patch.install()
    if not (data_fixes_asked() if data_fixes is None else data_fixes):
        return
    for patch in DATA_FIXES:
        patch.install()
    # once per run: not again in the ranks (or DataLoader workers) multiprocessing starts from
    # this process, nor in torchrun's ranks other than 0
    if not _announced and multiprocessing.parent_process() is None and os.environ.get("RANK", "0") in ("", "0"):
        _announced = True
        logger.info("%s=1: fairseq's data handling fixed (every sentence batched, masks redrawn each epoch with "
                    "DataLoader workers): numbers differ from fairseq alone (docs/reliability.md)", SWITCH)
