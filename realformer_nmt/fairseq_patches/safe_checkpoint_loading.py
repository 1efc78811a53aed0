"""Load fairseq checkpoints under torch's ``weights_only`` unpickler, and nothing else.

Bug (fairseq 0.12 under torch >= 2.6): since torch 2.6, ``torch.load`` defaults to
``weights_only=True``: only tensors, plain containers and explicitly allow-listed globals
may be unpickled, so a checkpoint cannot run code when it is opened. fairseq 0.12 predates
that and its checkpoints hold a few other types (``argparse.Namespace`` above all), so
every vanilla ``fairseq-generate`` fails; and the usual workaround (turning
``weights_only`` off) lets a checkpoint run code.
``install`` (run by ``import realformer_nmt`` and ``--user-dir realformer_nmt``) fixes
that the safe way:

* ``allow_fairseq_checkpoint_types()`` adds to torch's allow-list exactly the types
  that checkpoints written by fairseq hold (``FAIRSEQ_CHECKPOINT_GLOBALS`` says which,
  and why none of them can execute code); numpy values go through checked stand-ins,
  because numpy's own ``ndarray``/``dtype`` would let a pickle forge object pointers;
* ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` (through which the trainer,
  ``--restore-file``, ``--finetune-from-model``, ``fairseq-generate``,
  ``fairseq-interactive`` and the hub interface all load checkpoints) is wrapped so that
  the load always runs weights-only (an environment that asks torch for unrestricted
  unpickling makes the load fail instead);
  config strings that fairseq would ``eval()`` are checked for code; and a refused or
  unreadable file becomes one clear sentence (``UnsafeCheckpointError`` or
  ``CheckpointFileError``) instead of torch's long message (torch's reason is quoted to
  the end of its first sentence; an unreadable ``checkpoint_last.pt`` names the checkpoint
  of the same folder to ``--restore-file`` instead);
* ``load_model_ensemble_and_task`` and ``Trainer.load_checkpoint`` turn torch's
  ``size mismatch`` (tens of lines, re-raised by the trainer as "Cannot load model
  parameters") into one sentence: the checkpoint's and the data's dictionary sizes when an
  embedding differs (the checkpoint was trained on other data), else the first parameter
  whose shape differs.

Nothing here ever turns weights-only loading off.

When it is no longer needed: fairseq's ``load_checkpoint_to_cpu`` passes
``weights_only=True`` and registers its own safe globals, and a checkpoint with a
``__reduce__`` payload is refused by vanilla ``fairseq-generate``
(``tests/test_reliability_checkpoints.py`` builds one).
"""

import argparse
import ast
import builtins
import collections
import contextlib
import functools
import io
import logging
import os
import pickle
import pickletools
import re
import typing
import zipfile

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode

from ..errors import CheckpointFileError, RealFormerError, UnsafeCheckpointError

logger = logging.getLogger(__name__)

# ``hook(state, path)`` run on every checkpoint that loaded safely (the plugin uses it to
# note the residual settings a checkpoint was trained with; see ``residual_config``).
AFTER_LOAD_HOOKS = []

__all__ = [
    "FAIRSEQ_CHECKPOINT_GLOBALS",
    "install",
    "CheckpointFileError",
    "allow_fairseq_checkpoint_types",
    "install_safe_checkpoint_loading",
    "safe_load_checkpoint_to_cpu",
]


# --------------------------------------------------------------------------------------
# numpy values, through checked stand-ins
# --------------------------------------------------------------------------------------
#
# fairseq meters can hold numpy values (--eval-bleu logs _bleu_counts/_bleu_totals as
# int64 arrays into extra_state.metrics; np.float64 scores show up too). torch's usual
# recipe, add_safe_globals([_reconstruct, np.ndarray, np.dtype]), is NOT safe: it lets
# a checkpoint call numpy.ndarray((1,), numpy.dtype("O"), b"AAAAAAAA"), an object array
# whose element pointers are attacker-chosen bytes, i.e. memory corruption on first use
# (this segfaults; crafted pointers are the classic route to code execution).
#
# So the numpy names in a checkpoint resolve to stand-ins below, never to numpy's own
# callables: they accept fixed-size bool/int/uint/float dtypes only, check every shape
# and byte count, and hand numpy nothing but a validated dtype and raw bytes.

