"""Small helpers the commands share (argparse types, JSON output, the plugin's folder)."""

import argparse
import json
import os


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
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
