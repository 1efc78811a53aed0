"""Fixes to fairseq 0.12 itself: nothing here is RealFormer, and the plugin never imports it.

Each module fixes one fairseq bug, says in its docstring which one and how to tell when
fairseq no longer needs the fix, has an idempotent ``install()``, and lists what that
replaces (``REPLACES``, ``module:attribute`` as fairseq looks it up) and what it changes
(``CHANGES``, one line). They are installed by the launcher (:mod:`realformer_tools.launch`,
``realformer-fairseq <fairseq-command> ...``), in its own process and in the ranks it starts,
announced in one log line that names them (each one's own line at debug level, or at the
launcher's ``--verbose``); a program installs them for a block with
:func:`fixes_installed`, which restores every replaced attribute after it (the launcher's
``fixes_installed`` adds the ranks), and the project's own commands for good.
Groups:

* :data:`ALWAYS_ON`: fixes that make fairseq run at all on today's stack (torch >= 2.6,
  numpy 2, Python 3.11), or turn a crash or a traceback into one line. They act only where
  fairseq alone fails: a command that runs without them computes the same numbers with them
  (``tests/test_vanilla_unchanged.py``).
* :data:`EVERY_SENTENCE`: what the launcher adds for ``fairseq-generate``, ``-validate``,
  ``-interactive`` and ``-eval-lm``: every sentence of the test set scored.
* :data:`BF16_DECODING` (the launcher's ``--bf16-decoding``, earlier ``--cpu-bf16``):
  ``fairseq-generate``/``-interactive``/``-eval-lm --bf16`` decode in bfloat16 (fairseq alone
  decodes in float32).
* :data:`DATA_FIXES` (``--data-fixes``): fixes that change what fairseq trains on. The
  comparison harnesses and the demo turn them on for every run and record it.

| module                      | fairseq problem fixed                                        | group     |
| --------------------------- | ------------------------------------------------------------ | --------- |
| safe_checkpoint_loading     | torch >= 2.6 cannot load fairseq checkpoints; loading safely | always    |
| atomic_checkpoint_copies    | kill -9 during a checkpoint copy loses the run               | always    |
| interactive_utf8            | fairseq-interactive dies on invalid UTF-8                    | always    |
| batch_thread_exit           | finished runs abort (SIGABRT) at exit on Python 3.11         | always    |
| data_dir_checks             | tracebacks instead of one line for a bad data dir or .bin    | always    |
| numpy2_compat               | numpy 2 removals: eos token blocks, --num-batch-buckets      | always    |
| cpu_distributed             | CPU ranks: pytorch_ddp dies; --cpu --distributed-world-size  | always    |
| arch_choices                | a mistyped --arch prints 116 lines of usage                  | always    |
| train_preflight             | a bad --restore-file or .bin fails late, after --save-dir    | always    |
| bf16_without_tpu            | --bf16 means --tpu (dies on GPU and CPU); --fp16 on CPU late | always    |
| preprocess_checks           | unaligned or non-UTF-8 text binarized or dying mid-way       | always    |
| one_line_errors             | (ours) an uncaught RealFormerError prints one line           | always    |
| bf16_decoding               | --bf16 ignored at inference (decodes in float32)             | BF16_DECODING |
| keep_last_batch             | up to 7 sentences silently dropped per batching (#5036)      | DATA, and inference |
| epoch_workers               | --num-workers >= 1: masked_lm's masks drawn once per run     | DATA      |
| resume_batches              | a run resumed in epoch >= 2 trains on other batches          | DATA      |
"""

import atexit
import contextlib
import importlib
import logging

from . import (
    arch_choices,
    atomic_checkpoint_copies,
    batch_thread_exit,
    bf16_decoding,
    bf16_without_tpu,
    cpu_distributed,
    data_dir_checks,
    epoch_workers,
    interactive_utf8,
    keep_last_batch,
    numpy2_compat,
    one_line_errors,
    preprocess_checks,
    resume_batches,
    safe_checkpoint_loading,
    train_preflight,
)

logger = logging.getLogger(__name__)

