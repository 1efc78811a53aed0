"""``realformer-fairseq``: run a fairseq 0.12 command with the fixes to fairseq 0.12 installed.

    realformer-fairseq [--data-fixes] [--bf16-decoding] [--verbose] <fairseq-command> [its own arguments ...]
    python -m realformer_tools.launch [...]   (the same)

e.g. ``realformer-fairseq fairseq-generate data-bin --user-dir realformer_nmt --path ck.pt``.
The fixes (:mod:`realformer_tools.fairseq_fixes`: checkpoints that load on torch >= 2.6,
atomic checkpoint copies, one-line errors, CPU ranks, ``--bf16`` without a TPU, ...) are
installed in this process and in every rank it starts, and then the fairseq command's own
``cli_main`` runs, exactly as its console script would. They are announced in one log line
naming them, logged just before the command's first log line (so a refused input is the
only line printed; each fix's own line at debug level, or with ``--verbose``).
``fairseq-generate``, ``-validate``, ``-interactive`` and ``-eval-lm`` always score every
sentence (fairseq 0.12 alone drops the last ``len % 8``). ``--data-fixes`` (or
``REALFORMER_NMT_DATA_FIXES=1``) adds the fixes that change what training sees;
``--bf16-decoding`` (or ``REALFORMER_NMT_BF16_DECODING=1``; ``--cpu-bf16`` and
``REALFORMER_NMT_CPU_BF16``, its earlier names, are the same) makes
``fairseq-generate``/``-interactive``/``-eval-lm --bf16`` decode in bfloat16. Only this
launcher reads those variables; importing the plugin (``--user-dir realformer_nmt``)
installs nothing. Hydra's deprecation warnings about fairseq's configs are not printed.

In a program: :func:`main` (``main(["fairseq-train", ...])``, returns the exit status) or
:func:`fixes_installed` around in-process fairseq calls.
"""

import argparse
import contextlib
import functools
import importlib
import importlib.metadata
import logging
import os
import sys
import warnings

from . import deferred_imports

# Nothing of fairseq (nor the plugin, which imports it) is imported before main() has set up
# fairseq's log format: fairseq_cli's modules set it before their own imports, and one of
# fairseq's modules sets another one on import.

PROGRAM = "realformer-fairseq"
DATA_FIXES_ENV = "REALFORMER_NMT_DATA_FIXES"
BF16_DECODING_ENV = "REALFORMER_NMT_BF16_DECODING"
CPU_BF16_ENV = "REALFORMER_NMT_CPU_BF16"  # the earlier name of BF16_DECODING_ENV
# option -> (group, its variables)
OPTIONS = {"--data-fixes": ("data_fixes", (DATA_FIXES_ENV,)),
           "--bf16-decoding": ("bf16_decoding", (BF16_DECODING_ENV, CPU_BF16_ENV)),
           "--cpu-bf16": ("bf16_decoding", ()),  # the earlier name of --bf16-decoding
           "--verbose": ("verbose", ())}
LOG_FORMAT, LOG_DATES = "%(asctime)s | %(levelname)s | %(name)s | %(message)s", "%Y-%m-%d %H:%M:%S"  # fairseq's CLIs'
SPAWN = "torch.multiprocessing:spawn"
# the commands that score a test set: every sentence of it, always
SCORING = ("fairseq-generate", "fairseq-validate", "fairseq-interactive", "fairseq-eval-lm")
# Hydra 1.3's deprecation warnings about fairseq 0.12's own configs (the user can change none of
# them): not printed (the same filters as pytest.ini's)
HYDRA_NOISE = (
    r"(?s).*'config' is validated against ConfigStore schema with the same name",
    r"(?s).*The strict flag in the compose API is deprecated",
    r"(?s).*The version_base parameter is not specified",
    r"hydra.experimental.(initialize|compose)\(\) is no longer experimental",
    r"In '.*'. Usage of deprecated keyword in package header",
)

USAGE = f"""usage: {PROGRAM} [--data-fixes] [--bf16-decoding] [--verbose] FAIRSEQ_COMMAND [ARGS ...]

Runs a fairseq 0.12 command (fairseq-train, fairseq-generate, ...) with the fixes to fairseq
0.12 installed, named in one log line (what each changes: docs/reliability.md).
fairseq-generate, -validate, -interactive and -eval-lm score every sentence; --bf16 trains in
bfloat16 on a GPU or CPU without torch_xla.

options (before the fairseq command; its own flags follow it):
  --data-fixes     also the fixes that change what training sees: every sentence batched, masks
                   redrawn each epoch with DataLoader workers, a resumed run's batches as if never
                   stopped (or {DATA_FIXES_ENV}=1)
  --bf16-decoding  fairseq-generate/-interactive/-eval-lm --bf16 decode in bfloat16 (fairseq
                   alone decodes in float32) (or {BF16_DECODING_ENV}=1; --cpu-bf16 and
                   {CPU_BF16_ENV}=1 are its earlier names)
  --verbose        one log line per fix, naming what it replaces (also logged at debug level:
                   LOGLEVEL=DEBUG)
  -h, --help       this help (FAIRSEQ_COMMAND --help: the command's own)
"""


