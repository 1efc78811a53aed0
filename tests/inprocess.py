"""Running fairseq's command-line tools (and this project's) inside the test process.

A fairseq tool started as a subprocess pays about 4 s for importing fairseq and torch before it
does anything; most tests start one only to train a tiny model, translate with it or see how it
fails. :func:`run_in_process` runs the same console command's function (``fairseq-train`` ->
``fairseq_cli.train:cli_main``, found through the installed entry points, as the console script
finds it) with that argv, and hands back what a subprocess would: a
``subprocess.CompletedProcess`` with its exit status, stdout and stderr.

What a subprocess gives for free is made here, and undone after each call:

* ``sys.argv`` (``[<venv>/bin/<tool>, *args]``), ``sys.stdin`` (``input``), ``sys.stdout`` and
  ``sys.stderr`` (captured), the environment (``env`` added, then restored whole), the working
  directory (``cwd``);
* logging as fairseq's tools set it up on import (the root logger at INFO, one handler writing
  fairseq's format to stdout); every logger's level and handlers come back afterwards;
* the random generators (torch, numpy, random), torch's thread count (one, as
  ``conftest.cli_env`` gives the subprocesses) and default dtype, ``sys.excepthook``;
* every attribute a fix to fairseq replaces (each fix's ``REPLACES``): this project's own
  commands install the fixes for good, as a process of their own may, and here they go again;
* fairseq's process-wide state: ``checkpoint_utils.save_checkpoint.best`` (the best score of
  the previous run) goes before and after each call. A module a ``--user-dir`` imports stays
  imported with what it registered, as in fairseq's own in-process tests: fairseq keeps its
  registries' class names where nothing can remove them, so the next call finds it imported;
* the daemonic processes the call started and left running end as at a process's exit
  (``multiprocessing``'s exit function: terminated, then joined): fairseq leaves its last
  batch iterator's DataLoader workers up, and each, collected later in this process, would
  cost torch's 5-second worker shutdown wait;
* an exception that leaves the tool is handed to ``sys.excepthook`` with stderr captured (what
  Python does at a process's top level: with the one-line error hook, one line) and the exit
  status is 1; ``SystemExit`` gives its code.

The fixes to fairseq: with ``fixes=True`` (the default, as ``cli_helpers.run`` starts a tool)
the call runs inside ``realformer_tools.launch.fixes_installed(data_fixes=..., bf16_decoding=...)``
when the launcher exists, and is the launcher's own ``main`` for a fairseq command (the same
code as ``realformer-fairseq <command> ...``). Before the launcher existed the fixes were
installed in the test process by ``tests/conftest.py``'s switches, and the call uses those.

Isolation is the point of some tests (a crash, a signal, ``kill -9``, several ranks, the console
scripts as a user runs them, the plugin imported into a clean process): those keep subprocesses.
A call that trains is refused in a test not marked ``slow``, as ``conftest`` refuses a training
subprocess.
"""

import contextlib
import importlib
import importlib.util
import io
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import warnings
from importlib.metadata import entry_points

import conftest
import numpy as np
import pytest
import torch

