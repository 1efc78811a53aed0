"""Read TensorFlow (V2 "tensor bundle") checkpoints with the standard library and NumPy.

A checkpoint ``PREFIX`` written by ``tf.train.Saver`` / ``tf.train.Checkpoint`` is

* ``PREFIX.index``: a LevelDB-style SSTable (TensorFlow's ``core/lib/io/table``) whose
  keys are variable names and whose values are serialized ``BundleEntryProto`` messages
  (dtype, shape, shard, offset, size, masked CRC32C of the bytes); the empty key holds
  the ``BundleHeaderProto`` (number of shards, endianness). TensorFlow always writes
  this table uncompressed (``tensor_bundle.cc``: "the metadata file is small").
* ``PREFIX.data-SSSSS-of-NNNNN``: the raw little-endian tensor bytes, back to back.

This module is what the Google checkpoint converter reads with, so that converting never
needs TensorFlow. It has no dependency beyond NumPy and imports nothing from fairseq or
this package (the fixture script loads it by path inside a TensorFlow environment).

Verified against TensorFlow: ``tests/fixtures/google_realformer/make_fixture.py`` writes a
checkpoint with ``tf.compat.v1.train.Saver`` and records, from TensorFlow's own reader
(``tf.train.load_checkpoint``), every variable's dtype, shape and SHA-256;
``tests/test_google_checkpoint.py`` checks that this reader returns the same for all of
them, that the stored CRC32C checksums verify, and that a flipped byte is reported.
"""

import os
import struct
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["TFCheckpoint", "TensorFlowCheckpoint", "open_checkpoint", "READERS", "TFCheckpointError", "Entry",
           "crc32c", "find_checkpoint_prefix"]


class TFCheckpointError(ValueError):
    """A file that is not a readable TensorFlow V2 checkpoint (message names the file)."""


# --------------------------------------------------------------------------------------
# CRC32C (Castagnoli), as TensorFlow's core/lib/hash/crc32c
# --------------------------------------------------------------------------------------

_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _byte_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(_POLY), t >> 1).astype(np.uint32)
    return t


_TABLE = _byte_table()
_TABLE_LIST = [int(v) for v in _TABLE]


class _ZeroBytesOperator:
    """The linear map "register after feeding n zero bytes" (no pre/post inversion),
    applied through four byte-indexed tables."""

    def __init__(self, columns: List[int]):
        self.columns = columns  # image of bit k, k = 0..31
        values = np.arange(256)
        self.tables = []
        for b in range(4):
            t = np.zeros(256, dtype=np.uint64)
            for j in range(8):
                t ^= np.where((values >> j) & 1, np.uint64(columns[8 * b + j]), np.uint64(0))
            self.tables.append([int(v) for v in t])

    def __call__(self, x: int) -> int:
        t0, t1, t2, t3 = self.tables
        return t0[x & 0xFF] ^ t1[(x >> 8) & 0xFF] ^ t2[(x >> 16) & 0xFF] ^ t3[x >> 24]

    def then(self, other: "_ZeroBytesOperator") -> "_ZeroBytesOperator":
        """``other`` after ``self``."""
        return _ZeroBytesOperator([other(c) for c in self.columns])


_ONE_ZERO_BYTE = _ZeroBytesOperator([_TABLE_LIST[(1 << k) & 0xFF] ^ ((1 << k) >> 8) for k in range(32)])
_POWERS = [_ONE_ZERO_BYTE]  # operators for 2**i zero bytes


def _zero_bytes(n: int) -> Optional[_ZeroBytesOperator]:
    op = None
    i = 0
    while n:
        while len(_POWERS) <= i:
            _POWERS.append(_POWERS[-1].then(_POWERS[-1]))
        if n & 1:
            op = _POWERS[i] if op is None else op.then(_POWERS[i])
        n >>= 1
        i += 1
    return op


def _raw_serial(register: int, data) -> int:
    table = _TABLE_LIST
    for b in bytes(data):
        register = table[(register ^ b) & 0xFF] ^ (register >> 8)
    return register


