"""Restricted unpickling for the original Transformer-XL files: nothing in a pickle is ever executed.

``pickle.load`` runs whatever callable a file names (``os.system`` included). Here every global a pickle
asks for goes through an allow-list: tensor and storage rebuilding, a few plain containers, and the
*names* of the known classes (``mem_transformer.MemTransformerLM``, ``vocabulary.Vocab``, ``torch.nn``
layers, ...). Those classes are never imported: each is replaced by a ``PickledObject`` that only records
its class name and pickled state, so no constructor, ``__setstate__`` or ``__reduce__`` of the original
code runs. Any other global is refused with an ``UnsafePickleError`` naming it, before anything is called.

Resources are bounded too: the allow-listed constructors cannot allocate more than ``MAX_CONSTRUCTOR_BYTES``
(``bytes(10**13)`` is refused, not attempted), every tensor view is checked against the bounds of its storage
before it is built, a storage must be present in full in the file (no compressed zip entries, no size the file
does not hold).

Speed without less strictness: before the (C, fast) unpickler sees a pickle, `scan_pickle` walks its opcodes once
and refuses what the C unpickler would turn into a large allocation: a memo index beyond the size of the pickle
(the C memo is an array as long as the largest index), a string, bytes or frame longer than what is left of the
file, extension-registry and out-of-band-buffer opcodes. Every global still goes through `find_class`.

This is the project's one safe reader, with one allow-list per format: the original Transformer-XL checkpoints
(`MODULE_CLASSES`), its vocabularies (`VOCAB_CLASSES`), the `vocab.pkl` of transformers 4.x's TransfoXLTokenizer
(`TRANSFO_XL_TOKENIZER_CLASSES`); converters pass their own (`classes=`).

Supported containers: torch.save's zip format (torch >= 1.6), its legacy format (torch < 1.6, what the
2019 code wrote), and plain pickles (Python 2 protocol 2 ``cache.pkl``, transformers' ``vocab.pkl``).
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import pickle
import pickletools
import struct
import zipfile

import torch

__all__ = [
    "UnsafePickleError",
    "PickledObject",
    "ArrayStub",
    "load_torch_file",
    "load_plain_pickle",
    "MODULE_CLASSES",
    "VOCAB_CLASSES",
    "TRANSFO_XL_TOKENIZER_CLASSES",
    "scan_pickle",
    "is_torch_file",
    "check_view_bounds",
    "MAX_CONSTRUCTOR_BYTES",
]


class UnsafePickleError(pickle.UnpicklingError):
    """The file asked for something outside the allow-list or beyond the size bounds; nothing was executed."""


# The largest object an allow-listed constructor (bytes(n), bytearray(n), ...) may allocate from a number in the
# pickle. Real checkpoints never build a large object this way: their bytes are literal in the file.
MAX_CONSTRUCTOR_BYTES = 1 << 24


def _bounded(constructor):
    """`constructor` (bytes, bytearray, str, ...) refusing a numeric argument that would allocate a huge object."""

    def build(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CONSTRUCTOR_BYTES:
                raise UnsafePickleError(
                    f"refusing {constructor.__name__}({value}): more than "
                    f"{MAX_CONSTRUCTOR_BYTES} bytes from one number in the pickle"
                )
        return constructor(*args, **kwargs)

    build.__name__ = constructor.__name__
    return build


_BUILTINS = {
    "set": set,
    "frozenset": frozenset,
    "list": list,
    "dict": dict,
    "tuple": tuple,
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "bytes": _bounded(bytes),
    "bytearray": _bounded(bytearray),
    "slice": slice,
    "complex": complex,
}


class PickledObject:
    """Stand-in for an instance of an allowed class: ``cls`` ("module.Name") and ``state`` (its __dict__)."""

    def __init__(self, cls, args=()):
        self.cls = cls
        self.args = tuple(args)
        self.state = {}

    @property
    def name(self):
        return self.cls.rsplit(".", 1)[-1]

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], (dict, type(None))):
            # (instance dict, slots dict)
            merged = dict(state[0] or {})
            merged.update(state[1] or {})
            state = merged
        if not isinstance(state, dict):
            raise UnsafePickleError(f"unexpected pickled state of type {type(state).__name__} for {self.cls}")
        # Python 2 pickles read with encoding="bytes" have bytes keys
        self.state = {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in state.items()}

    def get(self, key, default=None):
        return self.state.get(key, default)

    def __getitem__(self, key):
        return self.state[key]

    def __repr__(self):
        return f"<pickled {self.cls}>"


class ArrayStub:
    """A numpy array or tensor that was present in the pickle but deliberately not materialised."""

    def __init__(self, *args):
        self.args = args
        self.state = None

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return "<array not loaded>"


def _stub_factory(*args, **kwargs):
    return ArrayStub(*args)


class _StubClass:
    """A class reference (numpy.ndarray, numpy.dtype) that may be instantiated only into an ArrayStub."""

    def __init__(self, qualname):
        self.qualname = qualname

    def __call__(self, *args, **kwargs):
        return ArrayStub(*args)

    def __new__(cls, *args, **kwargs):  # pragma: no cover - pickle passes instances, not the class
        return super().__new__(cls)


# --------------------------------------------------------------------------------------------- allow-lists
# The class names the original code pickles. Module prefixes vary with how train.py was launched.
MODULE_CLASSES = {
    "mem_transformer": {
        "MemTransformerLM",
        "AdaptiveEmbedding",
        "PositionalEmbedding",
        "PositionwiseFF",
        "RelPartialLearnableDecoderLayer",
        "RelPartialLearnableMultiHeadAttn",
        "RelLearnableDecoderLayer",
        "RelLearnableMultiHeadAttn",
        "RelMultiHeadAttn",
        "DecoderLayer",
        "MultiHeadAttn",
    },
    "proj_adaptive_softmax": {"ProjectedAdaptiveLogSoftmax"},
    "log_uniform_sampler": {"LogUniformSampler"},
    "torch.nn.modules.sparse": {"Embedding"},
    "torch.nn.modules.linear": {"Linear", "Identity"},
    "torch.nn.modules.container": {"ModuleList", "ParameterList", "Sequential", "ModuleDict", "ParameterDict"},
    "torch.nn.modules.activation": {"ReLU"},
    "torch.nn.modules.dropout": {"Dropout"},
    "torch.nn.modules.normalization": {"LayerNorm"},
}
VOCAB_CLASSES = {
    "data_utils": {"Corpus", "LMOrderedIterator", "LMShuffledIterator", "LMMultiFileIterator"},
    "vocabulary": {"Vocab"},
}
# transformers 4.x's TransfoXLTokenizer.save_vocabulary pickles the tokenizer's whole __dict__: besides the plain
# vocabulary (Counter, OrderedDict, lists, str) it names these classes, all recorded, none imported or called
# (re._compile is a function called through REDUCE: it becomes a record of its arguments, no regex is compiled).
TRANSFO_XL_TOKENIZER_CLASSES = {
    "re": {"_compile"},
    "sacremoses.normalize": {"MosesPunctNormalizer"},
    "sacremoses.tokenize": {"MosesTokenizer", "MosesDetokenizer"},
    "tokenizers": {"AddedToken"},
    "transformers.tokenization_utils": {"Trie"},
}

_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}
_TORCH_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "long": torch.int64,
    "int32": torch.int32,
    "int": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


class _StorageRef:
    def __init__(self, dtype, key, numel):
        self.dtype, self.key, self.numel = dtype, key, numel
        self.tensor = None  # flat tensor, filled in by the loader (or left None when tensors are skipped)


class _DeferredTensor:
    """A tensor view of a storage whose bytes are read after the pickle (legacy torch format)."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def materialize(self):
        flat = self.storage.tensor
        if flat is None:
            return ArrayStub()
        check_view_bounds(self.size, self.stride, self.offset, flat.numel(), self.storage.key)
        if not self.size:
            return flat[self.offset].clone()
        return torch.as_strided(flat, self.size, self.stride, self.offset).clone()


