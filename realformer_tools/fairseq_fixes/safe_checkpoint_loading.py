"""Load fairseq checkpoints under torch's ``weights_only`` unpickler, and nothing else.

Threat model. A checkpoint is a pickle, and an unrestricted unpickle runs whatever the
pickle names. A hostile checkpoint given to ``fairseq-generate``, ``fairseq-train
--restore-file / --finetune-from-model``, a resume or the hub interface may try to:

1. call code while loading (a ``__reduce__`` to ``os.system``, any function or class
   outside an allow-list): refused by torch's weights-only unpickler, which calls and
   builds allow-listed globals only;
2. have weights-only loading switched off (torch's environment switch
   ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``, which turns fairseq's plain ``torch.load`` into a full
   unpickle): refused before torch is called (tests/test_reliability_checkpoints.py sets
   that switch and checks the refusal);
3. forge memory through numpy (``numpy.ndarray((1,), numpy.dtype("O"), b"AAAAAAAA")``: an
   object array over attacker-chosen pointers, which torch's usual numpy allow-list
   accepts): refused, numpy's names resolve to checked stand-ins;
4. hide Python in config strings that fairseq later passes to ``eval()`` when it builds
   the model (``adaptive_softmax_cutoff``, ``encoder_layers`` of fconv, ...): refused
   (``config_code_check``).

Every refusal is one sentence naming the file (``UnsafeCheckpointError``), as is a missing,
empty or truncated file (``CheckpointFileError``); see ``checkpoint_errors``. Nothing here
ever turns weights-only loading off.

Bug fixed (fairseq 0.12 under torch >= 2.6): torch loads weights-only by default, and
fairseq's checkpoints hold types outside torch's allow-list (``argparse.Namespace`` above
all), so every vanilla ``fairseq-generate`` fails; the usual workaround (weights-only off)
opens threat 1.

What torch serves: the unpickler itself, ``safe_globals`` for fairseq's types
(``FAIRSEQ_CHECKPOINT_GLOBALS``, allowed only for the duration of each load, never
process-wide: any other ``torch.load`` in the process sees torch's own list), and
``get_unsafe_globals_in_checkpoint`` to name what it refused. Hand-written, where torch
cannot serve:

- the numpy stand-ins (threat 3, ``numpy_stand_ins``): torch offers only numpy's own
  ``ndarray``/``dtype``;
- refusing an environment that turns weights-only off (threat 2): torch lets the variable
  win over a ``torch.load`` that passes no ``weights_only``, as fairseq's does (the
  environment is read, never changed);
- the config-string check (threat 4): it happens after unpickling, in fairseq;
- one-line messages: torch's are tens of lines that advise turning weights-only off;
- the wrapper of ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` (through which the
  trainer, ``fairseq-generate``, ``fairseq-interactive`` and the hub interface all load)
  that applies them.

When it is no longer needed: fairseq's ``load_checkpoint_to_cpu`` passes
``weights_only=True`` and registers its own safe globals, and a checkpoint with a
``__reduce__`` payload is refused by vanilla ``fairseq-generate``
(``tests/test_reliability_checkpoints.py`` builds one).
"""

import argparse
import collections
import contextlib
import functools
import os
import pickle
import re
import typing
import zipfile

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode

from realformer_nmt.errors import RealFormerError, UnsafeCheckpointError

from .checkpoint_errors import ensemble_loader, file_error, refused_global, trainer_loader, unsafe_error
from .config_code_check import refuse_code_in_config
from .numpy_stand_ins import NumericArray, NumpyDTypeStandIn, numpy_reconstruct, numpy_scalar

