"""The tokenizers `txv train --tokenizer` builds (byte, word; char lives in data.py) and `CorpusEncoder`, which turns a
corpus into token ids block by block, in Rust where the tokenizer allows it.

* `byte` (the papers' enwik8 setup: every byte of the UTF-8 text is a symbol): a `PreTrainedTokenizerFast` whose
  ids 0..255 are the byte values (a `tokenizers` ByteLevel pre-tokenizer and decoder with a BPE model without
  merges), then `<eos>` (256) and `<pad>` (257). A plain `tokenizer.json` folder: `AutoTokenizer` loads it without
  this plugin and without `trust_remote_code`, which a custom tokenizer class could not offer.
* `word` (Transformer-XL's word-level setups, WikiText-103): the vocabulary the original `Vocab.build_vocab` builds
  (kimiyoung/transformer-xl data_utils.py): the lines split at whitespace and counted, the special symbols `<eos>`
  and `<unk>` first, then `Counter.most_common(max_size)` in order, stopping at the first count below `min_freq`.
  Saved as the plugin's `TransfoXLTokenizer` (vocab.json) with `whitespace_split=True`, so that a prompt is split as
  the corpus was.
* A word-level `TransfoXLTokenizer` (built here or converted from the original checkpoints) encodes a corpus as the
  original `Vocab.encode_file` does: each line split at whitespace then `<eos>`, unknown words `<unk>`, with C-level
  loops only (see `CorpusEncoder`; 4-7x faster here than a `tokenizers` WordLevel model, and the same `str.split`
  and `str.lower` as the original). Any other fast tokenizer encodes with its own Rust backend; a slow one with its
  own `__call__`.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter
from itertools import repeat
from pathlib import Path

import numpy as np

from .data import DataError

WORD_SPECIALS = ("<eos>", "<unk>")
ENCODE_PIECE_CHARS = 1 << 16  # a block is encoded as pieces of about this size, in parallel by `encode_batch`


# --------------------------------------------------------------------------------------------------------------------
# byte
def build_byte_tokenizer():
    """Byte-level tokenizer: ids 0..255 are the byte values of the UTF-8 text, then `<eos>`, `<pad>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = _bytes_to_unicode()
    vocab = {alphabet[value]: value for value in range(256)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    # split_special_tokens: a literal "<eos>" in the text stays bytes, so the ids are always the text's bytes
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<eos>",
        pad_token="<pad>",
        split_special_tokens=True,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    assert fast.convert_tokens_to_ids(["<eos>", "<pad>"]) == [256, 257], "special ids follow the 256 bytes"
    return fast


def _bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character map of the ByteLevel pre-tokenizer (GPT-2's `bytes_to_unicode`)."""
    from tokenizers import pre_tokenizers

    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    mapping, extra = {}, 0
    for value in range(256):
        if value in kept:
            mapping[value] = chr(value)
        else:
            mapping[value] = chr(256 + extra)
            extra += 1
    if set(mapping.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("the tokenizers library's ByteLevel alphabet is not GPT-2's byte map")
    return mapping


# --------------------------------------------------------------------------------------------------------------------
# word
def count_words(blocks) -> Counter:
    """Word counts of the text blocks (whitespace split), inserted in order of first occurrence, as the original
    `Vocab.count_file` counts a file line by line (its `<eos>` is not counted: `add_eos=False`)."""
    counts = Counter()
    for block in blocks:
        counts.update(block.split())
    return counts


def word_vocabulary(
    counts: Counter, min_freq: int = 0, max_size: int | None = None, special=WORD_SPECIALS
) -> list[str]:
    """The symbols in id order, as the original `Vocab.build_vocab`: the specials, then the most common words."""
    symbols = dict.fromkeys(special)
    for word, count in counts.most_common(max_size):
        if count < min_freq:
            break
        symbols.setdefault(word, None)
    return list(symbols)


def build_word_tokenizer(blocks, min_freq: int = 0, max_size: int | None = None):
    """A `TransfoXLTokenizer` over the word vocabulary of `blocks` (see the module docstring)."""
    from ..tokenization_transfo_xl import TransfoXLTokenizer

    symbols = word_vocabulary(count_words(blocks), min_freq, max_size)
    if len(symbols) == len(WORD_SPECIALS):
        raise DataError("cannot build a word vocabulary: the training text has no words")
    with tempfile.TemporaryDirectory() as folder:
        vocab_file = Path(folder) / "vocab.json"
        vocab_file.write_text(json.dumps({symbol: i for i, symbol in enumerate(symbols)}, ensure_ascii=False))
        return TransfoXLTokenizer(
            vocab_json_file=str(vocab_file),
            special=list(WORD_SPECIALS),
            min_freq=min_freq,
            max_size=max_size,
            lower_case=False,
            whitespace_split=True,
            unk_token="<unk>",
            eos_token="<eos>",
            additional_special_tokens=[],
        )


# --------------------------------------------------------------------------------------------------------------------
# encoding a corpus
class CorpusEncoder:
    """Turns text blocks into token ids (numpy, `dtype`) with `tokenizer`; `fingerprint` identifies what it produces
    (the tokenizer's vocabulary and rules), so that a token cache made with another tokenizer is recognised.

    A word-level `TransfoXLTokenizer` encodes as the original `Vocab.encode_file`: per line `line.strip()`, lower-cased
    if its `lower_case` is set, `.split()`, then `<eos>`; a word outside the vocabulary is `<unk>`. Done a block at a
    time with C-level loops only: newlines become ` <eos> `, `str.split`, then `map(vocabulary.get, words)` into
    `np.fromiter` (the same Python `split` and `lower` as the original, no bytecode per token). Another fast tokenizer
    encodes with its Rust backend (`encode_batch`, pieces in parallel); a slow one with its own `__call__`."""

    FORMAT = 1  # bump when the way ids are produced changes

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.int32)
        self.line_ends = _is_word_level_transfo_xl(tokenizer)  # a newline is `<eos>`; the text ends with one
        self.backend = None if self.line_ends else getattr(tokenizer, "backend_tokenizer", None)
        digest = hashlib.sha256(json.dumps({"format": self.FORMAT, "class": type(tokenizer).__name__}).encode())
        if self.line_ends:
            self._words = dict(tokenizer.sym2idx)
            self._eos = tokenizer.eos_token
            if self._eos not in self._words:
                raise DataError(f"the word-level tokenizer has no {self._eos!r} in its vocabulary (the end of a line)")
            unk_idx = tokenizer.unk_idx
            if unk_idx is None:
                unk_idx = next((self._words[u] for u in ("<unk>", "<UNK>") if u in self._words), None)
            self._unk = unk_idx
            rules = {"lower_case": bool(tokenizer.lower_case), "eos": self._eos, "unk": unk_idx}
            digest.update(json.dumps([rules, tokenizer.idx2sym], ensure_ascii=False).encode())
        elif self.backend is not None:
            digest.update(self.backend.to_str().encode())
        else:
            digest.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
            settings = {k: v for k, v in tokenizer.init_kwargs.items() if k != "name_or_path"}
            digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
        self.fingerprint = digest.hexdigest()

    def encode(self, block: str) -> np.ndarray:
        """The ids of one block of text (1-D, `self.dtype`)."""
        if self.line_ends:
            return self._encode_words(block)
        pieces = _pieces(block, ENCODE_PIECE_CHARS)
        if self.backend is not None:
            try:
                encodings = self.backend.encode_batch(pieces, add_special_tokens=False)
            except Exception as error:  # tokenizers raises its own exception type
                raise DataError(f"the tokenizer cannot encode the text: {error}") from None
            ids = [np.asarray(encoding.ids, dtype=self.dtype) for encoding in encodings]
        else:
            ids = [
                np.asarray(self.tokenizer(piece, add_special_tokens=False)["input_ids"], dtype=self.dtype)
                for piece in pieces
            ]
        return np.concatenate(ids) if ids else np.zeros(0, self.dtype)

    def _encode_words(self, block: str) -> np.ndarray:
        if self.tokenizer.lower_case:
            block = block.lower()
        words = block.replace("\n", f" {self._eos} ").split()
        ids = np.fromiter(map(self._words.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        unknown = ids < 0
        if unknown.any():
            if self._unk is None:
                word = words[int(np.argmax(unknown))]
                raise DataError(
                    f"the word {word!r} is not in the tokenizer's vocabulary, which has no <unk> to replace it"
                )
            ids[unknown] = self._unk
        return ids.astype(self.dtype)


def _is_word_level_transfo_xl(tokenizer) -> bool:
    word_table = hasattr(tokenizer, "idx2sym") and hasattr(tokenizer, "sym2idx")
    return word_table and getattr(tokenizer, "delimiter", None) != ""


def _pieces(block: str, size: int) -> list[str]:
    """`block` cut after newlines into pieces of about `size` characters (a piece without a newline stays whole)."""
    pieces, start = [], 0
    while start < len(block):
        cut = block.find("\n", start + size)
        end = len(block) if cut < 0 else cut + 1
        pieces.append(block[start:end])
        start = end
    return pieces
