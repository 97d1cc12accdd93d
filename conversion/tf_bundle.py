"""Read a TensorFlow checkpoint (tensor bundle V2) in pure Python, without TensorFlow.

A checkpoint ``PREFIX`` is two files:

* ``PREFIX.index``: an SSTable (LevelDB table format) whose keys are the variable names and whose values
  are serialized ``BundleEntryProto`` messages (dtype, shape, shard, offset, size, crc32c). The entry with
  the empty key is a ``BundleHeaderProto`` (number of shards, endianness).
* ``PREFIX.data-0000i-of-0000N``: the raw little-endian tensor bytes, concatenated.

Only what TensorFlow's ``BundleWriter`` produces is supported: uncompressed blocks, numeric dtypes,
whole (unsliced) tensors. Anything else is refused with a ``TFBundleError`` that says what it met.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

__all__ = ["TFBundleError", "BundleEntry", "TFCheckpointReader", "masked_crc32c"]

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_LEN = 48
_BLOCK_TRAILER_LEN = 5

# tensorflow/core/framework/types.proto
_DTYPES = {
    1: np.dtype("<f4"),  # DT_FLOAT
    2: np.dtype("<f8"),  # DT_DOUBLE
    3: np.dtype("<i4"),  # DT_INT32
    4: np.dtype("u1"),  # DT_UINT8
    5: np.dtype("<i2"),  # DT_INT16
    6: np.dtype("i1"),  # DT_INT8
    9: np.dtype("<i8"),  # DT_INT64
    10: np.dtype("?"),  # DT_BOOL
    14: "bfloat16",  # DT_BFLOAT16, returned as float32
    17: np.dtype("<u2"),  # DT_UINT16
    19: np.dtype("<f2"),  # DT_HALF
    22: np.dtype("<u4"),  # DT_UINT32
    23: np.dtype("<u8"),  # DT_UINT64
}
_DTYPE_NAMES = {7: "DT_STRING", 8: "DT_COMPLEX64", 18: "DT_COMPLEX128", 20: "DT_RESOURCE", 21: "DT_VARIANT"}


class TFBundleError(ValueError):
    """The checkpoint is not a tensor bundle this reader understands."""


@dataclass(frozen=True)
class BundleEntry:
    name: str
    dtype: int
    shape: tuple
    shard_id: int
    offset: int
    size: int
    crc32c: int | None


# --------------------------------------------------------------------------------------------- protobuf
def _varint(buf, pos):
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise TFBundleError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise TFBundleError("varint too long")


def _proto_fields(buf):
    """Yield (field_number, wire_type, value) of a serialized protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value = struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value = bytes(buf[pos : pos + n])
            if len(value) != n:
                raise TFBundleError("truncated length-delimited field")
            pos += n
        elif wire == 5:
            value = struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        else:
            raise TFBundleError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def _parse_shape(buf):
    # TensorShapeProto: repeated Dim dim = 2 (Dim: int64 size = 1); bool unknown_rank = 3
    dims = []
    for field, _, value in _proto_fields(buf):
        if field == 2:
            size = 0
            for f2, _, v2 in _proto_fields(value):
                if f2 == 1:
                    size = v2 - (1 << 64) if v2 >= 1 << 63 else v2
            dims.append(size)
        elif field == 3 and value:
            raise TFBundleError("tensor of unknown rank")
    return tuple(dims)


def _parse_entry(name, buf):
    # BundleEntryProto: dtype=1, shape=2, shard_id=3, offset=4, size=5, crc32c=6 (fixed32), slices=7
    dtype, shape, shard, offset, size, crc = 0, (), 0, 0, 0, None
    for field, _, value in _proto_fields(buf):
        if field == 1:
            dtype = value
        elif field == 2:
            shape = _parse_shape(value)
        elif field == 3:
            shard = value
        elif field == 4:
            offset = value
        elif field == 5:
            size = value
        elif field == 6:
            crc = value
        elif field == 7:
            raise TFBundleError(f"{name}: partitioned (sliced) variables are not supported")
    return BundleEntry(name, dtype, shape, shard, offset, size, crc)


# --------------------------------------------------------------------------------------------- crc32c
def _make_crc_table():
    poly = 0x82F63B78
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = None


def _crc32c_py(data):
    global _CRC_TABLE
    if _CRC_TABLE is None:
        _CRC_TABLE = _make_crc_table()
    t = _CRC_TABLE
    c = 0xFFFFFFFF
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _fast_crc32c():
    try:  # optional accelerators, used when installed
        import google_crc32c

        return lambda data: google_crc32c.value(bytes(data))
    except ImportError:
        pass
    try:
        import crc32c as _c

        return lambda data: _c.crc32c(data)
    except ImportError:
        return None