def crc32c(data) -> int:
    """CRC32C of ``data`` (bytes-like). Long inputs are split into chunks whose registers
    NumPy advances side by side, then combined (CRC is linear over GF(2))."""
    view = memoryview(data).cast("B")
    n = len(view)
    if n < 1 << 14:
        return _raw_serial(0xFFFFFFFF, view) ^ 0xFFFFFFFF
    chunks = min(1 << 16, n >> 10)
    length = -(-n // chunks)
    # leading zero bytes leave a zero register unchanged: pad in front
    padded = np.zeros(chunks * length, dtype=np.uint8)
    padded[chunks * length - n:] = np.frombuffer(view, dtype=np.uint8)
    columns = np.ascontiguousarray(padded.reshape(chunks, length).T)  # [length, chunks]
    registers = np.zeros(chunks, dtype=np.uint32)
    for row in columns:
        registers = _TABLE[(registers ^ row) & 0xFF] ^ (registers >> 8)
    shift = _zero_bytes(length)
    raw = 0
    for r in registers.tolist():
        raw = shift(raw) ^ r
    # the standard CRC starts from 0xFFFFFFFF: add that start, advanced over n bytes
    return raw ^ _zero_bytes(n)(0xFFFFFFFF) ^ 0xFFFFFFFF


def unmask_crc(masked: int) -> int:
    """TensorFlow stores ``Mask(crc) = rotate_right(crc, 15) + 0xa282ead8``."""
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# --------------------------------------------------------------------------------------
# protobuf wire format (the few messages of tensor_bundle.proto)
# --------------------------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[Tuple[int, int, object]]:
    """``(field number, wire type, value)``: ints for varint/fixed, bytes for length-delimited."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated protobuf message")
        yield number, wire, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# tensorflow/core/framework/types.proto -> NumPy (bfloat16 is widened to float32 on read)
_DTYPES = {
    1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("u1"), 5: np.dtype("<i2"),
    6: np.dtype("i1"), 9: np.dtype("<i8"), 10: np.dtype("?"), 14: np.dtype("<u2"), 17: np.dtype("<u2"),
    19: np.dtype("<f2"), 22: np.dtype("<u4"), 23: np.dtype("<u8"),
}
_DTYPE_NAMES = {1: "float32", 2: "float64", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string",
                9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 19: "float16", 21: "variant",
                22: "uint32", 23: "uint64"}
_BFLOAT16 = 14


class Entry(NamedTuple):
    """One variable's ``BundleEntryProto``."""

    dtype: int  # TensorFlow DataType enum value
    shape: Tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: Optional[int]  # masked, as stored
    sliced: bool  # a partitioned variable (stored as slices)

    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES.get(self.dtype, f"dtype {self.dtype}")


def _parse_entry(buf: bytes) -> Entry:
    dtype = shard = offset = size = 0
    crc = None
    shape: List[int] = []
    sliced = False
    for number, _, value in _fields(buf):
        if number == 1:
            dtype = value
        elif number == 2:
            for n, _, dim in _fields(value):
                if n == 2:
                    size_of_dim = 0
                    for dn, _, dv in _fields(dim):
                        if dn == 1:
                            size_of_dim = _int64(dv)
                    shape.append(size_of_dim)
        elif number == 3:
            shard = value
        elif number == 4:
            offset = value
        elif number == 5:
            size = value
        elif number == 6:
            crc = value
        elif number == 7:
            sliced = True
    return Entry(dtype, tuple(shape), shard, offset, size, crc, sliced)


def _parse_header(buf: bytes) -> Tuple[int, int]:
    num_shards, endianness = 1, 0
    for number, _, value in _fields(buf):
        if number == 1:
            num_shards = value
        elif number == 2:
            endianness = value
    return num_shards, endianness


# --------------------------------------------------------------------------------------
# SSTable (core/lib/io/table): footer -> index block -> data blocks -> entries
# --------------------------------------------------------------------------------------

_FOOTER_SIZE = 48
_TABLE_MAGIC = 0xDB4775248B80FB57
_BLOCK_TRAILER = 5  # compression type byte + masked CRC32C


def _block_handle(buf: bytes, pos: int) -> Tuple[Tuple[int, int], int]:
    offset, pos = _varint(buf, pos)
    size, pos = _varint(buf, pos)
    return (offset, size), pos


def _read_block(table: bytes, handle: Tuple[int, int]) -> bytes:
    offset, size = handle
    if offset + size + _BLOCK_TRAILER > len(table):
        raise ValueError("block past the end of the file")
    contents = table[offset:offset + size]
    kind = table[offset + size]
    stored = struct.unpack_from("<I", table, offset + size + 1)[0]
    if crc32c(table[offset:offset + size + 1]) != unmask_crc(stored):
        raise ValueError("block checksum mismatch")
    if kind != 0:
        raise ValueError(f"compressed block (type {kind}); TensorFlow writes checkpoint indexes uncompressed")
    return contents


def _block_entries(block: bytes) -> Iterator[Tuple[bytes, bytes]]:
    if len(block) < 4:
        raise ValueError("block too short")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 * (restarts + 1)
    if end < 0:
        raise ValueError("bad restart array")
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        value_length, pos = _varint(block, pos)
        if shared > len(key) or pos + unshared + value_length > end:
            raise ValueError("corrupt block entry")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + value_length]
        pos += value_length


