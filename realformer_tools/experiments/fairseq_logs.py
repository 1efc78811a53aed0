"""Reading what fairseq's command-line tools logged: training and validation records.

The harness runs ``fairseq-train`` and ``fairseq-validate`` with ``--log-format json``:
every stats line is fairseq's own ``json.dumps`` of its meters after the logging prefix
(``2026-01-01 00:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "7.123", ...}``),
and ``stats_record`` reads it with ``json.loads``. The logger name says what the line is
(``train_inner``, ``train`` at the end of an epoch, or a validation subset such as
``valid``), and fairseq prefixes the names of end-of-epoch and validation fields with it
(``valid_loss``), which is stripped here. Logs written with ``--log-format simple`` (runs
started before the harness switched, a resumed run whose log holds both, logs of other
tools) are read too: each line is tried as JSON first, then as a ``simple`` line, and
both give the same record for the same numbers.
"""

import json
import math

# exceptions fairseq raises when a run blows up, and what they mean
DIVERGENCE_MARKERS = (
    ("gradients are Nan/Inf", "NaN/inf gradients (FloatingPointError)"),
    ("Minimum loss scale reached", "fp16 loss scale reached its minimum (loss exploding)"),
    ("FloatingPointError", "FloatingPointError"),
)
_DROPPED = ("epoch", "update")  # JSON-only context: "update" is a fractional epoch, not num_updates


def _number(value):
    """``value`` (fairseq writes meters as strings: ``"7.123"``, ``"nan"``) as a float, or None."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _json_record(name, message):
    try:
        stats = json.loads(message)
    except ValueError:
        return None
    if not isinstance(stats, dict):
        return None
    prefix = "" if name == "train_inner" else name + "_"
    record = {}
    for key, value in stats.items():
        value = _number(value)
        if key in _DROPPED or value is None:
            continue
        record[key[len(prefix):] if prefix and key.startswith(prefix) else key] = value
    return record


def _simple_fields(text, pipes):
    """The numeric fields of a ``simple`` line's tail: ``| name value |`` or ``name=value, ...``."""
    parts = text.split("|") if pipes else text.split(",")
    record = {}
    for part in parts:
        words = part.strip().split(" ") if pipes else part.strip().split("=")
        if len(words) == 2 and words[0].isidentifier() and _number(words[1]) is not None:
            record[words[0]] = float(words[1])
    return record


def _simple_record(name, message):
    if name == "train_inner":
        # "epoch 001:     25 / 255 loss=12.976, nll_loss=12.899, ..., num_updates=25, ..."
        words = message.split(" ")
        start = next((i for i, w in enumerate(words) if "=" in w), None)
        return None if start is None else _simple_fields(" ".join(words[start:]), pipes=False)
    # "epoch 001 | valid on 'valid' subset | loss 7.123 | ..." (fairseq-validate: no epoch)
    marker = f"valid on '{name}' subset |"
    if marker not in message:
        return None
    return _simple_fields(message.split(marker, 1)[1], pipes=True)


def stats_record(line):
    """``(name, {field: float})`` of one stats line of a fairseq log, or None.

    ``name`` is ``train_inner`` (every ``--log-interval`` updates), ``train`` (an epoch's
    end; JSON logs only) or the validation subset (``valid``); the fields are fairseq's
    numbers under their ``simple``-format names (``loss``, ``num_updates``, ``bleu`` ...).
    """
    parts = line.split(" | ", 3)
    if len(parts) < 4:
        return None
    name, message = parts[2], parts[3].strip()
    record = _json_record(name, message) if message.startswith("{") else _simple_record(name, message)
    return (name, record) if record else None


def parse_log(lines, subset="valid"):
    """Validation records and training records of a fairseq-train log (either format).

    Returns ``{"valid": [...], "train": [...]}``; each record is a dict of the numeric fields
    with ``update`` (``num_updates``) and ``loss``. Records are sorted by update, and a later
    record for the same update (a resumed run repeating one) replaces the earlier.
    """
    found = {"valid": {}, "train": {}}
    for line in lines:
        parsed = stats_record(line)
        if parsed is None:
            continue
        name, rec = parsed
        kind = "valid" if name == subset else "train" if name == "train_inner" else None
        if kind and "num_updates" in rec and "loss" in rec:
            found[kind][int(rec["num_updates"])] = rec
    return {kind: [dict(rec, update=update) for update, rec in sorted(by_update.items())]
            for kind, by_update in found.items()}


def validate_record(lines, subset="valid"):
    """The numeric fields of ``fairseq-validate``'s summary line for ``subset`` (it has no
    ``num_updates``), or None."""
    found = [rec for name, rec in filter(None, map(stats_record, lines)) if name == subset]
    return found[-1] if found else None


def valid_curve(lines, metric="loss", subset="valid"):
    """``[[update, value], ...]`` of one validation metric (``loss``, ``bleu``, ``accuracy`` ...)."""
    return [[rec["update"], rec[metric]] for rec in parse_log(lines, subset)["valid"] if metric in rec]


def divergence_reason(lines):
    """Why a fairseq-train log shows a blown-up run (None if it does not).

    Divergence is an exception fairseq raises for non-finite gradients or a collapsed fp16
    loss scale, or a non-finite training/validation loss in the log.
    """
    text = "\n".join(lines)
    for needle, reason in DIVERGENCE_MARKERS:
        if needle in text:
            return reason
    parsed = parse_log(lines)
    for kind in ("train", "valid"):
        for rec in parsed[kind]:
            if not math.isfinite(rec["loss"]):
                return f"non-finite {kind} loss at update {rec['update']}"
    return None


def progress_line(line):
    """A stats line shortened for the console (``valid | loss 7.123 | num_updates 255``), or
    None for other lines."""
    parsed = stats_record(line)
    if parsed is None:
        return None
    name, rec = parsed
    return " | ".join([name] + [f"{k} {v:g}" for k, v in rec.items()])


def read_log(path):
    """The lines of a text file (a log), or [] if it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        return []