class UsageError(ValueError):
    """A launcher option or switch that cannot be used (printed as one line, exit status 2)."""


@contextlib.contextmanager
def fixes_installed(data_fixes=False, bf16_decoding=False, every_sentence=False, ranks=True, quiet=False,
                    verbose=False, cpu_bf16=False):
    """The fixes to fairseq 0.12 installed for a ``with`` block, announced in one log line
    (unless ``quiet``; each fix's own line at debug level, or at INFO with ``verbose``) and
    each replaced attribute restored after it (:func:`realformer_tools.fairseq_fixes.fixes_installed`;
    ``cpu_bf16`` is ``bf16_decoding``'s earlier name); with ``ranks``, every rank
    ``torch.multiprocessing.spawn`` starts meanwhile (fairseq's GPU ranks, the CPU ranks of
    ``--cpu --distributed-world-size N``: fresh interpreters) installs the same fixes first.
    The block gets the ``(name, changes, replaces)`` of what was installed."""
    from .fairseq_fixes import announce
    from .fairseq_fixes import fixes_installed as installed

    bf16_decoding = bf16_decoding or cpu_bf16
    with installed(data_fixes=data_fixes, bf16_decoding=bf16_decoding, every_sentence=every_sentence,
                   quiet=True) as entries:
        import torch.multiprocessing

        spawn = torch.multiprocessing.spawn
        if ranks and not getattr(spawn, "__realformer_fixed__", False):
            torch.multiprocessing.spawn = _spawning_with_fixes(spawn, (data_fixes, bf16_decoding, every_sentence))
            entries.append(("ranks", "every rank started by torch.multiprocessing.spawn installs these fixes first",
                            (SPAWN,)))
        if not quiet:
            announce(entries, verbose)
        try:
            yield entries
        finally:
            torch.multiprocessing.spawn = spawn


def _spawning_with_fixes(spawn, choice):
    @functools.wraps(spawn)
    def wrapper(fn, *args, **kwargs):
        return spawn(functools.partial(_module().rank_with_fixes, choice, fn), *args, **kwargs)

    wrapper.__realformer_fixed__ = True
    return wrapper


def _module():
    """This module under its own name (run as ``python -m``, this file is also ``__main__``,
    whose functions a spawned rank could not find by that name)."""
    return importlib.import_module("realformer_tools.launch")


def fairseq_commands():
    """``{"fairseq-train": entry point, ...}``: fairseq's console scripts."""
    found = {}
    for entry in importlib.metadata.entry_points(group="console_scripts"):
        if entry.value.startswith("fairseq_cli."):
            found.setdefault(entry.name, entry)
    return found


