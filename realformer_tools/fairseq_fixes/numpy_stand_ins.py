"""Checked stand-ins for the numpy values in fairseq checkpoints (threat 3 of
``safe_checkpoint_loading``): fairseq meters hold numpy values (``--eval-bleu``'s
``_bleu_counts`` are int64 arrays, scores ``np.float64``). The stand-ins accept fixed-size
bool/int/uint/float dtypes only, check every shape and byte count, and hand numpy nothing but
a validated dtype and raw bytes; torch's usual numpy allow-list would also accept an object
array over attacker-chosen pointers (``numpy.ndarray((1,), numpy.dtype("O"), b"AAAAAAAA")``).
A helper of ``safe_checkpoint_loading``, not a fix of its own."""

import pickle
import re

import numpy as np

try:  # numpy >= 2 (and the forward-compatibility stubs of numpy 1.26)
    from numpy._core import multiarray as _np_multiarray
except ImportError:  # pragma: no cover - numpy < 1.26
    from numpy.core import multiarray as _np_multiarray

_NUMPY_TYPECODE = re.compile(r"[iuf][1248]|b1")


def _refuse(what):
    raise pickle.UnpicklingError(f"numpy data that fairseq checkpoints never hold: {what[:80]}")


def _stand_in(obj, kind):  # by marker, not identity: a reloaded copy of this module registers its own
    return getattr(obj, "_realformer_numpy_stand_in", None) == kind


def _numeric_dtype(value):
    """A numpy dtype, if ``value`` is (a stand-in for) a fixed-size numeric one."""
    if _stand_in(type(value), "dtype"):
        return value.to_numpy()
    if isinstance(value, np.dtype) and value.kind in "biuf" and value.fields is None and value.subdtype is None:
        return value
    _refuse(f"numpy dtype {value!r}")


class NumpyDTypeStandIn:
    """``numpy.dtype`` in a checkpoint: ``numpy.dtype("f8", False, True)`` then the state
    ``(3, "<", None, None, None, -1, -1, 0)``; both checked, a real dtype only by ``to_numpy``."""

    _realformer_numpy_stand_in = "dtype"

    def __init__(self, typecode, align=False, copy=False):
        if not (isinstance(typecode, str) and _NUMPY_TYPECODE.fullmatch(typecode)):
            _refuse(f"numpy dtype {typecode!r}")
        self.typecode, self.byteorder = typecode, "="

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) >= 5 and state[1] in ("<", ">", "|", "=")
                and state[2:5] == (None, None, None)):  # no subarray, field names or fields
            _refuse(f"numpy dtype state {state!r}")
        self.byteorder = state[1]

    def to_numpy(self):
        typecode, byteorder = self.__dict__.get("typecode"), self.__dict__.get("byteorder", "=")
        if not (isinstance(typecode, str) and _NUMPY_TYPECODE.fullmatch(typecode)):
            _refuse("a numpy dtype without a type code")
        return np.dtype(typecode).newbyteorder(byteorder) if byteorder in ("<", ">") else np.dtype(typecode)


class NumericArray(np.ndarray):
    """``numpy.ndarray`` in a checkpoint: cannot be called, takes numeric dtypes and exactly
    sized raw bytes only, and pickles back as a plain ``numpy.ndarray``."""

    _realformer_numpy_stand_in = "ndarray"

    def __new__(cls, *args, **kwargs):
        _refuse("a call of numpy.ndarray")

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1):
            _refuse("a numpy array state of unexpected form")
        version, shape, dtype, is_fortran, raw = state
        dtype = _numeric_dtype(dtype)
        if not (isinstance(shape, tuple) and len(shape) <= 32 and all(type(n) is int and n >= 0 for n in shape)):
            _refuse(f"numpy array shape {shape!r}")
        if type(is_fortran) is not bool or not isinstance(raw, (bytes, bytearray)):
            _refuse("numpy array data that is not raw bytes")
        if len(raw) != int(np.prod(shape, dtype=object)) * dtype.itemsize:
            _refuse("numpy array data of the wrong size")
        np.ndarray.__setstate__(self, (version, shape, dtype, is_fortran, bytes(raw)))

    def __reduce__(self):
        return self.view(np.ndarray).__reduce__()

    def __reduce_ex__(self, protocol):
        return self.view(np.ndarray).__reduce_ex__(protocol)


def numpy_reconstruct(subtype, shape, typecode):
    """``numpy._core.multiarray._reconstruct(ndarray, (0,), b"b")`` in a checkpoint: an empty
    ``NumericArray`` made from constants (its state is checked by ``__setstate__``)."""
    if not (isinstance(subtype, type) and issubclass(subtype, np.ndarray) and _stand_in(subtype, "ndarray")):
        _refuse(f"numpy array subtype {subtype!r}")
    return _np_multiarray._reconstruct(subtype, (0,), b"b")


def numpy_scalar(dtype, raw=None):
    """``numpy._core.multiarray.scalar`` in a checkpoint (np.float64 etc.)."""
    dtype = _numeric_dtype(dtype)
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != dtype.itemsize:
        _refuse("numpy scalar data of the wrong form")
    return np.frombuffer(bytes(raw), dtype=dtype)[0]