try:  # numpy >= 2 (and the forward-compatibility stubs of numpy 1.26)
    from numpy._core import multiarray as _np_multiarray
except ImportError:  # pragma: no cover - numpy < 1.26
    from numpy.core import multiarray as _np_multiarray

_NUMPY_TYPECODE = re.compile(r"[iuf][1248]|b1")


def _refuse(what):
    what = what if len(what) <= 80 else what[:77] + "..."
    raise pickle.UnpicklingError(f"numpy data that fairseq checkpoints never hold: {what}")


def _is_stand_in(obj, kind):
    # by marker, not identity: a second copy of this module (reload, other import
    # name) registers its own, equivalent stand-ins under the same numpy names
    return getattr(obj, "_realformer_numpy_stand_in", None) == kind


def _numeric_dtype(value):
    """A numpy dtype, if ``value`` is (a stand-in for) a fixed-size numeric one."""
    if _is_stand_in(type(value), "dtype"):
        return value.to_numpy()
    if (
        isinstance(value, np.dtype)
        and value.kind in "biuf"
        and value.fields is None
        and value.subdtype is None
        and not value.hasobject
    ):
        return value
    _refuse(f"numpy dtype {value!r}")


class NumpyDTypeStandIn:
    """What ``numpy.dtype`` means inside a checkpoint: a type code and a byte order.

    numpy pickles a dtype as ``numpy.dtype("f8", False, True)`` followed by a state
    tuple ``(3, "<", None, None, None, -1, -1, 0)``; both are checked and stored, and
    only ``to_numpy()`` turns them into a real (numeric) dtype.
    """

    _realformer_numpy_stand_in = "dtype"

    def __init__(self, typecode, align=False, copy=False):
        if not (isinstance(typecode, str) and _NUMPY_TYPECODE.fullmatch(typecode)):
            _refuse(f"numpy dtype {typecode!r}")
        self.typecode = typecode
        self.byteorder = "="

    def __setstate__(self, state):
        if not (
            isinstance(state, tuple)
            and len(state) >= 5
            and state[1] in ("<", ">", "|", "=")
            and state[2] is None  # subarray
            and state[3] is None  # field names
            and state[4] is None  # fields
        ):
            _refuse(f"numpy dtype state {state!r}")
        self.byteorder = state[1]

    def to_numpy(self):
        typecode = self.__dict__.get("typecode")
        if not (isinstance(typecode, str) and _NUMPY_TYPECODE.fullmatch(typecode)):
            _refuse("a numpy dtype without a type code")
        byteorder = self.__dict__.get("byteorder", "=")
        dtype = np.dtype(typecode)
        return dtype.newbyteorder(byteorder) if byteorder in ("<", ">") else dtype


class NumericArray(np.ndarray):
    """What ``numpy.ndarray`` means inside a checkpoint (arrays load as this subclass).

    It cannot be called from a pickle, its ``__setstate__`` accepts numeric dtypes and
    exactly-sized raw bytes only, and it pickles back as a plain ``numpy.ndarray``.
    """

    _realformer_numpy_stand_in = "ndarray"

    def __new__(cls, *args, **kwargs):
        _refuse("a call of numpy.ndarray")

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            _refuse("a numpy array state of unexpected form")
        version, shape, dtype, is_fortran, raw = state
        dtype = _numeric_dtype(dtype)
        if not (
            isinstance(shape, tuple)
            and len(shape) <= 32
            and all(type(n) is int and n >= 0 for n in shape)
        ):
            _refuse(f"numpy array shape {shape!r}")
        if type(is_fortran) is not bool or not isinstance(raw, (bytes, bytearray)):
            _refuse("numpy array data that is not raw bytes")
        count = 1
        for n in shape:
            count *= n
        if len(raw) != count * dtype.itemsize:
            _refuse("numpy array data of the wrong size")
        np.ndarray.__setstate__(self, (version, shape, dtype, is_fortran, bytes(raw)))

    def __reduce_ex__(self, protocol):
        return self.view(np.ndarray).__reduce_ex__(protocol)

    def __reduce__(self):
        return self.view(np.ndarray).__reduce__()


