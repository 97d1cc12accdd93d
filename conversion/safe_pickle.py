"""The restricted unpickler, under the name the converters have always imported it by.

The one implementation lives in `hf_txvariants/txv_safe_pickle.py` (the flat package, so that the Transformer-XL
tokenizer reads a legacy `vocab.pkl` with it, also as remote code); this module re-exports it unchanged."""

from __future__ import annotations

from hf_txvariants.txv_safe_pickle import *  # noqa: F401,F403 - re-exported
from hf_txvariants.txv_safe_pickle import __all__  # noqa: F401
