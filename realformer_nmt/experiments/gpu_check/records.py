"""The check records every step writes (``check(name, status, reason, **details)``), how a
step's status follows from them, and paths and commands as the JSON keeps them (relative,
no machine paths)."""

import os
import shlex
import sys


def rel(path) -> str:
    """``path`` relative to the working directory (no machine paths in the JSON)."""
    return os.path.relpath(os.path.abspath(str(path)))


def portable(cmd) -> str:
    """A command as a shell line without machine paths: tools by name, files relative."""
    words = []
    for word in map(str, cmd):
        if word == sys.executable:
            word = "python"
        elif os.path.isabs(word) and os.path.dirname(word) == os.path.dirname(sys.executable):
            word = os.path.basename(word)  # fairseq-train ... next to the interpreter
        elif os.path.isabs(word):
            word = rel(word)
        words.append(word)
    return " ".join(shlex.quote(w) for w in words)


def check(name, status, reason=None, **details):
    return {"name": name, "status": status, "reason": reason, **details}


def step_status(checks) -> str:
    statuses = {c["status"] for c in checks}
    if "failed" in statuses:
        return "failed"
    if statuses <= {"skipped"}:
        return "skipped"
    return "passed"


def _clear_run(run_dir):
    if os.path.isdir(run_dir):
        for name in os.listdir(run_dir):
            path = os.path.join(run_dir, name)
            if os.path.isfile(path):
                os.remove(path)