def check_view_bounds(size, stride, offset, storage_numel, key="?"):
    """A tensor view (size, stride, offset) must lie inside its storage and hold no more elements than it (a view of
    stride 0 could otherwise ask for any amount of memory); checked before `as_strided` reads anything."""
    values = [offset, *size, *stride]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UnsafePickleError(f"storage {key}: tensor size, stride and offset must be integers")
    if offset < 0 or any(v < 0 for v in size) or any(v < 0 for v in stride) or len(size) != len(stride):
        raise UnsafePickleError(
            f"storage {key}: negative or mismatched tensor size {list(size)} / stride {list(stride)} / offset {offset}"
        )
    numel = 1
    for v in size:
        numel *= v
    if numel == 0:
        return
    last = offset + sum((n - 1) * st for n, st in zip(size, stride))
    if last >= storage_numel or numel > storage_numel:
        raise UnsafePickleError(
            f"storage {key}: a tensor of size {list(size)}, stride {list(stride)} and offset "
            f"{offset} reaches past its storage of {storage_numel} elements"
        )


def _rebuild_tensor(storage, storage_offset, size, stride, *rest):
    if not isinstance(storage, _StorageRef):
        raise UnsafePickleError("tensor rebuild called on something that is not a storage")
    return _DeferredTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *rest):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    if new_type not in ("torch.Tensor", "torch.nn.parameter.Parameter"):
        raise UnsafePickleError(f"tensor subclass {new_type} is not allowed")
    if func not in (_rebuild_tensor, _rebuild_parameter):
        raise UnsafePickleError("tensor rebuild through an unknown function")
    return func(*args)