ALWAYS_ON = (
    safe_checkpoint_loading,
    atomic_checkpoint_copies,
    interactive_utf8,
    batch_thread_exit,
    data_dir_checks,
    numpy2_compat,
    cpu_distributed,
    arch_choices,
    train_preflight,
    bf16_without_tpu,
    preprocess_checks,
    one_line_errors,
)
EVERY_SENTENCE = (keep_last_batch,)
BF16_DECODING = (bf16_decoding,)
DATA_FIXES = (keep_last_batch, epoch_workers, resume_batches)
PATCHES = ALWAYS_ON + BF16_DECODING + DATA_FIXES
DOCS = "docs/reliability.md#fixes-to-fairseq-itself"  # what each fix changes, for the launcher's line

_MISSING = object()


def chosen(data_fixes=False, bf16_decoding=False, every_sentence=False, cpu_bf16=False):
    """The fix modules of the asked groups, in install order, each once (``cpu_bf16``: the
    earlier name of ``bf16_decoding``)."""
    fixes = ALWAYS_ON + (EVERY_SENTENCE if every_sentence else ()) \
        + (BF16_DECODING if bf16_decoding or cpu_bf16 else ()) + (DATA_FIXES if data_fixes else ())
    return tuple(dict.fromkeys(fixes))


def short_name(fix):
    return fix.__name__.rsplit(".", 1)[1]


def _owner(spec):
    """``"fairseq.trainer:Trainer.load_checkpoint"`` -> (Trainer, "load_checkpoint")."""
    module_name, path = spec.split(":")
    owner = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def _current(spec):
    owner, name = _owner(spec)
    return owner, name, vars(owner).get(name, _MISSING)


def _restore(saved):
    for owner, name, value in reversed(saved):
        if value is _MISSING:
            if name in vars(owner):
                delattr(owner, name)
        else:
            setattr(owner, name, value)


def _install(fix, saved, hooks):
    """Install one fix, noting what it replaced in ``saved`` and the exit hook it registered in
    ``hooks``; whether it changed anything (False where it was in place already)."""
    before = [_current(spec) for spec in fix.REPLACES]
    exit_hooks = atexit._ncallbacks()
    fix.install()
    if atexit._ncallbacks() > exit_hooks and getattr(fix, "EXIT_HOOK", None):
        hooks.append(getattr(fix, fix.EXIT_HOOK))
    saved.extend(before)
    return any(_current(spec)[2] is not value for spec, (_, _, value) in zip(fix.REPLACES, before))


def announce(entries, verbose=False):
    """Say which fixes were installed: ``entries`` = ``[(name, what it changes, what it
    replaces)]``. One INFO line naming them all (``fairseq fixes: a, b, ... (docs/...)``),
    then one line per fix (``fairseq fix NAME: CHANGES [replaces ...]``) at DEBUG, or at
    INFO with ``verbose``."""
    if not entries:
        return
    logger.info("fairseq fixes: %s (what each changes: %s; every line: realformer-fairseq --verbose)",
                ", ".join(name for name, _, _ in entries), DOCS)
    for name, changes, replaces in entries:
        logger.log(logging.INFO if verbose else logging.DEBUG, "fairseq fix %s: %s [replaces %s]", name, changes,
                   ", ".join(replaces))


@contextlib.contextmanager
def fixes_installed(data_fixes=False, bf16_decoding=False, every_sentence=False, quiet=False, verbose=False,
                    cpu_bf16=False):
    """Within the block the fixes of the asked groups are installed (the always-on ones, and
    :data:`EVERY_SENTENCE` / :data:`BF16_DECODING` / :data:`DATA_FIXES` when asked; ``cpu_bf16``
    is ``bf16_decoding``'s earlier name), those that were not in place already announced
    (:func:`announce`, unless ``quiet``). The block gets the list of ``(name, changes,
    replaces)`` of those. On leaving it, every attribute they replaced and every exit hook
    they registered is as it was."""
    saved, hooks, entries = [], [], []
    try:
        for fix in chosen(data_fixes, bf16_decoding, every_sentence, cpu_bf16):
            if _install(fix, saved, hooks):
                entries.append((short_name(fix), fix.CHANGES, fix.REPLACES))
        if not quiet:
            announce(entries, verbose)
        yield entries
    finally:
        _restore(saved)
        for hook in hooks:
            atexit.unregister(hook)


def install_for_good(data_fixes=False, bf16_decoding=False, every_sentence=False, cpu_bf16=False):
    """Install the fixes of the asked groups for the rest of the process (a rank the launcher's
    process started, a command of the tools), quietly."""
    for fix in chosen(data_fixes, bf16_decoding, every_sentence, cpu_bf16):
        fix.install()
