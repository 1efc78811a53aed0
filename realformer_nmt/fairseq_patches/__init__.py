"""Fixes to fairseq 0.12 itself: nothing here is RealFormer.

Each module fixes one fairseq bug, says in its docstring which one and how to tell
when fairseq no longer needs the fix, and has an idempotent ``install()``. They are all
installed from one place, :func:`install_all`, which ``import realformer_nmt`` (and so
``--user-dir realformer_nmt``) calls; vanilla ``transformer``/``roberta`` runs with the
plugin loaded get them too.

| module                      | fairseq problem fixed                                        |
| --------------------------- | ------------------------------------------------------------ |
| safe_checkpoint_loading     | torch >= 2.6 cannot load fairseq checkpoints; loading safely |
| atomic_checkpoint_copies    | kill -9 during a checkpoint copy loses the run               |
| keep_last_batch             | up to 7 sentences silently dropped per batching (#5036)      |
| interactive_utf8            | fairseq-interactive dies on invalid UTF-8                    |
| batch_thread_exit           | finished runs abort (SIGABRT) at exit on Python 3.11         |
| data_dir_checks             | tracebacks instead of one line for a bad data dir            |
| cpu_bf16                    | --bf16 is TPU-only (bf16 on CPU); --fp16 on CPU dies late    |
| numpy2_compat               | numpy 2 removals: eos token blocks, --num-batch-buckets      |
| epoch_workers               | --num-workers >= 1: masks/pairs drawn once, not per epoch    |
| cpu_distributed             | CPU ranks: pytorch_ddp dies; --cpu --distributed-world-size  |
"""

from . import (
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
)

PATCHES = (
    safe_checkpoint_loading,
    atomic_checkpoint_copies,
    keep_last_batch,
    interactive_utf8,
    batch_thread_exit,
    data_dir_checks,
    cpu_bf16,
    numpy2_compat,
    epoch_workers,
    cpu_distributed,
)


def install_all():
    """Install every fix (idempotent)."""
    for patch in PATCHES:
        patch.install()
