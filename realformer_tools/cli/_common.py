"""Small helpers the commands share: argparse types and flags, the preamble of a command's
``main`` (one-line errors, fairseq's import quieted, JSON output), the plugin's folder."""

import argparse
import json
import logging
import os
import sys
import warnings

from ..plugin_dir import plugin_dir


def comma_list(kind=str, choices=None):
    """argparse type: ``"a,b,c"`` -> ``[kind(a), kind(b), kind(c)]``, optionally from ``choices``."""
    def parse(text):
        try:
            values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}s, got {text!r}") from exc
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        bad = [v for v in values if choices is not None and v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(str, bad))} (choose from {', '.join(map(str, choices))})")
        return values
    return parse


def emit_json(summary, path=None):
    """Print ``summary`` as JSON and, with ``path``, also write it there."""
    text = json.dumps(summary, indent=2, ensure_ascii=False)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


def user_dir():
    """The folder of the ``realformer_nmt`` package these commands belong to (an installed
    wheel's or a checkout's): the value of fairseq's ``--user-dir``."""
    return plugin_dir()


def input_output_error(source, out):
    """The one-line error for a missing input or an ``--out`` that is a file, else None.
    Commands check this before the slow import of fairseq."""
    if not os.path.exists(source):
        return f"{source}: no such file or folder"
    if os.path.exists(out) and not os.path.isdir(out):
        return f"--out {out} exists and is not a folder"
    return None


def quiet_fairseq_import():
    """Keep fairseq's import-time INFO lines and hydra's warnings about its own deprecated
    usage off a command's output."""
    logging.basicConfig(format="%(message)s", level=logging.WARNING)
    warnings.filterwarnings("ignore", message=r"(?s).*(hydra|Hydra|ConfigStore|version_base|package header)")


def install_fairseq_fixes():
    """The project's commands run fairseq with its fixes (safe checkpoint loading, ...: the
    plugin's import installs none of them): in this process, for good, and in every fairseq
    tool they start (through the launcher, ``realformer_tools.launch``). The data fixes follow
    ``REALFORMER_NMT_DATA_FIXES`` in those tools, which the harnesses and the demo set."""
    from realformer_tools.fairseq_fixes import install_for_good

    install_for_good()


def program(script):
    """The name a command's errors begin with, as argparse's own do (``sys.argv[0]``'s
    basename): the console command the user typed (``realformer-prepare-data``), else
    ``script`` (``prepare_data.py``: run from a checkout or with ``python -m``, or its
    ``main(argv)`` called by a program)."""
    typed = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "")
    return typed if typed.startswith("realformer-") else script


def fail(name, message, status=2):
    """Print ``<program>: error: <message>`` (argparse's one-line form; ``program(name)``) to
    stderr; return ``status``."""
    print(f"{program(name)}: error: {message}", file=sys.stderr)
    return status


def run_command(name, work, problem=None, json_path=None, show=None, status=2):
    """What a command's ``main`` does once its flags are parsed; returns the exit status.

    ``problem``: the one-line error of a check made before the slow import of fairseq (or
    None). Then fairseq's import is quieted and ``work()`` runs; a ``RealFormerError`` it
    raises is printed as one line and gives ``status``. Its result is shown by ``show``
    (default: printed as JSON, also written to ``json_path`` when given) and gives 0.
    """
    if problem:
        return fail(name, problem, status)
    quiet_fairseq_import()
    install_fairseq_fixes()
    from realformer_nmt.errors import RealFormerError

    try:
        result = work()
    except RealFormerError as exc:
        return fail(name, exc, status)
    if show is None:
        emit_json(result, json_path)
    else:
        show(result)
    return 0


def add_device_flags(group):
    """--device, --no-fp16, --threads and --jobs of the commands that train several runs."""
    group.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cpu passes --cpu; cuda trains on the GPU with --fp16 (default: cpu)")
    group.add_argument("--no-fp16", action="store_true", help="with --device cuda: train in float32")
    group.add_argument("--threads", type=int, default=None,
                       help="OMP_NUM_THREADS for each fairseq process (default: inherited with --jobs 1, "
                            "else the cores shared out between the jobs). On a shared CPU, 1 avoids threads "
                            "spinning against other jobs")
    group.add_argument("--jobs", type=int, default=1,
                       help="train this many runs at once (default: 1; 2 uses both cores of a 2-core machine with "
                            "one thread each). How many run at once changes no result, but the threads "
                            "each run gets change its float rounding: give --threads to rerun a run exactly")


def exit_zero(main):
    """The console command for ``main``: it runs ``main(argv)`` and exits with status 0
    (``main`` itself returns its result, for callers)."""
    def command(argv=None):
        """The console command: main(), then exit status 0."""
        main(argv)
        return 0
    return command