def _table_entries(table: bytes) -> Iterator[Tuple[bytes, bytes]]:
    if len(table) < _FOOTER_SIZE:
        raise ValueError("file too short for an SSTable footer")
    footer = table[-_FOOTER_SIZE:]
    lo, hi = struct.unpack_from("<II", footer, _FOOTER_SIZE - 8)
    if (hi << 32) | lo != _TABLE_MAGIC:
        raise ValueError("no SSTable magic number at the end")
    _metaindex, pos = _block_handle(footer, 0)
    index, _ = _block_handle(footer, pos)
    for _, handle_bytes in _block_entries(_read_block(table, index)):
        handle, _ = _block_handle(handle_bytes, 0)
        yield from _block_entries(_read_block(table, handle))


# --------------------------------------------------------------------------------------
# the checkpoint
# --------------------------------------------------------------------------------------


def find_checkpoint_prefix(path: str) -> str:
    """``PREFIX`` from ``PREFIX``, ``PREFIX.index`` or a ``PREFIX.data-*`` file name."""
    path = os.fspath(path)
    if path.endswith(".index"):
        return path[: -len(".index")]
    if ".data-" in os.path.basename(path):
        return path[: path.rindex(".data-")]
    return path


class TFCheckpoint:
    """A TensorFlow V2 checkpoint: ``names()``, ``entry(name)``, ``read(name)``.

    Only the ``.index`` file is read on opening; ``read`` seeks to one tensor's bytes in
    its ``.data-*`` shard and (``verify=True``) checks them against the stored CRC32C.
    """

    def __init__(self, path: str):
        self.prefix = find_checkpoint_prefix(path)
        self.index_path = self.prefix + ".index"
        try:
            with open(self.index_path, "rb") as f:
                table = f.read()
        except OSError as e:
            raise TFCheckpointError(f"cannot read TensorFlow checkpoint index {self.index_path}: {e.strerror}") from e
        self.entries: Dict[str, Entry] = {}
        header = None
        try:
            for key, value in _table_entries(table):
                if key == b"":
                    header = _parse_header(value)
                else:
                    self.entries[key.decode("utf-8")] = _parse_entry(value)
        except (ValueError, struct.error, UnicodeDecodeError) as e:
            raise TFCheckpointError(f"{self.index_path} is not a TensorFlow V2 checkpoint index ({e})") from e
        if header is None:
            raise TFCheckpointError(f"{self.index_path} has no bundle header: not a TensorFlow V2 checkpoint index")
        self.num_shards, endianness = header
        if endianness != 0:
            raise TFCheckpointError(f"{self.index_path}: big-endian checkpoints are not supported")

    def names(self) -> List[str]:
        return sorted(self.entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def entry(self, name: str) -> Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise TFCheckpointError(f"{self.index_path} has no variable {name!r}") from None

    def data_path(self, shard_id: int) -> str:
        return f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"

    def read(self, name: str, verify: bool = True) -> np.ndarray:
        """The variable as a NumPy array (bfloat16 widened to float32)."""
        entry = self.entry(name)
        if entry.sliced:
            raise TFCheckpointError(f"{self.index_path}: {name} is a partitioned variable, which is not supported")
        if entry.dtype not in _DTYPES:
            raise TFCheckpointError(f"{self.index_path}: {name} has unsupported type {entry.dtype_name}")
        dtype = _DTYPES[entry.dtype]
        count = int(np.prod(entry.shape, dtype=np.int64))
        if entry.size != count * dtype.itemsize:
            raise TFCheckpointError(
                f"{self.index_path}: {name} has {entry.size} bytes for shape {list(entry.shape)} {entry.dtype_name}"
            )
        path = self.data_path(entry.shard_id)
        try:
            with open(path, "rb") as f:
                f.seek(entry.offset)
                data = f.read(entry.size)
        except OSError as e:
            raise TFCheckpointError(f"cannot read {path}: {e.strerror}") from e
        if len(data) != entry.size:
            raise TFCheckpointError(
                f"{path} is truncated: {name} needs bytes {entry.offset}..{entry.offset + entry.size}")
        if verify and entry.crc32c is not None and crc32c(data) != unmask_crc(entry.crc32c):
            raise TFCheckpointError(f"{path}: checksum mismatch in {name} (corrupt or incomplete file)")
        array = np.frombuffer(data, dtype=dtype).reshape(entry.shape)
        if entry.dtype == _BFLOAT16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array.astype(dtype.newbyteorder("=") if entry.dtype != _BFLOAT16 else np.float32, copy=True)


class TensorFlowCheckpoint:
    """The same interface over TensorFlow's own reader (``tf.train.load_checkpoint``), for
    users who have TensorFlow and prefer the maintained implementation (``--reader
    tensorflow``; ``pip install tensorflow-cpu``). TensorFlow is imported here only, when
    this class is used; it checks every tensor's CRC32C itself (``verify`` is ignored)."""

    def __init__(self, path: str):
        try:
            import tensorflow as tf
        except ImportError:
            raise TFCheckpointError(
                "--reader tensorflow needs TensorFlow (pip install tensorflow-cpu); the default "
                "--reader builtin needs nothing beyond NumPy") from None
        self.prefix = find_checkpoint_prefix(path)
        self.index_path = self.prefix + ".index"
        try:
            self._reader = tf.train.load_checkpoint(self.prefix)
        except Exception as e:  # TensorFlow raises its own error types (DataLossError, NotFoundError, ...)
            raise TFCheckpointError(f"TensorFlow cannot read {self.index_path}: {str(e).splitlines()[0]}") from e
        shapes = self._reader.get_variable_to_shape_map()
        dtypes = self._reader.get_variable_to_dtype_map()
        self.entries: Dict[str, Entry] = {
            name: Entry(dtype=int(dtypes[name].as_datatype_enum), shape=tuple(int(d) for d in shape), shard_id=0,
                        offset=0, size=0, crc32c=None, sliced=False)
            for name, shape in shapes.items()}

    names = TFCheckpoint.names
    __contains__ = TFCheckpoint.__contains__
    entry = TFCheckpoint.entry

    def read(self, name: str, verify: bool = True) -> np.ndarray:
        """The variable as a NumPy array (bfloat16 widened to float32, as the builtin reader)."""
        self.entry(name)
        try:
            array = np.asarray(self._reader.get_tensor(name))
        except Exception as e:
            raise TFCheckpointError(f"TensorFlow cannot read {name} from {self.prefix}: "
                                    f"{str(e).splitlines()[0]}") from e
        if self.entries[name].dtype == _BFLOAT16:
            array = array.astype(np.float32)
        return np.array(array, copy=True)


READERS = {"builtin": TFCheckpoint, "tensorflow": TensorFlowCheckpoint}


def open_checkpoint(path: str, reader: str = "builtin"):
    """A checkpoint opened with ``reader``: ``builtin`` (this module, NumPy only; the
    default) or ``tensorflow`` (TensorFlow's own reader, when TensorFlow is installed)."""
    if reader not in READERS:
        raise TFCheckpointError(f"--reader must be one of {', '.join(READERS)}, not {reader!r}")
    return READERS[reader](path)