def numpy_reconstruct(subtype, shape, typecode):
    """What ``numpy._core.multiarray._reconstruct`` means inside a checkpoint.

    numpy pickles an array as ``_reconstruct(ndarray, (0,), b"b")`` followed by its
    state; the empty array is made here from constants, the state is checked by
    ``NumericArray.__setstate__``.
    """
    if not (
        isinstance(subtype, type)
        and issubclass(subtype, np.ndarray)
        and _is_stand_in(subtype, "ndarray")
    ):
        _refuse(f"numpy array subtype {subtype!r}")
    return _np_multiarray._reconstruct(subtype, (0,), b"b")


def numpy_scalar(dtype, raw=None):
    """What ``numpy._core.multiarray.scalar`` means inside a checkpoint (np.float64 etc.)."""
    dtype = _numeric_dtype(dtype)
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != dtype.itemsize:
        _refuse("numpy scalar data of the wrong form")
    return np.frombuffer(bytes(raw), dtype=dtype)[0]


# --------------------------------------------------------------------------------------
# The allow-list
# --------------------------------------------------------------------------------------
#
# Found empirically (torch.serialization.get_unsafe_globals_in_checkpoint) on checkpoints
# written by fairseq 0.12 `fairseq-train` (legacy --arch flags) and `fairseq-hydra-train`
# with adam/sgd/nag/adagrad/adafactor/adamax/adadelta, inverse_sqrt/fixed/cosine/
# polynomial_decay/reduce_lr_on_plateau/tri_stage/triangular/step schedules,
# cross_entropy/label_smoothed_cross_entropy, --amp, --store-ema, --eval-bleu, and on
# checkpoints re-saved after `checkpoint_utils.load_checkpoint_to_cpu` (whose "cfg" is
# then an omegaconf DictConfig instead of a plain dict; multi-GPU resumes also send the
# loaded state, DictConfig included, through torch.save/torch.load to the other ranks).
#
# Every entry is one class or function, never a module. The weights_only unpickler can
# only (a) call an allow-listed global with arguments built from allowed data, (b) make
# an instance with cls.__new__ and (c) restore its state with __setstate__ or a
# __dict__ update, so each entry below is safe if those three only build data.
# Deliberately absent: builtins that evaluate or look things up (eval, exec, getattr,
# __import__, compile, open), functools.partial, operator.*, os/posix/subprocess/sys,
# importlib, pydoc.locate, numpy's own ndarray/dtype/_reconstruct (see above), and
# fairseq's classes (fairseq never pickles them).

FAIRSEQ_CHECKPOINT_GLOBALS = [
    # fairseq-train with legacy flags: state["cfg"]["model"], ["optimizer"], ... (and
    # state["args"] before fairseq 0.10). An attribute bag: __new__ + __dict__ update;
    # calling it with positional arguments raises TypeError.
    argparse.Namespace,
    # numpy values in meters: checked stand-ins under numpy's names (1.x and 2.x).
    (NumpyDTypeStandIn, "numpy.dtype"),
    (NumericArray, "numpy.ndarray"),
    (numpy_reconstruct, "numpy._core.multiarray._reconstruct"),
    (numpy_reconstruct, "numpy.core.multiarray._reconstruct"),
    (numpy_scalar, "numpy._core.multiarray.scalar"),
    (numpy_scalar, "numpy.core.multiarray.scalar"),
    # omegaconf (a fairseq dependency), for a "cfg" pickled as a DictConfig.
    # DictConfig/ListConfig/AnyNode restore their __dict__ in __setstate__, the two
    # Metadata dataclasses are plain records; calling any of them builds a config and
    # nothing else. Interpolations ("${...}") in config strings are no new risk: fairseq
    # wraps even a plain-dict cfg in OmegaConf.create, and the resolvers omegaconf and
    # hydra register (oc.env, oc.decode, oc.select, now, ...) run no code.
    (DictConfig, "omegaconf.dictconfig.DictConfig"),
    (ListConfig, "omegaconf.listconfig.ListConfig"),
    (ContainerMetadata, "omegaconf.base.ContainerMetadata"),
    (Metadata, "omegaconf.base.Metadata"),
    (AnyNode, "omegaconf.nodes.AnyNode"),
    # The ref/key/element type stored in every omegaconf Metadata, a value here
    # (calling it raises TypeError). Named explicitly: before Python 3.11 it is a
    # _SpecialForm instance without __qualname__.
    (typing.Any, "typing.Any"),
    # Type references in omegaconf Metadata (object_type=dict/list, key_type=int for
    # ListConfig) and the factory in Metadata.resolver_cache = defaultdict(dict).
    # Called, they only build plain data: dict(pairs), list(iterable), int("3").
    dict,
    list,
    int,
    # defaultdict(factory): the factory must itself be allow-listed and is called with
    # no arguments on a missing key (dict() -> {}), so it builds data only.
    collections.defaultdict,
]