def _codecs_encode(obj, encoding="utf-8", errors="strict"):
    if encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"_codecs.encode with encoding {encoding!r} is not allowed")
    return obj.encode("latin1")


def _new_object(cls_name):
    class_ = type("PickledClass_" + cls_name.replace(".", "_"), (PickledObject,), {})

    def _new(cls, *args, **kwargs):
        return PickledObject(cls_name, args)

    class_.__new__ = _new
    class_.qualname_ = cls_name
    return class_


# ------------------------------------------------------------------------------------------- opcode scan
# Argument layout of every opcode: >= 0 fixed size; pickletools' negative codes for the variable ones.
_ARG_SIZE = {
    info.code.encode("latin1")[0]: (info.name, info.arg.n if info.arg is not None else 0)
    for info in pickletools.opcodes
}
_LENGTH_PREFIX = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, "<B"),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, "<i"),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, "<I"),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, "<Q"),
}
_REFUSED_OPCODES = {"EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER"}
# Per opcode byte: the fixed size of its argument (>= 0), or a negative code for what needs a closer look.
_SHORT, _LONG_BINPUT, _FRAME, _STOP, _LINE, _TWO_LINES, _REFUSE, _UNKNOWN = -1, -6, -7, -10, -11, -12, -13, -14
_OPCODE_KIND = [_UNKNOWN] * 256
for _code, (_name, _n) in _ARG_SIZE.items():
    if _name == "STOP":
        _OPCODE_KIND[_code] = _STOP
    elif _name in _REFUSED_OPCODES:
        _OPCODE_KIND[_code] = _REFUSE
    elif _name in ("GLOBAL", "INST"):
        _OPCODE_KIND[_code] = _TWO_LINES
    elif _name == "LONG_BINPUT":
        _OPCODE_KIND[_code] = _LONG_BINPUT
    elif _name == "FRAME":
        _OPCODE_KIND[_code] = _FRAME
    elif _n == pickletools.UP_TO_NEWLINE:
        _OPCODE_KIND[_code] = _LINE
    elif _n == pickletools.TAKEN_FROM_ARGUMENT1:
        _OPCODE_KIND[_code] = _SHORT  # one length byte, then at most 255 bytes
    else:
        _OPCODE_KIND[_code] = _n  # a fixed size (>= 0) or a 4- / 8-byte length prefix (-3 .. -5)
_OP_PUT = ord("p")