FAIRSEQ_LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli/*.py
FAIRSEQ_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def console_function(tool):
    """The function the console script ``tool`` calls (``module:function`` of its entry point)."""
    matches = [ep for ep in entry_points(group="console_scripts") if ep.name == tool]
    if not matches:
        raise LookupError(f"no console command {tool!r} installed in this environment")
    return matches[0].load()


def checkout_launcher():
    """``realformer_tools.launch`` of the checkout under test, or None where it has none."""
    spec = importlib.util.find_spec("realformer_tools.launch")
    if spec is None or not str(spec.origin).startswith(str(conftest.REPO)):
        return None
    return importlib.import_module("realformer_tools.launch")


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): Python prints it, status 1
    return 1


class _ProcessState:
    """Everything a tool run may change in this process, saved and put back."""

    def __init__(self):
        self.argv, self.stdin, self.excepthook = list(sys.argv), sys.stdin, sys.excepthook
        self.environ, self.cwd = dict(os.environ), os.getcwd()
        self.torch_rng, self.np_rng, self.py_rng = torch.get_rng_state(), np.random.get_state(), random.getstate()
        self.threads, self.dtype = torch.get_num_threads(), torch.get_default_dtype()
        root = logging.getLogger()
        self.root_handlers, self.root_level = list(root.handlers), root.level
        self.loggers = {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
                        for name, lg in logging.Logger.manager.loggerDict.items()
                        if isinstance(lg, logging.Logger)}
        self.logging_disable = logging.root.manager.disable
        self.patched = _patched_attributes()
        self.children = set(multiprocessing.active_children())

    def restore(self, added_handlers=()):
        _end_daemonic_children(self.children)
        sys.argv[:], sys.stdin, sys.excepthook = self.argv, self.stdin, self.excepthook
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        torch.set_rng_state(self.torch_rng)
        np.random.set_state(self.np_rng)
        random.setstate(self.py_rng)
        torch.set_num_threads(self.threads)
        torch.set_default_dtype(self.dtype)
        root = logging.getLogger()
        for handler in root.handlers:
            if handler not in self.root_handlers:
                handler.close()
        root.handlers[:] = self.root_handlers
        root.setLevel(self.root_level)
        for name, lg in logging.Logger.manager.loggerDict.items():
            if not isinstance(lg, logging.Logger):
                continue
            level, handlers, propagate, disabled = self.loggers.get(name, (logging.NOTSET, [], True, False))
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.setLevel(level)
            lg.handlers[:] = handlers
            lg.propagate, lg.disabled = propagate, disabled
        logging.disable(self.logging_disable)
        for (owner, name), value in self.patched.items():
            if value is _MISSING:
                if name in vars(owner):
                    delattr(owner, name)
            elif vars(owner).get(name, _MISSING) is not value:
                setattr(owner, name, value)
        _reset_fairseq_globals()


_MISSING = object()


def _end_daemonic_children(before):
    """What a process's exit does to its daemonic children (``multiprocessing.util._exit_function``),
    for those started since ``before``: terminated, then joined."""
    started = [p for p in multiprocessing.active_children() if p not in before and p.daemon]
    for p in started:
        p.terminate()
    for p in started:
        p.join()


def _patched_attributes():
    """``{(owner, name): value}`` of every attribute a fix to fairseq may replace (each fix's
    ``REPLACES``, ``"module:Class.attr"``): our own commands install the fixes for good
    (``install_for_good``), which in this process must not outlive the call."""
    try:
        from realformer_tools import fairseq_fixes
    except ImportError:
        return {}
    specs = {spec for fix in getattr(fairseq_fixes, "PATCHES", ()) for spec in getattr(fix, "REPLACES", ())}
    specs.add(getattr(fairseq_fixes, "SPAWN", "torch.multiprocessing:spawn"))
    found = {}
    for spec in specs:
        module_name, path = spec.split(":")
        owner = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        found[owner, name] = vars(owner).get(name, _MISSING)
    return found


def _reset_fairseq_globals():
    from fairseq import checkpoint_utils

    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best


def _refuse_unmarked_training(tool, args):
    item = conftest._current_item
    if item is not None and conftest.starts_training([tool, *args]) and item.get_closest_marker("slow") is None:
        pytest.fail(f"{item.nodeid} trains in process ({tool} ...): mark it @pytest.mark.slow "
                    "(make test-fast leaves those out)", pytrace=False)


def _fresh_logging(tool, out, err, launched):
    """The root logger as a fresh process running ``tool`` has it when ``main`` starts (fairseq
    0.12, measured): ``fairseq-train`` configures it on import (INFO, fairseq's format, stdout);
    fairseq's other commands import fairseq first, whose ``wav2vec2_classification`` module calls
    ``logging.basicConfig(level=logging.DEBUG)`` (DEBUG, Python's default format, stderr); the
    launcher (``launched``) and other commands start with none (WARNING, no handler) and
    configure their own."""
    root = logging.getLogger()
    root.handlers[:] = []
    root.setLevel(logging.WARNING)
    if launched or not tool.startswith("fairseq-"):
        return
    if tool == "fairseq-train":
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter(FAIRSEQ_LOG_FORMAT, FAIRSEQ_DATE_FORMAT))
        root.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
    else:
        handler = logging.StreamHandler(err)
        handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
        root.setLevel(logging.DEBUG)
    root.addHandler(handler)


def _exit_status(function, *args):
    """``function(*args)`` as a process's top level runs it: its exit status; ``SystemExit`` gives
    its code, any other exception goes to ``sys.excepthook`` (stderr) and the status is 1."""
    try:
        result = function(*args)
    except SystemExit as e:
        return _exit_code(e.code)
    except Exception:
        sys.excepthook(*sys.exc_info())
        return 1
    return _exit_code(result if isinstance(result, int) else None)


def _call(tool, args, fixes, data_fixes, bf16_decoding):
    """The tool's exit status. A fairseq command with the fixes is the launcher's ``main``
    (``realformer-fairseq [--data-fixes] [--bf16-decoding] <command> ...``, whose fixes are gone when
    an exception leaves it); another command with the fixes runs inside ``fixes_installed``, as in a
    process where they were installed for good."""
    launch = checkout_launcher() if fixes else None
    if launch is None:
        return _exit_status(console_function(tool))
    for name in ("REALFORMER_NMT_DATA_FIXES", "REALFORMER_NMT_BF16_DECODING", "REALFORMER_NMT_CPU_BF16"):
        os.environ.pop(name, None)  # only the arguments say which fixes this run gets
    if tool in launch.fairseq_commands():
        flags = ["--data-fixes"] * data_fixes + ["--bf16-decoding"] * bf16_decoding
        return _exit_status(launch.main, [*flags, tool, *args])
    with launch.fixes_installed(data_fixes=data_fixes, bf16_decoding=bf16_decoding, quiet=True):
        return _exit_status(console_function(tool))


def _show_warning(stream):
    def show(message, category, filename, lineno, file=None, line=None):
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))
    return show


def run_in_process(tool, *args, check=True, input=None, env=None, cwd=None, fixes=True, data_fixes=False,
                   bf16_decoding=False, threads=1, argv0=None):
    """Run the console command ``tool`` with ``args`` in this process, as ``cli_helpers.run`` runs
    it in a subprocess; returns ``subprocess.CompletedProcess(argv, returncode, stdout, stderr)``.

    ``fixes``/``data_fixes``/``bf16_decoding``: the fixes to fairseq the run gets (module docstring), the
    defaults of ``cli_helpers.run``: the launcher's always-on fixes, not the data or bf16 ones.
    ``env``: variables added for the call. ``threads``: torch's intra-op threads meanwhile.
    ``argv0``: ``sys.argv[0]`` (default ``<venv>/bin/<tool>``), e.g. the script under ``scripts/``
    that runs the same function, whose name argparse prints.
    """
    args = [str(a) for a in args]
    _refuse_unmarked_training(tool, args)
    console_function(tool)  # an unknown command fails here, not as the tool's exit status
    argv = [str(argv0 or conftest.BIN / tool), *args]
    out, err = io.StringIO(), io.StringIO()
    state = _ProcessState()
    try:
        sys.argv[:] = argv
        sys.stdin = io.StringIO(input or "")
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        if cwd is not None:
            os.chdir(cwd)
        torch.set_num_threads(threads)
        _reset_fairseq_globals()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # as a fresh process shows them: once per place, on stderr when raised
            warnings.simplefilter("default")
            warnings.showwarning = _show_warning(err)
            launch = checkout_launcher() if fixes else None
            _fresh_logging(tool, out, err, launched=launch is not None and tool in launch.fairseq_commands())
            code = _call(tool, args, fixes, data_fixes, bf16_decoding)
    finally:
        state.restore()
    proc = subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{tool} failed in process ({code}):\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}")
    return proc