def _torch_supports_safe_globals():
    return hasattr(torch.serialization, "add_safe_globals")


def _torch_loads_weights_only_by_default():
    """torch >= 2.6: plain torch.load(f) is weights-only (and the env switches exist)."""
    try:
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    except ValueError:  # pragma: no cover - unusual local version string
        return _torch_supports_safe_globals()
    return (major, minor) >= (2, 6)


def allow_fairseq_checkpoint_types():
    """Allow-list ``FAIRSEQ_CHECKPOINT_GLOBALS`` for weights-only loading.

    Idempotent: adds only what is missing (e.g. after someone called
    ``torch.serialization.clear_safe_globals()``), so calling it again is cheap.
    """
    if not _torch_supports_safe_globals():  # pragma: no cover - torch < 2.4
        return
    present = set(torch.serialization.get_safe_globals())
    missing = [g for g in FAIRSEQ_CHECKPOINT_GLOBALS if g not in present]
    if missing:
        torch.serialization.add_safe_globals(missing)


# --------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------

_GLOBAL_PATTERNS = [
    re.compile(r"GLOBAL (\S+) was not an allowed global by default"),
    re.compile(r"unsupported GLOBAL (\S+) whose module \S+ is blocked"),
    re.compile(r"but got <class '([^']+)'>"),
    re.compile(r"for unrecognized function (<[^>]+>|\S+)"),
]


def _offending_global_from_message(message):
    for pattern in _GLOBAL_PATTERNS:
        match = pattern.search(message)
        if match:
            name = match.group(1)
            # torch prints builtins without their module ("GLOBAL eval")
            if "." not in name and not name.startswith("<"):
                name = "builtins." + name
            return name
    return None


def _pickle_globals(data):
    """Names of the globals a pickle refers to, found by disassembly (nothing is run)."""
    names, strings, memo = [], [], {}
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ("GLOBAL", "INST"):
                names.append(arg.replace(" ", ".", 1))
            elif isinstance(arg, str) and opcode.name.endswith("UNICODE"):
                strings.append(arg)
            elif opcode.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                memo[arg] = strings[-1]
            elif opcode.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
                strings.append(memo[arg])
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
            elif opcode.name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
    except Exception:  # noqa: BLE001 - a malformed pickle: report what was found so far
        pass
    return names


def _unsafe_globals_by_disassembly(local_path):
    """Globals in a torch zip checkpoint that torch would refuse (best effort)."""
    try:
        with zipfile.ZipFile(local_path) as archive:
            pkl = [n for n in archive.namelist() if n.endswith("data.pkl")]
            if not pkl:
                return []
            names = _pickle_globals(io.BytesIO(archive.read(pkl[0])))
    except Exception:  # noqa: BLE001 - legacy (non-zip) format or unreadable
        return []
    unpickler = getattr(torch.serialization, "_weights_only_unpickler", None)
    try:  # torch's own tables (private, hence the caution)
        allowed = set(unpickler._get_allowed_globals())
        allowed.update(unpickler._get_user_allowed_globals())
    except Exception:  # noqa: BLE001 - without them, name nothing rather than guess
        return []
    return [n for n in dict.fromkeys(names) if n not in allowed]


def _unsafe_error(path, exc):
    message = str(exc)
    name = _offending_global_from_message(message)
    if name is None:
        found = _unsafe_globals_by_disassembly(_local_path(path))
        name = found[0] if found else None
    numpy_reason = re.search(r"numpy data that fairseq checkpoints never hold: ([^\n]*)", message)
    if name is not None:
        what = f"the global {name}"
    elif numpy_reason:
        what = numpy_reason.group(1)
    else:
        what = "pickle instructions that torch's weights-only loader does not accept"
    return UnsafeCheckpointError(
        f"refused to load checkpoint {path}: it contains {what}, which fairseq "
        "checkpoints never contain and which could execute code when loaded"
    )