def masked_crc32c(data, crc_fn=None):
    crc = (crc_fn or _crc32c_py)(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --------------------------------------------------------------------------------------------- SSTable
def _read_block(data, offset, size):
    if offset + size + _BLOCK_TRAILER_LEN > len(data):
        raise TFBundleError("block handle points past the end of the index file")
    ctype = data[offset + size]
    if ctype != 0:
        raise TFBundleError(f"compressed index block (type {ctype}) is not supported")
    return data[offset : offset + size]


def _block_entries(block):
    """Yield (key, value) of one table block (prefix-compressed keys, restart array at the end)."""
    if len(block) < 4:
        raise TFBundleError("index block too short")
    num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise TFBundleError("corrupt index block (restart array)")
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos)
        non_shared, pos = _varint(block, pos)
        value_len, pos = _varint(block, pos)
        if shared > len(key):
            raise TFBundleError("corrupt index block (shared key prefix)")
        key = key[:shared] + bytes(block[pos : pos + non_shared])
        pos += non_shared
        value = bytes(block[pos : pos + value_len])
        pos += value_len
        yield key, value


def _read_table(index_bytes):
    if len(index_bytes) < _FOOTER_LEN:
        raise TFBundleError("index file too short to be an SSTable")
    footer = index_bytes[-_FOOTER_LEN:]
    magic = struct.unpack_from("<Q", footer, _FOOTER_LEN - 8)[0]
    if magic != _TABLE_MAGIC:
        raise TFBundleError("not a TensorFlow tensor-bundle index (bad SSTable magic)")
    _, pos = _varint(footer, 0)  # metaindex offset
    _, pos = _varint(footer, pos)  # metaindex size
    idx_off, pos = _varint(footer, pos)
    idx_size, pos = _varint(footer, pos)
    index_block = _read_block(index_bytes, idx_off, idx_size)
    for _, handle in _block_entries(index_block):
        off, p = _varint(handle, 0)
        size, _ = _varint(handle, p)
        yield from _block_entries(_read_block(index_bytes, off, size))


# --------------------------------------------------------------------------------------------- reader
class TFCheckpointReader:
    """``TFCheckpointReader(prefix)``: ``.entries`` (name -> BundleEntry), ``.get(name)`` -> numpy array.

    ``verify_checksums``: "auto" checks crc32c with a fast library when one is installed, otherwise only
    tensors up to 4 MiB in pure Python; "always" checks all (slow without a library); "never" skips.
    """

    def __init__(self, prefix, verify_checksums="auto"):
        prefix = os.fspath(prefix)
        for suffix in (".index", ".meta"):
            if prefix.endswith(suffix):
                prefix = prefix[: -len(suffix)]
        if ".data-" in os.path.basename(prefix):
            prefix = prefix[: prefix.rindex(".data-")]
        self.prefix = prefix
        index_path = prefix + ".index"
        if not os.path.isfile(index_path):
            raise FileNotFoundError(f"no TensorFlow checkpoint index at {index_path}")
        with open(index_path, "rb") as f:
            index_bytes = f.read()
        self.num_shards = 1
        self.entries = {}
        for key, value in _read_table(index_bytes):
            if key == b"":  # BundleHeaderProto: num_shards=1, endianness=2 (0 little), version=3
                for field, _, v in _proto_fields(value):
                    if field == 1:
                        self.num_shards = v
                    elif field == 2 and v != 0:
                        raise TFBundleError("big-endian checkpoints are not supported")
                continue
            name = key.decode("utf-8")
            self.entries[name] = _parse_entry(name, value)
        self._maps = {}
        self.verify_checksums = verify_checksums
        self._crc_fast = _fast_crc32c()

    def __contains__(self, name):
        return name in self.entries

    def keys(self):
        return list(self.entries)

    def shape(self, name):
        return self.entries[name].shape

    def _shard(self, shard_id):
        if shard_id not in self._maps:
            path = f"{self.prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}"
            if not os.path.isfile(path):
                raise FileNotFoundError(f"missing checkpoint data shard {path}")
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._maps[shard_id] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        return self._maps[shard_id]

    def get(self, name):
        """The tensor ``name`` as a numpy array (a copy, native byte order)."""
        if name not in self.entries:
            raise KeyError(f"{name!r} is not in checkpoint {self.prefix}")
        e = self.entries[name]
        if e.dtype not in _DTYPES:
            kind = _DTYPE_NAMES.get(e.dtype, f"dtype enum {e.dtype}")
            raise TFBundleError(f"{name}: {kind} tensors are not supported")
        dt = _DTYPES[e.dtype]
        count = 1
        for d in e.shape:
            count *= d
        itemsize = 2 if dt == "bfloat16" else dt.itemsize
        if e.size != count * itemsize:
            raise TFBundleError(
                f"{name}: {e.size} bytes stored for shape {list(e.shape)} ({count * itemsize} expected)"
            )
        buf = self._shard(e.shard_id)
        if e.offset + e.size > len(buf):
            raise TFBundleError(f"{name}: data runs past the end of shard {e.shard_id}")
        raw = buf[e.offset : e.offset + e.size]
        self._check_crc(e, raw)
        if dt == "bfloat16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="))
        return arr.reshape(e.shape)

    def _check_crc(self, e, raw):
        if e.crc32c is None or self.verify_checksums == "never":
            return
        if self._crc_fast is not None:
            fn = self._crc_fast
        elif self.verify_checksums == "always" or len(raw) <= 4 << 20:
            fn = _crc32c_py
        else:
            return
        if masked_crc32c(raw, fn) != e.crc32c:
            raise TFBundleError(f"{e.name}: checksum mismatch, the .data file is corrupt or truncated")

    def close(self):
        for m in self._maps.values():
            if isinstance(m, mmap.mmap):
                m.close()
        self._maps = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
