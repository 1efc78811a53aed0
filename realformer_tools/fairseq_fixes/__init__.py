"""Fixes to fairseq 0.12 itself: nothing here is RealFormer, and importing the plugin installs none of it.

Each module fixes one fairseq bug, says in its docstring which one and how to tell
when fairseq no longer needs the fix, and has an idempotent ``install()``. They are
opt-in (``realformer_nmt.fairseq_fixes_switch``): the project's own commands install them
(:func:`install_all`) and start every fairseq tool with the switch on; in a plain fairseq
run ``REALFORMER_NMT_FAIRSEQ_FIXES=1``, read when the plugin is imported, installs
:data:`ALWAYS_ON` (:func:`install_always_on`) and ``REALFORMER_NMT_DATA_FIXES=1``
(:data:`SWITCH`) :data:`DATA_FIXES` (:func:`install_data_fixes`). Two groups:

* :data:`ALWAYS_ON`: fixes that make fairseq run at all on today's stack (torch >= 2.6,
  numpy 2, Python 3.11), or turn a crash or a traceback into one line (with them, uncaught
  ``RealFormerError``s print one line: ``errors.install_excepthook``). They act only where
  fairseq alone fails, except one that changes a number fairseq computes alone:
  ``cpu_bf16`` makes ``fairseq-generate``/``-interactive``/``-eval-lm --bf16`` decode in
  bfloat16 (fairseq alone ignores ``--bf16`` there and decodes in float32). Otherwise a
  command that runs without them computes the same numbers with them
  (``tests/test_vanilla_unchanged.py``).
* :data:`DATA_FIXES`: fixes that change what fairseq trains on or scores; when on, the log
  says so once. The comparison harnesses (``compare_backbones.py``,
  ``compare_mlm_backbones.py``) and the demo turn them on for every run and record it in
  their results.

| module                      | fairseq problem fixed                                        | switch    |
| --------------------------- | ------------------------------------------------------------ | --------- |
| safe_checkpoint_loading     | torch >= 2.6 cannot load fairseq checkpoints; loading safely | FIXES     |
| atomic_checkpoint_copies    | kill -9 during a checkpoint copy loses the run               | FIXES     |
| interactive_utf8            | fairseq-interactive dies on invalid UTF-8                    | FIXES     |
| batch_thread_exit           | finished runs abort (SIGABRT) at exit on Python 3.11         | FIXES     |
| data_dir_checks             | tracebacks instead of one line for a bad data dir or .bin    | FIXES     |
| cpu_bf16                    | --bf16 is TPU-only (bf16 on CPU); --fp16 on CPU dies late    | FIXES     |
| numpy2_compat               | numpy 2 removals: eos token blocks, --num-batch-buckets      | FIXES     |
| cpu_distributed             | CPU ranks: pytorch_ddp dies; --cpu --distributed-world-size  | FIXES     |
| arch_choices                | a mistyped --arch prints 116 lines of usage                  | FIXES     |
| train_preflight             | a bad --restore-file or .bin fails late, after --save-dir    | FIXES     |
| keep_last_batch             | up to 7 sentences silently dropped per batching (#5036)      | DATA      |
| epoch_workers               | --num-workers >= 1: masked_lm's masks drawn once per run     | DATA      |
| resume_batches              | a run resumed in epoch >= 2 trains on other batches          | DATA      |

FIXES: ``REALFORMER_NMT_FAIRSEQ_FIXES=1``; DATA: ``REALFORMER_NMT_DATA_FIXES=1``.
"""

import logging
import multiprocessing
import os
import sys

from realformer_nmt import switches
from realformer_nmt.errors import install_excepthook

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
    resume_batches,
    safe_checkpoint_loading,
    train_preflight,
)

logger = logging.getLogger(__name__)

SWITCH = switches.DATA_FIXES_SWITCH
FIXES_SWITCH = switches.FIXES_SWITCH

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
DATA_FIXES = (keep_last_batch, epoch_workers, resume_batches)
PATCHES = ALWAYS_ON + DATA_FIXES

_announced = False


def data_fixes_asked(environ=None) -> bool:
    """Whether ``REALFORMER_NMT_DATA_FIXES`` asks for the data fixes: ``1`` yes; unset, empty
    or ``0`` no; anything else is refused with one line."""
    return switches.asked(SWITCH, environ)


def with_data_fixes(env):
    """A copy of the environment ``env`` for child fairseq commands, with the fixes to fairseq
    on, the data fixes included."""
    return switches.with_fixes(env, data_fixes=True)


def install_always_on():
    """Install every always-on fix and the one-line error hook (idempotent)."""
    for patch in ALWAYS_ON:
        patch.install()
    install_excepthook()


def install_data_fixes():
    """Install the data fixes, announcing that once (idempotent)."""
    global _announced
    for patch in DATA_FIXES:
        patch.install()
    # once per run: not again in the ranks (or DataLoader workers) multiprocessing starts from
    # this process, nor in torchrun's ranks other than 0
    # and only in a fairseq command (fairseq-train, -generate, ..., python -m fairseq_cli.*), whose
    # data it changes: a tool of ours that merely imports the plugin (prepare_data.py, export_hf.py)
    # keeps its output (a one-line error stays one line)
    if not _announced and multiprocessing.parent_process() is None and os.environ.get("RANK", "0") in ("", "0") \
            and _in_a_fairseq_command():
        _announced = True
        logger.info("%s=1: fairseq's data handling fixed (every sentence batched, masks redrawn each epoch with "
                    "DataLoader workers, a resumed run's batches as if never stopped): numbers differ from "
                    "fairseq alone (docs/reliability.md)", SWITCH)


def _in_a_fairseq_command(argv0=None) -> bool:
    program = os.path.normpath(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    return os.path.basename(program).startswith("fairseq") or "fairseq_cli" in program.split(os.sep)


def install_all(data_fixes=None):
    """What the project's own commands install: every always-on fix, and the data fixes when
    ``data_fixes`` (None: as :data:`SWITCH` says) asks for them (idempotent)."""
    install_always_on()
    if data_fixes_asked() if data_fixes is None else data_fixes:
        install_data_fixes()