def _raised_inside_torch_load(exc):
    torch_files = {
        os.path.normcase(os.path.abspath(m.__file__))
        for m in (torch.serialization, getattr(torch, "_weights_only_unpickler", None))
        if m is not None and getattr(m, "__file__", None)
    }
    tb = exc.__traceback__
    while tb is not None:
        filename = os.path.normcase(os.path.abspath(tb.tb_frame.f_code.co_filename))
        if filename in torch_files:
            return True
        tb = tb.tb_next
    return False


def _file_error(path, exc):
    if isinstance(exc, FileNotFoundError):
        reason = "no such file"
    elif isinstance(exc, IsADirectoryError):
        reason = "it is a directory, not a file"
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    elif isinstance(exc, EOFError):
        reason = "it is empty or truncated"
    else:
        reason = "it is truncated, corrupt or not a PyTorch checkpoint"
        # torch's own wording for I/O and zip errors is short and useful; its
        # unpickler messages are long and advise unsafe loading, so they are left out
        detailed = (OSError, RuntimeError, TypeError, AttributeError, ValueError, IndexError)
        if isinstance(exc, detailed) and not isinstance(exc, pickle.UnpicklingError):
            detail = _first_sentence(str(exc))
            reason += f" ({type(exc).__name__}: {detail})" if detail else ""
    return CheckpointFileError(f"cannot read checkpoint {path}: {reason}{_recovery_hint(path)}")


def _first_sentence(text, limit=120):
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
        return ("; no other checkpoint in that folder to resume from: delete it to train "
                "from scratch")
    choices = " or ".join(os.path.join(folder, n) for n in candidates)
    return (f"; to resume, pass fairseq-train --restore-file {choices} "
            "(or delete it to train from scratch)")


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) from "
    r"checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)"
)


def _size_mismatch_error(path, exc, data=None):
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
    data = f" ({data})" if data else ""
    for name, saved, here in found:
        if "embed_tokens" in name or "output_projection" in name:
            saved_rows, here_rows = saved.split(",")[0].strip(), here.split(",")[0].strip()
            return CheckpointFileError(
                f"checkpoint {path} does not fit this data{data}: its dictionary has {saved_rows} "
                f"entries ({name}), the data's dictionary has {here_rows}; the checkpoint was "
                "trained on other data (another corpus, vocabulary or BPE): use the data-bin it "
                "was trained with"
            )
    name, saved, here = found[0]
    return CheckpointFileError(
        f"checkpoint {path} does not fit the model built here: {name} has shape [{saved}] "
        f"in the checkpoint and [{here}] here (other architecture or size flags)"
    )


def _task_data(task):
    return getattr(getattr(task, "cfg", None), "data", None) or getattr(getattr(task, "args", None), "data", None)


# --------------------------------------------------------------------------------------
# Code hidden in config strings
# --------------------------------------------------------------------------------------
#
# The unpickler cannot see this one: fairseq builds models, tasks and optimizers by
# calling eval() on string fields of the checkpoint's own config (utils.eval_str_list on
# adaptive_softmax_cutoff in TransformerDecoder, eval_str_dict on xformers_att_config in
# MultiheadAttention, eval(args.encoder_layers) in fconv, eval(cfg.conv_feature_layers)
# in wav2vec/hubert, ...). A checkpoint made only of allow-listed types would therefore
# still run code in fairseq-generate or the hub interface. Legitimate values of those
# fields are literals ("(0.9, 0.98)", "[(512, 10, 5)] + [(512, 3, 2)] * 4"), and an
# expression can do nothing without a call, so in those fields any call is refused. In
# every other field (paths and names, which may well read "runs (old)") only what an
# attack needs is refused: dunder names, and calls of builtins or of attributes.