# --------------------------------------------------------------------------------------
# The allow-list (threat 1)
# --------------------------------------------------------------------------------------
# Found with torch.serialization.get_unsafe_globals_in_checkpoint on checkpoints of fairseq
# 0.12 fairseq-train (legacy flags) and fairseq-hydra-train across its optimizers, LR
# schedules, criterions, --amp, --store-ema and --eval-bleu, and on checkpoints re-saved
# after load_checkpoint_to_cpu (whose "cfg" is then a DictConfig; multi-GPU resumes send it
# through torch.save/torch.load too). The weights-only unpickler can only call an entry
# with allowed data, make one with cls.__new__ and restore its state (__setstate__ or a
# __dict__ update): each entry below only builds data that way. Deliberately absent:
# eval/exec/getattr/__import__/compile/open, functools.partial, operator.*, os/sys/
# subprocess/importlib, numpy's own ndarray/dtype/_reconstruct, and fairseq's classes.

FAIRSEQ_CHECKPOINT_GLOBALS = [
    argparse.Namespace,  # cfg sections of legacy-flag runs (and "args" before fairseq 0.10)
    (NumpyDTypeStandIn, "numpy.dtype"),
    (NumericArray, "numpy.ndarray"),
    (numpy_reconstruct, "numpy._core.multiarray._reconstruct"),
    (numpy_reconstruct, "numpy.core.multiarray._reconstruct"),
    (numpy_scalar, "numpy._core.multiarray.scalar"),
    (numpy_scalar, "numpy.core.multiarray.scalar"),
    # a "cfg" pickled as omegaconf containers; their resolvers (oc.env, oc.select ...) run no code
    (DictConfig, "omegaconf.dictconfig.DictConfig"),
    (ListConfig, "omegaconf.listconfig.ListConfig"),
    (ContainerMetadata, "omegaconf.base.ContainerMetadata"),
    (Metadata, "omegaconf.base.Metadata"),
    (AnyNode, "omegaconf.nodes.AnyNode"),
    (typing.Any, "typing.Any"),  # omegaconf's ref/key/element type; named: no __qualname__ before 3.11
    # type references in omegaconf Metadata and its resolver_cache = defaultdict(dict):
    # called, they build plain data only (dict(pairs), list(iterable), int("3"))
    dict,
    list,
    int,
    collections.defaultdict,
]


@contextlib.contextmanager
def fairseq_checkpoint_types():
    """Within the block, torch's weights-only unpickler also accepts
    ``FAIRSEQ_CHECKPOINT_GLOBALS``; afterwards the allow-list is what it was (entries that were
    on it before stay; only the missing ones are added, and removed again)."""
    present = set(torch.serialization.get_safe_globals())
    missing = [g for g in FAIRSEQ_CHECKPOINT_GLOBALS if g not in present]
    with torch.serialization.safe_globals(missing):
        yield


_TRUE = ("1", "y", "yes", "true")  # torch's reading of its TORCH_FORCE_* variables


def _weights_only_refused_by_environment():
    """The variable that would turn fairseq's ``torch.load`` (no ``weights_only`` argument)
    into an unrestricted unpickle, if the environment sets it; else None."""
    name = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
    return name if os.environ.get(name, "0").lower() in _TRUE else None


def _raised_inside_torch_load(exc):
    """Whether ``exc`` comes from torch's loading (not from fairseq's work on the state)."""
    torch_files = {os.path.normcase(os.path.abspath(m.__file__))
                   for m in (torch.serialization, torch._weights_only_unpickler)}
    tb = exc.__traceback__
    while tb is not None:
        if os.path.normcase(os.path.abspath(tb.tb_frame.f_code.co_filename)) in torch_files:
            return True
        tb = tb.tb_next
    return False


def _is_zip(path):
    try:
        from fairseq.file_io import PathManager

        return zipfile.is_zipfile(PathManager.get_local_path(path))
    except Exception:  # noqa: BLE001 - only used to word the message
        return False


def _torch_too_old():
    return tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2]) < (2, 6)