def switch_asked(name, environ=None) -> bool:
    """Whether the variable ``name`` is ``1``; unset, empty or ``0`` is no; anything else is
    refused with one line."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if value not in ("", "0", "1"):
        raise UsageError(f"{name}={value!r}: set it to 1 or 0 (or leave it unset)")
    return value == "1"


def parse(argv, environ=None):
    """``(groups, command, its arguments)``; ``groups`` = ``{"data_fixes": bool,
    "bf16_decoding": bool, "verbose": bool}``."""
    argv = list(argv)
    groups = {group: False for group, _ in OPTIONS.values()}
    for group, names in OPTIONS.values():
        groups[group] = groups[group] or any([switch_asked(name, environ) for name in names])
    while argv and argv[0].startswith("-"):
        word = argv.pop(0)
        if word in ("-h", "--help"):
            raise SystemExit(print(USAGE, end=""))
        if word not in OPTIONS:
            raise UsageError(f"{word}: not an option of {PROGRAM} (--data-fixes, --bf16-decoding, --verbose; the "
                             "fairseq command's own flags go after its name)")
        groups[OPTIONS[word][0]] = True
    if not argv:
        raise UsageError(f"no fairseq command given: {PROGRAM} [--data-fixes] [--bf16-decoding] fairseq-train ...")
    command = os.path.basename(argv[0])  # a path to the console script is taken too
    commands = fairseq_commands()
    if command not in commands:
        raise UsageError(f"{argv[0]!r} is not a fairseq command (one of {', '.join(sorted(commands))})")
    return groups, command, argv[1:]


def import_user_dir(args):
    """Import the plugin named by ``--user-dir`` in ``args`` as fairseq will (before the fixes,
    whose errors are the plugin's: one copy of it in the process, the one the command names)."""
    for i, word in enumerate(args):
        value = args[i + 1] if word == "--user-dir" and i + 1 < len(args) else \
            word.split("=", 1)[1] if word.startswith("--user-dir=") else None
        if value:
            from fairseq.utils import import_user_module

            import_user_module(argparse.Namespace(user_dir=value))


def rank_with_fixes(choice, fn, index, *args):
    """A rank that ``torch.multiprocessing.spawn`` started from a launched command (pickled by
    name: this module imports nothing of fairseq): the command's ``--user-dir`` imported, the
    fixes installed, then ``fn(index, *args)``. A function among ``args`` that a fix has
    wrapped since it was unpickled (fairseq's ``main``, pickled by name) is replaced by its
    wrapped form."""
    for arg in args:
        user_dir = getattr(getattr(arg, "common", None), "user_dir", None)
        if user_dir:
            import_user_dir(["--user-dir", user_dir])
    logging.basicConfig(format=LOG_FORMAT, datefmt=LOG_DATES, level=os.environ.get("LOGLEVEL", "INFO").upper(),
                        stream=sys.stdout, force=True)  # fairseq's, as in the launcher's process
    from .fairseq_fixes import install_for_good

    install_for_good(*choice)
    fn(index, *(_as_now(arg) for arg in args))


def _as_now(obj):
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    qualname = getattr(obj, "__qualname__", None)
    if module is None or not callable(obj) or not qualname or "<" in qualname:
        return obj
    now = module
    for part in qualname.split("."):
        now = getattr(now, part, None)
    return now if getattr(now, "__wrapped__", None) is obj else obj


class _AnnounceBeforeFirstLine(logging.Filter):
    """On the root logger's handlers while a command runs: the fixes' announcement is logged
    just before the first record the command logs, so an input refused before it logs anything
    (printed as one line on stderr) is all the user sees. A fix's note on the command line (a
    record with ``COMMAND_LINE_NOTE`` set: bf16_without_tpu's line, logged while fairseq parses
    it, before the checks that may refuse the input) is held until then too, and follows the
    announcement."""

    def __init__(self, entries, verbose):
        super().__init__()
        self.entries, self.verbose, self.done, self.held = entries, verbose, False, []

    def filter(self, record):
        if self.done:
            return True
        from .fairseq_fixes import announce
        from .fairseq_fixes.bf16_without_tpu import COMMAND_LINE_NOTE

        if record is not None and getattr(record, COMMAND_LINE_NOTE, False):
            if all(held is not record for held in self.held):  # (the same record, at each handler)
                self.held.append(record)
            return False
        self.done = True
        announce(self.entries, self.verbose)
        for held in self.held:
            logging.getLogger(held.name).handle(held)
        return True


@contextlib.contextmanager
def _announced_before_first_line(entries, verbose):
    """The announcement before the command's first log line, or at its end where it logged
    none through these handlers (``fairseq-hydra-train``: Hydra sets up logging anew) and
    ended without an error."""
    root = logging.getLogger()
    handlers, announcer = list(root.handlers), _AnnounceBeforeFirstLine(entries, verbose)
    for handler in handlers:
        handler.addFilter(announcer)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(announcer)
    if not announcer.done:
        announcer.filter(None)


def main(argv=None) -> int:
    """Run ``argv`` (default: this process's command line) as the launcher; the exit status."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    try:
        groups, command, args = parse(argv)
    except UsageError as exc:
        print(f"{PROGRAM}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit:  # --help
        return 0
    verbose = groups.pop("verbose")
    # fairseq's CLIs' log format (a no-op where logging is set up already, as in a program)
    logging.basicConfig(format=LOG_FORMAT, datefmt=LOG_DATES, level=os.environ.get("LOGLEVEL", "INFO").upper(),
                        stream=sys.stdout)
    with deferred_imports.deferred():  # fairseq starts without scikit-learn and scipy.stats
        cli_main = fairseq_commands()[command].load()
    import_user_dir(args)
    from realformer_nmt.errors import FlagValueError, RealFormerError

    from .fairseq_fixes import batch_thread_exit
    saved_argv = sys.argv
    sys.argv = [command, *args]
    try:
        with warnings.catch_warnings(), \
                fixes_installed(every_sentence=command in SCORING, quiet=True, **groups) as entries, \
                _announced_before_first_line(entries, verbose):
            for pattern in HYDRA_NOISE:
                warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
            try:
                cli_main()
            finally:  # what batch_thread_exit's exit hook would do at exit, which the block unregisters:
                # fairseq's batch threads end now, not in the middle of a torch op at exit (SIGABRT)
                batch_thread_exit.stop_background_consumers()
    except FlagValueError as exc:  # a flag's value argparse would refuse: its usage error status
        print(f"realformer_nmt: error: {exc}", file=sys.stderr)
        return 2
    except RealFormerError as exc:
        print(f"realformer_nmt: error: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
    return 0


def command():
    """The console command ``realformer-fairseq``."""
    sys.exit(main())


if __name__ == "__main__":
    command()