# The config fields that fairseq 0.12 passes to eval(), directly or through
# utils.eval_str_list / eval_str_dict / eval_bool.
_EVALUATED_FIELDS = frozenset(
    """adafactor_eps adam_betas adamax_betas adaptive_input_cutoff adaptive_softmax_cutoff
    character_filters conv_aggregator_layers conv_dec_config conv_feature_layers
    conv_layers decoder_attention decoder_layers decoder_zero_init downsample
    encoder_attention encoder_layers feature_encoder_spec gated_attention input_layers
    lamb_betas left_pad_source left_pad_target model_overrides pipeline_balance
    pipeline_decoder_balance pipeline_decoder_devices pipeline_devices
    pipeline_encoder_balance pipeline_encoder_devices pretrained project_input
    self_attention transformer_context transformer_dec_config transformer_enc_config
    transformer_sampling vggblock_enc_config wer_args xformers_att_config""".split()
)
_BUILTIN_NAMES = frozenset(dir(builtins))


def _holds_code(text, evaluated=True):
    """Whether ``text``, given to eval(), could do something (see above)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if "(" not in text and "__" not in text:  # fast path: no call, no dunder possible
        return False
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False  # eval() cannot run it either
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return True
        if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return True
        if isinstance(node, ast.Call):
            if evaluated:
                return True
            if not isinstance(node.func, ast.Name) or node.func.id in _BUILTIN_NAMES:
                return True
    return False


def _config_strings(obj, where, field, seen, depth=0):
    """(dotted key, field name, text) for every string in a config; runs no resolvers."""
    if isinstance(obj, (str, bytes)):
        yield where, field, obj
        return
    if depth > 64 or id(obj) in seen:  # pickles can be self-referential
        return
    seen.add(id(obj))
    if OmegaConf.is_config(obj):
        obj = OmegaConf.to_container(obj, resolve=False)
    if isinstance(obj, argparse.Namespace):
        obj = vars(obj)
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _config_strings(value, f"{where}.{key}", key, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _config_strings(value, f"{where}[{i}]", field, seen, depth + 1)


def _refuse_code_in_config(path, state):
    if not isinstance(state, dict):
        return
    for top in ("cfg", "args"):
        for where, field, text in _config_strings(state.get(top), top, top, set()):
            evaluated = field in _EVALUATED_FIELDS
            if _holds_code(text, evaluated):
                snippet = text if len(text) <= 60 else text[:57] + "..."
                runs = ("fairseq would run with eval() when building the model" if evaluated
                        else "would run wherever that field is given to eval()")
                raise UnsafeCheckpointError(
                    f"refused to load checkpoint {path}: its config field {where} holds "
                    f"Python code ({snippet!r}), which fairseq checkpoints never contain "
                    f"and which {runs}"
                )


# --------------------------------------------------------------------------------------
# The wrapper around fairseq.checkpoint_utils.load_checkpoint_to_cpu
# --------------------------------------------------------------------------------------

_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


@contextlib.contextmanager
def _weights_only_forced():
    """Make fairseq's plain ``torch.load(f, map_location=...)`` weights-only.

    That is torch's default since 2.6, but the environment can ask torch for full
    unpickling; forcing weights-only here makes torch refuse such a request outright
    (the wrapper reports it) instead of unpickling a checkpoint without restrictions.
    """
    saved = os.environ.get(_FORCE_WEIGHTS_ONLY)
    os.environ[_FORCE_WEIGHTS_ONLY] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(_FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[_FORCE_WEIGHTS_ONLY] = saved


def _unrestricted_load_requested(exc):
    """torch's refusal when the environment both forces and forbids weights-only loading."""
    return isinstance(exc, RuntimeError) and "WEIGHTS_ONLY_LOAD" in str(exc)


def _local_path(path):
    try:
        from fairseq.file_io import PathManager

        return PathManager.get_local_path(path)
    except Exception:  # noqa: BLE001 - only used to inspect the file for a message
        return path