def _make_safe_loader(original):
    @functools.wraps(original)
    def safe_load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        if _torch_too_old():  # pragma: no cover
            raise UnsafeCheckpointError(f"refused to load checkpoint {path}: torch {torch.__version__} would "
                                        "unpickle it with no restrictions; install torch >= 2.6")
        unsafe_switch = _weights_only_refused_by_environment()
        if unsafe_switch:
            raise UnsafeCheckpointError(
                f"refused to load checkpoint {path}: the environment asks torch to unpickle checkpoints without "
                f"weights-only restrictions ({unsafe_switch}=1); unset it")
        # fairseq's types allowed for this load (and while a refusal is put in words: torch's look at
        # the file then names the global it refused, not one of these)
        with fairseq_checkpoint_types():
            try:
                state = original(path, arg_overrides=arg_overrides, load_on_all_ranks=load_on_all_ranks)
            except RealFormerError:
                raise
            except pickle.UnpicklingError as exc:
                if not _raised_inside_torch_load(exc):
                    raise
                # torch.save writes zip files, so a refusal there is about content; in a legacy
                # (pre-1.6) file it may just as well be garbage
                if _is_zip(path) or refused_global(str(exc)):
                    raise unsafe_error(path, exc) from exc
                raise file_error(path, exc) from exc
            except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
                raise file_error(path, exc) from exc
            except (EOFError, OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError,
                    zipfile.BadZipFile) as exc:
                # a truncated zip (OSError), an empty file (EOFError), text (KeyError), a malformed pickle ...
                if isinstance(exc, RuntimeError) and "WEIGHTS_ONLY_LOAD" in str(exc):
                    raise UnsafeCheckpointError(
                        f"refused to load checkpoint {path}: the environment asks torch to unpickle "
                        f"checkpoints without weights-only restrictions ({exc})") from exc
                if _raised_inside_torch_load(exc):
                    raise file_error(path, exc) from exc
                raise
        refuse_code_in_config(path, state)
        return state

    safe_load_checkpoint_to_cpu.__realformer_safe__ = True
    return safe_load_checkpoint_to_cpu


def _types_allowed_throughout(load_checkpoint):
    """``Trainer.load_checkpoint`` with fairseq's types allowed for the whole call: with
    several ranks, rank 0 loads the file and sends the state to the others through
    ``torch.save`` / ``torch.load`` (``distributed_utils.broadcast_object``), whose message
    also holds fairseq's ``_TensorPlaceholder`` (one int: where a tensor goes back in)."""
    from fairseq.distributed.utils import _TensorPlaceholder

    @functools.wraps(load_checkpoint)
    def wrapper(*args, **kwargs):
        present = set(torch.serialization.get_safe_globals())
        with fairseq_checkpoint_types(), \
                torch.serialization.safe_globals([g for g in (_TensorPlaceholder,) if g not in present]):
            return load_checkpoint(*args, **kwargs)

    wrapper.__realformer_safe__ = True
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.checkpoint_utils:load_checkpoint_to_cpu",
    "fairseq.checkpoint_utils:load_model_ensemble_and_task",
    "fairseq.trainer:Trainer.load_checkpoint",
)
CHANGES = ("checkpoints load on torch >= 2.6, weights-only with fairseq's own types allowed per load; an "
           "unsafe, missing or truncated file is one line")


def install_safe_checkpoint_loading():
    """Wrap fairseq's checkpoint loaders (idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    for name, make in (("load_checkpoint_to_cpu", _make_safe_loader),
                       ("load_model_ensemble_and_task", ensemble_loader)):
        if not getattr(getattr(checkpoint_utils, name), "__realformer_safe__", False):
            setattr(checkpoint_utils, name, make(getattr(checkpoint_utils, name)))
    if not getattr(Trainer.load_checkpoint, "__realformer_safe__", False):
        Trainer.load_checkpoint = _types_allowed_throughout(trainer_loader(Trainer.load_checkpoint))


def safe_load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """``fairseq.checkpoint_utils.load_checkpoint_to_cpu``, weights-only, clear errors."""
    install_safe_checkpoint_loading()
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides=arg_overrides,
                                                   load_on_all_ranks=load_on_all_ranks)


install = install_safe_checkpoint_loading
