"""The check records every step writes (``check(name, status, reason, **details)``), how a
step's status follows from them, and paths and commands as the JSON keeps them (relative,
no machine paths).

A check's status is ``passed`` or ``failed`` when it was judged against its target,
``reported`` when a value was measured and recorded but not judged (a yardstick, the speed
of a dry run's tiny model), ``skipped`` when it did not run here (the dry run's CUDA tests).
A section's status counts the judged checks only: ``failed`` if one failed, ``passed`` if one passed and none failed;
with none judged, ``reported`` or ``skipped``.
"""

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


JUDGED = ("passed", "failed")


def step_status(checks) -> str:
    """The status of a step or section: of its judged checks only (see the docstring)."""
    statuses = {c["status"] for c in checks}
    for status in ("failed", "passed", "reported"):
        if status in statuses:
            return status
    return "skipped"


def status_counts(checks) -> str:
    """``"3 passed, 2 reported, 4 skipped"``: how many checks have each status."""
    counts = {}
    for c in checks:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())