def scan_pickle(data, start=0) -> int:
    """Walks the opcodes of the pickle that starts at `data[start]` (bytes or mmap) without building anything and
    returns the offset just past its STOP. Refused with an `UnsafePickleError`: a memo index larger than the data (a
    legitimate pickler numbers its memo 0, 1, 2, ...; the C unpickler would allocate an array that long), a string,
    bytes or frame that claims more bytes than remain, the extension registry, out-of-band buffers, an unknown
    opcode, a pickle without STOP. (The loop is the hot path of reading a large vocabulary: the common opcodes,
    fixed-size and short strings, cost one table look-up each.)"""
    end = len(data)
    kinds = _OPCODE_KIND
    pos = start
    try:
        while True:
            kind = kinds[data[pos]]
            if kind >= 0:
                pos += 1 + kind
            elif kind == _SHORT:
                pos += 2 + data[pos + 1]
            elif kind == _STOP:
                if pos >= end:
                    break
                return pos + 1
            elif kind >= -5:  # a 4- or 8-byte length, then that many bytes
                size, fmt = _LENGTH_PREFIX[kind]
                (length,) = struct.unpack_from(fmt, data, pos + 1)
                pos += 1 + size
                if length < 0 or length > end - pos:
                    raise UnsafePickleError(
                        f"an argument of {length} bytes at byte {pos - size - 1} is longer than "
                        "what is left of the pickle; nothing was executed"
                    )
                pos += length
            elif kind == _LONG_BINPUT or kind == _FRAME:
                size = 4 if kind == _LONG_BINPUT else 8
                value = int.from_bytes(data[pos + 1 : pos + 1 + size], "little")
                pos += 1 + size
                if value > (end if kind == _LONG_BINPUT else end - pos):
                    what = "a memo index" if kind == _LONG_BINPUT else "a frame"
                    raise UnsafePickleError(
                        f"{what} of {value} at byte {pos - size - 1} is beyond the size of the "
                        "pickle; nothing was executed"
                    )
            elif kind == _LINE or kind == _TWO_LINES:
                op = data[pos]
                pos += 1
                for _ in range(1 if kind == _LINE else 2):
                    newline = data.find(b"\n", pos)
                    if newline < 0:
                        raise IndexError
                    if op == _OP_PUT:
                        try:
                            index = int(data[pos:newline])
                        except ValueError:
                            raise UnsafePickleError(f"a bad memo index at byte {pos - 1}") from None
                        if not 0 <= index <= end:
                            raise UnsafePickleError(
                                f"a memo index of {index} at byte {pos - 1} is beyond the size "
                                "of the pickle; nothing was executed"
                            )
                    pos = newline + 1
            elif kind == _REFUSE:
                raise UnsafePickleError(
                    f"refusing opcode {_ARG_SIZE[data[pos]][0]} at byte {pos} (extension registry "
                    "and out-of-band buffers are never used by the supported files); nothing was "
                    "executed"
                )
            else:
                raise UnsafePickleError(f"unknown pickle opcode {data[pos]:#x} at byte {pos}; nothing was executed")
    except (IndexError, struct.error):
        pass
    raise UnsafePickleError("the pickle ends before its STOP opcode (truncated file?)")


