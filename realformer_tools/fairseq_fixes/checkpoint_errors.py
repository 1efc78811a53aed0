"""One sentence naming the file for every checkpoint that cannot be loaded.

Not a patch of its own: ``safe_checkpoint_loading`` uses it. torch's refusals are tens of
lines that end in advice to turn weights-only loading off; a truncated file surfaces as a
zip-reader error; a checkpoint of another dictionary size gives one ``size mismatch`` line
per parameter, re-raised by fairseq's trainer as "Cannot load model parameters". Here each
becomes an ``UnsafeCheckpointError`` or a ``CheckpointFileError``.
"""

import functools
import os
import pickle
import re

import torch

from realformer_nmt.errors import CheckpointFileError, RealFormerError, UnsafeCheckpointError

_GLOBAL_PATTERNS = [  # where torch's messages name the refused global
    re.compile(r"GLOBAL (\S+) was not an allowed global by default"),
    re.compile(r"unsupported GLOBAL (\S+) whose module \S+ is blocked"),
    re.compile(r"but got <class '([^']+)'>"),
    re.compile(r"for unrecognized function (<[^>]+>|\S+)"),
]


def refused_global(message, path=None):
    """The global torch refused: named in its message, else (given ``path``) found in the
    file by torch's static look at its pickle."""
    for pattern in _GLOBAL_PATTERNS:
        match = pattern.search(message)
        if match:
            name = match.group(1)  # torch prints builtins without their module ("GLOBAL eval")
            return name if "." in name or name.startswith("<") else "builtins." + name
    if path is None:
        return None
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - a legacy or malformed file: name nothing rather than guess
        return None
    return sorted(unsafe)[0] if unsafe else None


def unsafe_error(path, exc):
    """``UnsafeCheckpointError`` for a checkpoint that torch's weights-only unpickler refused."""
    message = str(exc)
    name = refused_global(message, path)
    numpy_reason = re.search(r"numpy data that fairseq checkpoints never hold: ([^\n]*)", message)
    what = (f"the global {name}" if name else numpy_reason.group(1) if numpy_reason
            else "pickle instructions that torch's weights-only loader does not accept")
    return UnsafeCheckpointError(f"refused to load checkpoint {path}: it contains {what}, which fairseq "
                                 "checkpoints never contain and which could execute code when loaded")


def first_sentence(text, limit=120):
    """The first sentence of ``text``'s first line, cut at a word boundary to ``limit``."""
    lines = text.strip().splitlines()
    sentence = re.split(r"(?<=[.!?])\s", lines[0].strip(), maxsplit=1)[0].rstrip(".") if lines else ""
    if len(sentence) > limit:
        sentence = sentence[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return sentence


def _recovery_hint(path):
    """For an unreadable ``checkpoint_last.pt`` (training interrupted while writing it):
    which checkpoint in the same folder to resume from instead."""
    path = str(path)
    if os.path.basename(path) != "checkpoint_last.pt":
        return ""
    folder = os.path.dirname(path)
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return ""
    epochs = [n for n in names if re.fullmatch(r"checkpoint\d+(_\d+)?\.pt", n)]
    epochs.sort(key=lambda n: os.path.getmtime(os.path.join(folder, n)), reverse=True)
    candidates = epochs[:1] + (["checkpoint_best.pt"] if "checkpoint_best.pt" in names else [])
    if not candidates:
        return "; no other checkpoint in that folder to resume from: delete it to train from scratch"
    choices = " or ".join(os.path.join(folder, n) for n in candidates)
    return f"; to resume, pass fairseq-train --restore-file {choices} (or delete it to train from scratch)"


_FILE_REASONS = {FileNotFoundError: "no such file", IsADirectoryError: "it is a directory, not a file",
                 PermissionError: "permission denied", EOFError: "it is empty or truncated"}


def file_error(path, exc):
    """``CheckpointFileError`` for a missing, empty, truncated or foreign file."""
    reason = next((r for kind, r in _FILE_REASONS.items() if isinstance(exc, kind)), None)
    if reason is None:
        reason = "it is truncated, corrupt or not a PyTorch checkpoint"
        # torch's wording of I/O and zip errors is short and useful; its unpickler's is long
        # and advises unsafe loading, so it is left out
        detailed = (OSError, RuntimeError, TypeError, AttributeError, ValueError, IndexError)
        if isinstance(exc, detailed) and not isinstance(exc, pickle.UnpicklingError) and first_sentence(str(exc)):
            reason += f" ({type(exc).__name__}: {first_sentence(str(exc))})"
    return CheckpointFileError(f"cannot read checkpoint {path}: {reason}{_recovery_hint(path)}")


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) from "
    r"checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)"
)


def _size_mismatch_error(path, exc, task):
    """A one-line error for a checkpoint whose parameters do not fit the model (above all:
    a dictionary of another size), or None when ``exc`` (and what it wraps) is not that."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = _SIZE_MISMATCH.findall(str(exc)) if isinstance(exc, RuntimeError) else []
        if found:
            break
        exc = exc.__cause__ or exc.__context__
    else:
        return None
    data = getattr(getattr(task, "cfg", None), "data", None) or getattr(getattr(task, "args", None), "data", None)
    data = f" ({data})" if data else ""
    for name, saved, here in found:
        if "embed_tokens" in name or "output_projection" in name:
            return CheckpointFileError(
                f"checkpoint {path} does not fit this data{data}: its dictionary has {saved.split(',')[0].strip()} "
                f"entries ({name}), the data's dictionary has {here.split(',')[0].strip()}; the checkpoint was "
                "trained on other data (another corpus, vocabulary or BPE): use the data-bin it was trained with")
    name, saved, here = found[0]
    return CheckpointFileError(f"checkpoint {path} does not fit the model built here: {name} has shape [{saved}] "
                               f"in the checkpoint and [{here}] here (other architecture or size flags)")


def ensemble_loader(original):
    """``load_model_ensemble_and_task`` with one line for a missing file or misfit parameters."""
    @functools.wraps(original)
    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        try:
            return original(filenames, *args, **kwargs)
        except RealFormerError:
            raise
        except OSError as exc:
            prefix = "Model file not found: "  # fairseq checks that the file exists first
            if str(exc).startswith(prefix):
                raise CheckpointFileError(f"cannot read checkpoint {str(exc)[len(prefix):]}: no such file") from exc
            raise
        except RuntimeError as exc:
            paths = filenames if isinstance(filenames, (list, tuple)) else [filenames]
            task = kwargs.get("task", args[1] if len(args) > 1 else None)
            error = _size_mismatch_error(",".join(map(str, paths)), exc, task)
            if error is None:
                raise
            raise error from exc

    load_model_ensemble_and_task.__realformer_safe__ = True
    return load_model_ensemble_and_task


def trainer_loader(original):
    """``Trainer.load_checkpoint`` (--restore-file, --finetune-from-model, a resume) with one
    line for parameters that do not fit (fairseq re-raises them as a bare Exception)."""
    @functools.wraps(original)
    def load_checkpoint(self, filename, *args, **kwargs):
        try:
            return original(self, filename, *args, **kwargs)
        except RealFormerError:
            raise
        except Exception as exc:  # noqa: BLE001 - fairseq raises a bare Exception here
            error = _size_mismatch_error(filename, exc, getattr(self, "task", None))
            if error is None:
                raise
            raise error from exc

    load_checkpoint.__realformer_safe__ = True
    return load_checkpoint