def _make_safe_loader(original):
    @functools.wraps(original)
    def safe_load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        if not _torch_loads_weights_only_by_default():  # pragma: no cover
            raise UnsafeCheckpointError(
                f"refused to load checkpoint {path}: torch {torch.__version__} would "
                "unpickle it with no restrictions; install torch >= 2.6"
            )
        allow_fairseq_checkpoint_types()
        try:
            with _weights_only_forced():
                state = original(
                    path, arg_overrides=arg_overrides, load_on_all_ranks=load_on_all_ranks
                )
        except RealFormerError:
            raise
        except pickle.UnpicklingError as exc:
            if not _raised_inside_torch_load(exc):
                raise
            # torch.save writes zip files, so a refusal there is about content; in a
            # legacy (pre-1.6) file it may just as well be garbage
            if _is_zip(path) or _offending_global_from_message(str(exc)):
                raise _unsafe_error(path, exc) from exc
            raise _file_error(path, exc) from exc
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise _file_error(path, exc) from exc
        except (EOFError, OSError, RuntimeError, KeyError, ValueError, TypeError,
                AttributeError, IndexError, zipfile.BadZipFile) as exc:
            # e.g. a truncated zip (OSError), an empty file (EOFError), text (KeyError),
            # or a malformed pickle that the unpickler trips over (TypeError, ...)
            if _unrestricted_load_requested(exc):
                raise UnsafeCheckpointError(
                    f"refused to load checkpoint {path}: the environment asks torch to "
                    f"unpickle checkpoints without weights-only restrictions ({exc})"
                ) from exc
            if _raised_inside_torch_load(exc):
                raise _file_error(path, exc) from exc
            raise
        _refuse_code_in_config(path, state)
        for hook in AFTER_LOAD_HOOKS:
            hook(state, path)
        return state

    safe_load_checkpoint_to_cpu.__realformer_safe__ = True
    return safe_load_checkpoint_to_cpu


def _is_zip(path):
    try:
        return zipfile.is_zipfile(_local_path(path))
    except Exception:  # noqa: BLE001
        return False


def _make_safe_ensemble_loader(original):
    """fairseq checks that the file exists before loading; make that a one-liner too."""

    @functools.wraps(original)
    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        try:
            return original(filenames, *args, **kwargs)
        except RealFormerError:
            raise
        except OSError as exc:
            prefix = "Model file not found: "
            if str(exc).startswith(prefix):
                missing = str(exc)[len(prefix):]
                raise CheckpointFileError(
                    f"cannot read checkpoint {missing}: no such file"
                ) from exc
            raise
        except RuntimeError as exc:
            paths = filenames if isinstance(filenames, (list, tuple)) else [filenames]
            task = kwargs.get("task", args[1] if len(args) > 1 else None)
            error = _size_mismatch_error(",".join(map(str, paths)), exc, _task_data(task))
            if error is None:
                raise
            raise error from exc

    load_model_ensemble_and_task.__realformer_safe__ = True
    return load_model_ensemble_and_task


def _make_trainer_loader(original):
    """fairseq-train --restore-file / --finetune-from-model / a resume: parameters that do
    not fit (fairseq re-raises them as "Cannot load model parameters ...") in one line."""

    @functools.wraps(original)
    def load_checkpoint(self, filename, *args, **kwargs):
        try:
            return original(self, filename, *args, **kwargs)
        except RealFormerError:
            raise
        except Exception as exc:  # noqa: BLE001 - fairseq raises a bare Exception here
            error = _size_mismatch_error(filename, exc, _task_data(getattr(self, "task", None)))
            if error is None:
                raise
            raise error from exc

    load_checkpoint.__realformer_safe__ = True
    return load_checkpoint


def install_safe_checkpoint_loading():
    """Allow-list fairseq's types and wrap fairseq's checkpoint loader (idempotent)."""
    allow_fairseq_checkpoint_types()
    from fairseq import checkpoint_utils

    for name, make in (
        ("load_checkpoint_to_cpu", _make_safe_loader),
        ("load_model_ensemble_and_task", _make_safe_ensemble_loader),
    ):
        current = getattr(checkpoint_utils, name)
        if not getattr(current, "__realformer_safe__", False):
            setattr(checkpoint_utils, name, make(current))
    from fairseq.trainer import Trainer

    if not getattr(Trainer.load_checkpoint, "__realformer_safe__", False):
        Trainer.load_checkpoint = _make_trainer_loader(Trainer.load_checkpoint)


def safe_load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """``fairseq.checkpoint_utils.load_checkpoint_to_cpu``, weights-only, clear errors."""
    install_safe_checkpoint_loading()
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(
        path, arg_overrides=arg_overrides, load_on_all_ranks=load_on_all_ranks
    )


install = install_safe_checkpoint_loading