class _RestrictedUnpickler(pickle.Unpickler):  # the C unpickler, on data that scan_pickle has checked
    def __init__(self, file, classes, storages=None, numpy_stubs=False, **kw):
        super().__init__(file, **kw)
        self._classes = classes
        self._storages = storages if storages is not None else {}
        self._numpy_stubs = numpy_stubs
        self._class_cache = {}

    def find_class(self, module, name):
        qual = f"{module}.{name}"
        # plain, side-effect-free containers
        if (module, name) in {("collections", "OrderedDict")}:
            return collections.OrderedDict
        if (module, name) == ("collections", "Counter"):
            return collections.Counter
        if module in ("builtins", "__builtin__") and name in _BUILTINS:
            return _BUILTINS[name]
        if module == "_codecs" and name == "encode":
            return _codecs_encode
        # tensors
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch._utils" and name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            return _rebuild_parameter
        if module == "torch._tensor" and name == "_rebuild_from_type_v2":
            return _rebuild_from_type_v2
        if module == "torch" and name == "Tensor":
            return "torch.Tensor"
        if module == "torch.nn.parameter" and name == "Parameter":
            return "torch.nn.parameter.Parameter"
        if module in ("torch", "torch.cuda") and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        if module == "torch" and name in _TORCH_DTYPES:
            return _TORCH_DTYPES[name]
        # numpy arrays inside a vocabulary cache: recognised, never built
        if (
            self._numpy_stubs
            and module in ("numpy.core.multiarray", "numpy._core.multiarray")
            and name in ("_reconstruct", "scalar")
        ):
            return _stub_factory
        if self._numpy_stubs and module == "numpy" and name in ("ndarray", "dtype"):
            return _StubClass(qual)
        # known classes, by name only
        short = module.rsplit(".", 1)[-1] if module.startswith(("utils.", "pytorch.", "tf.")) else module
        allowed = self._classes.get(short) or self._classes.get(module)
        if allowed and name in allowed:
            key = f"{short}.{name}"
            if key not in self._class_cache:
                self._class_cache[key] = _new_object(key)
            return self._class_cache[key]
        raise UnsafePickleError(
            f"refusing to load global '{qual}': it is not on the allow-list of this converter "
            f"(the file may be malicious or from an unsupported version); nothing was executed"
        )

    def persistent_load(self, pid):
        if isinstance(pid, tuple) and len(pid) == 4 and pid[0] in ("module", b"module"):
            # legacy torch format records each nn.Module class with its source code; the class itself
            # was already resolved through find_class (so it is an allowed stand-in); the source is ignored
            if not (isinstance(pid[1], type) and issubclass(pid[1], PickledObject)):
                raise UnsafePickleError(f"unsupported module record {pid[:1]!r}")
            return pid[1]
        if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage"):
            raise UnsafePickleError(f"unsupported persistent id {pid!r}")
        storage_type, key, _location, numel = pid[1], pid[2], pid[3], pid[4]
        if not isinstance(storage_type, torch.dtype):
            raise UnsafePickleError(f"unsupported storage type {storage_type!r}")
        if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
            raise UnsafePickleError(f"storage {key!r}: bad element count {numel!r}")
        if len(pid) > 5 and pid[5] is not None:
            raise UnsafePickleError("storage views (pre-1.0 torch files) are not supported")
        key = key.decode() if isinstance(key, bytes) else str(key)
        ref = self._storages.get(key)
        if ref is None:
            ref = self._storages[key] = _StorageRef(storage_type, key, numel)
        return ref


def _materialize(obj, memo=None):
    """Replace every _DeferredTensor in a tree of containers / PickledObjects by a real tensor."""
    if memo is None:
        memo = {}
    oid = id(obj)
    if oid in memo:
        return memo[oid]
    if isinstance(obj, _DeferredTensor):
        out = memo[oid] = obj.materialize()
        return out
    if isinstance(obj, PickledObject):
        memo[oid] = obj
        for k, v in list(obj.state.items()):
            obj.state[k] = _materialize(v, memo)
        return obj
    if isinstance(obj, dict):
        memo[oid] = obj
        for k, v in list(obj.items()):
            obj[k] = _materialize(v, memo)
        return obj
    if isinstance(obj, list):
        memo[oid] = obj
        for i, v in enumerate(obj):
            obj[i] = _materialize(v, memo)
        return obj
    if isinstance(obj, tuple):
        out = memo[oid] = tuple(_materialize(v, memo) for v in obj)
        return out
    return obj


def _bytes_to_flat(data, dtype, numel):
    if numel == 0:
        return torch.empty(0, dtype=dtype)
    t = torch.frombuffer(bytearray(data), dtype=dtype)
    if t.numel() < numel:
        raise UnsafePickleError(f"storage holds {t.numel()} elements, {numel} expected")
    return t[:numel]


def _element_size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _unpickle(data, path, classes, start=0, storages=None, numpy_stubs=False, encoding="utf-8"):
    """The object pickled at `data[start]` and the offset just past it: the opcodes are scanned first
    (`scan_pickle`), then the restricted C unpickler builds the object. A pickle that asks for more memory or
    recursion than exists, or that is malformed, is one `UnsafePickleError` naming `path`."""
    try:
        end = scan_pickle(data, start)
        unpickler = _RestrictedUnpickler(io.BytesIO(data[start:end]), classes, storages, numpy_stubs, encoding=encoding)
        return unpickler.load(), end
    except UnsafePickleError as error:
        raise UnsafePickleError(f"{path}: {error}") from None
    except (MemoryError, RecursionError, OverflowError) as error:
        raise UnsafePickleError(
            f"{path}: the pickle asks for too much ({type(error).__name__}); nothing was executed"
        ) from None
    except Exception as error:  # noqa: BLE001 - a malformed pickle (bad stack, missing memo entry, ...)
        raise UnsafePickleError(
            f"{path}: not a readable pickle ({type(error).__name__}: {error}); nothing was executed"
        ) from None


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# How torch.save's legacy format begins: the magic number pickled with protocol 2.
_LEGACY_MAGIC_PICKLE = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."


