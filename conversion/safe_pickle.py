"""The restricted unpickler, under the name the converters have always imported it by.

The one implementation lives in `hf_txvariants/txv_safe_pickle.py` (the flat package, so that the Transformer-XL
tokenizer reads a legacy `vocab.pkl` with it, also as remote code); this module re-exports it unchanged."""
from __future__ import annotations

from hf_txvariants.txv_safe_pickle import (  # noqa: F401 - re-exported
    MAX_CONSTRUCTOR_BYTES,
    MODULE_CLASSES,
    TRANSFO_XL_TOKENIZER_CLASSES,
    VOCAB_CLASSES,
    ArrayStub,
    PickledObject,
    UnsafePickleError,
    check_view_bounds,
    is_torch_file,
    load_plain_pickle,
    load_torch_file,
    scan_pickle,
)

__all__ = [
    "UnsafePickleError",
    "PickledObject",
    "ArrayStub",
    "load_torch_file",
    "load_plain_pickle",
    "scan_pickle",
    "is_torch_file",
    "check_view_bounds",
    "MAX_CONSTRUCTOR_BYTES",
    "MODULE_CLASSES",
    "VOCAB_CLASSES",
    "TRANSFO_XL_TOKENIZER_CLASSES",
]