def is_torch_file(path) -> bool:
    """Whether `path` was written by torch.save (zip or legacy format) rather than by pickle.dump."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as f:
        return f.read(len(_LEGACY_MAGIC_PICKLE)) == _LEGACY_MAGIC_PICKLE


def load_torch_file(path, classes=MODULE_CLASSES, load_tensors=True, numpy_stubs=False):
    """Load a ``torch.save`` file (zip or legacy format) with the restricted unpickler."""
    path = os.fspath(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
            if not pkl:
                raise UnsafePickleError(f"{path}: zip file without a torch data.pkl")
            root = pkl[0].split("/")[0]
            storages = {}
            obj, _ = _unpickle(zf.read(pkl[0]), path, classes, storages=storages, numpy_stubs=numpy_stubs)
            if load_tensors:
                for key, ref in storages.items():
                    name = f"{root}/data/{key}"
                    try:
                        entry = zf.getinfo(name)
                    except KeyError:
                        raise UnsafePickleError(f"{path}: storage {key} is missing from the archive") from None
                    # torch.save stores its storages uncompressed: the bytes must be in the file, so a small
                    # archive cannot declare (and make us allocate) a huge tensor
                    if entry.compress_type != zipfile.ZIP_STORED:
                        raise UnsafePickleError(f"{path}: storage {key} is compressed (torch.save never does that)")
                    if entry.file_size < ref.numel * _element_size(ref.dtype):
                        raise UnsafePickleError(
                            f"{path}: storage {key} holds {entry.file_size} bytes, "
                            f"{ref.numel} elements of {ref.dtype} expected"
                        )
                    ref.tensor = _bytes_to_flat(zf.read(name), ref.dtype, ref.numel)
        return _materialize(obj)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise UnsafePickleError(f"{path}: not a torch.save file (empty)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            # the legacy format: five pickles (magic number, protocol, sys info, the object, storage keys), then
            # each storage as an 8-byte element count and its raw bytes
            try:
                magic, pos = _unpickle(data, path, {})
            except UnsafePickleError as err:
                raise UnsafePickleError(f"{path}: not a torch.save file ({err})") from None
            if magic != _LEGACY_MAGIC:
                raise UnsafePickleError(f"{path}: not a torch.save file (no legacy magic number)")
            _, pos = _unpickle(data, path, {}, pos)  # protocol version
            _, pos = _unpickle(data, path, {}, pos)  # sys info
            storages = {}
            obj, pos = _unpickle(data, path, classes, pos, storages=storages, numpy_stubs=numpy_stubs)
            keys, pos = _unpickle(data, path, {}, pos)
            if load_tensors:
                for key in keys:
                    key = key.decode() if isinstance(key, bytes) else str(key)
                    ref = storages.get(key)
                    if ref is None:
                        raise UnsafePickleError(f"{path}: storage {key} was never declared")
                    if pos + 8 > len(data):
                        raise UnsafePickleError(f"{path}: the file ends before storage {key}")
                    (numel,) = struct.unpack_from("<q", data, pos)
                    pos += 8
                    nbytes = numel * _element_size(ref.dtype)
                    if numel < 0 or nbytes > len(data) - pos:  # checked before reading: no huge allocation
                        raise UnsafePickleError(
                            f"{path}: storage {key} declares {numel} elements, more than the file holds"
                        )
                    ref.tensor = _bytes_to_flat(data[pos : pos + nbytes], ref.dtype, numel)
                    pos += nbytes
        return _materialize(obj)


def load_plain_pickle(path, classes=VOCAB_CLASSES, encoding="bytes"):
    """Load a plain pickle (e.g. a Python 2 ``cache.pkl``) with the restricted unpickler.

    With ``encoding="bytes"`` Python 2 ``str`` objects come back as ``bytes`` (to be decoded by the
    caller as UTF-8), and Python 2 ``unicode`` objects as ``str``.
    """
    with open(path, "rb") as f:
        data = f.read()
    return _unpickle(data, os.fspath(path), classes, numpy_stubs=True, encoding=encoding)[0]
