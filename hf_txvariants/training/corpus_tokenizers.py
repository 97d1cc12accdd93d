"""The tokenizers `txv train --tokenizer` builds (byte, word; char lives in data.py) and `CorpusEncoder`, which turns a
corpus into token ids block by block, in Rust where the tokenizer allows it.

* `byte` (the papers' enwik8 setup: every byte of the UTF-8 text is a symbol): a `PreTrainedTokenizerFast` whose
  ids 0..255 are the byte values (a `tokenizers` ByteLevel pre-tokenizer and decoder with a BPE model without
  merges), then `<eos>` (256) and `<pad>` (257). A plain `tokenizer.json` folder: `AutoTokenizer` loads it without
  this plugin and without `trust_remote_code`, which a custom tokenizer class could not offer. Its ids being the text's
  bytes, `CorpusEncoder` encodes a corpus with it through `str.encode` (recognised by its whole backend pipeline).
* `word` (Transformer-XL's word-level setups, WikiText-103): the vocabulary the original `Vocab.build_vocab` builds
  (kimiyoung/transformer-xl data_utils.py): the lines split at whitespace and counted, the special symbols `<eos>`
  and `<unk>` first, then `Counter.most_common(max_size)` in order, stopping at the first count below `min_freq`.
  The training text is read once for both the vocabulary and its ids (`WordNumbering`): words are numbered in order
  of first appearance while they are counted, and the numbers become ids once the vocabulary is known.
  Saved as the plugin's `TransfoXLTokenizer` (vocab.json) with `whitespace_split=True`, so that a prompt is split as
  the corpus was.
* A word-level `TransfoXLTokenizer` (built here or converted from the original checkpoints) encodes a corpus as the
  original `Vocab.encode_file` does: each line split at whitespace then `<eos>`, unknown words `<unk>`, with C-level
  loops only (see `CorpusEncoder`; 4-7x faster here than a `tokenizers` WordLevel model, and the same `str.split`
  and `str.lower` as the original). Any other fast tokenizer encodes with its own Rust backend; a slow one with its
  own `__call__`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections import defaultdict
from itertools import count, repeat
from pathlib import Path

import numpy as np

from ..txv_files import explained_write_errors
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
LINE_END = -1  # a line end among a block's word numbers


class _Numbering:
    """One process's pass over its blocks: each word numbered in order of first appearance and counted, each block's
    numbers written to `file` (int32, text order, a line end as LINE_END), so that the training text is split and
    looked up once, not once to count and again to encode. A line end enters the numbering as a placeholder that is
    not a word (NUL characters found neither in the block nor among the words numbered so far) and is taken out
    after the block: the original counts `<eos>` only where the text holds it."""

    def __init__(self, file=None):
        self.numbering = defaultdict(count().__next__)
        self.counts = np.zeros(0, np.int64)
        self.file = file  # counts has an entry for every number given so far, the placeholders' included
        self.blocks = []  # per block: (its number of ids, the numbers first given in it: [start, end))

    def add(self, block: str):
        numbering = self.numbering
        line_end = "\0"
        while line_end in block or line_end in numbering:
            line_end += "\0"
        words = block.replace("\n", f" {line_end} ").split() if "\n" in block else block.split()
        ids = np.fromiter(map(numbering.__getitem__, words), dtype=np.int32, count=len(words))
        start = len(self.counts)
        block_counts = np.bincount(ids, minlength=start)
        self.counts = np.pad(self.counts, (0, len(block_counts) - start)) + block_counts
        if line_end in numbering:
            ids[ids == numbering.pop(line_end)] = LINE_END
        self.blocks.append((len(ids), start, len(self.counts)))
        if self.file is not None:
            self.file.write(ids.tobytes())

    def result(self) -> tuple[list[str], np.ndarray, np.ndarray, list]:
        """The words in order of first appearance (the order in which the original's `Counter` meets them), their
        counts (int64), their numbers (increasing, with gaps where line ends were numbered) and the blocks' record."""
        words = list(self.numbering)
        numbers = np.fromiter(self.numbering.values(), dtype=np.int64, count=len(words))
        return words, self.counts[numbers], numbers, self.blocks


def _numbering_process(connection, file):
    """A forked helper of `WordNumbering`: numbers the blocks it is sent (None ends), answers its `result()`."""
    try:
        numbering = _Numbering(file)
        while (block := connection.recv()) is not None:
            numbering.add(block)
        file.flush()
        connection.send(("done", numbering.result()))
    except BaseException as error:  # sent to the parent, which raises it
        connection.send(("failed", error))


def _blocks_in_text_order(results: list, owners: list[int]):
    """`(process, its record of the block)` for every block in text order (`owners`: the process of each block; a
    process's records are in the order it was sent its blocks)."""
    records = [iter(blocks) for _, _, _, blocks in results]
    for owner in owners:
        yield owner, next(records[owner])


def _merge(results: list, owners: list[int]) -> tuple[list[str], np.ndarray, list[np.ndarray]]:
    """The words of all processes in order of first appearance in the text, their counts, and per process the global
    index of each of its words. Block by block in text order, a block's new words in its process's numbering order,
    which is their order in the block, unless another block met them first."""
    index = {}
    for owner, (_, start, end) in _blocks_in_text_order(results, owners):
        words, _, numbers, _ = results[owner]
        first, last = np.searchsorted(numbers, [start, end])
        for word in words[first:last]:
            index.setdefault(word, len(index))
    counts = np.zeros(len(index), np.int64)
    global_index = []
    for words, word_counts, _, _ in results:
        positions = np.fromiter(map(index.__getitem__, words), dtype=np.int64, count=len(words))
        np.add.at(counts, positions, word_counts)
        global_index.append(positions)
    return list(index), counts, global_index


def word_vocabulary(
    words: list[str], counts: np.ndarray, min_freq: int = 0, max_size: int | None = None, special=WORD_SPECIALS
) -> list[str]:
    """The symbols in id order, as the original `Vocab.build_vocab`: the specials, then the most common words
    (`Counter.most_common(max_size)`: by count, ties in order of first appearance), stopping at a count below
    `min_freq`. `words` in order of first appearance with their `counts` (`_Numbering.result`)."""
    symbols = dict.fromkeys(special)
    order = np.argsort(-counts, kind="stable")
    for index in order[:max_size].tolist():
        if counts[index] < min_freq:
            break
        symbols.setdefault(words[index], None)
    return list(symbols)


def word_tokenizer(symbols: list[str], min_freq: int = 0, max_size: int | None = None):
    """A `TransfoXLTokenizer` whose ids are `symbols` in order (see the module docstring)."""
    from ..tokenization_transfo_xl import TransfoXLTokenizer

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


def build_word_tokenizer(blocks, min_freq: int = 0, max_size: int | None = None):
    """A `TransfoXLTokenizer` over the word vocabulary of `blocks` (see the module docstring)."""
    numbering = _Numbering()
    for block in blocks:
        numbering.add(block)
    words, counts, _, _ = numbering.result()
    return word_tokenizer(word_vocabulary(words, counts, min_freq, max_size), min_freq, max_size)


def numbering_processes() -> int:
    """The processes `WordNumbering` uses: the CPUs this process may run on, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


class WordNumbering:
    """The word vocabulary of the training text and its token ids from one pass over it (`_Numbering`), spread over
    `processes`: this one numbers every `processes`-th block and forked helpers (started at the second block, so a
    small text forks nothing) the others, each into its own unnamed temporary file in `folder` (4 bytes a token; gone
    when closed, also after a crash). `_merge` puts the words in the order in which one pass would have met them;
    `token_ids()` then turns the numbers into the ids `CorpusEncoder` would give, a block at a time."""

    def __init__(self, blocks, folder: Path, min_freq: int = 0, max_size: int | None = None, processes=None):
        processes = processes or numbering_processes()
        self.files = [tempfile.TemporaryFile(dir=folder, prefix=".txv-word-numbers-") for _ in range(processes)]
        try:
            with explained_write_errors(f"{folder} (the training text's word numbers, a temporary file)"):
                results, self.owners = self._number(blocks, processes)
            words, counts, global_index = _merge(results, self.owners)
            self.tokenizer = word_tokenizer(word_vocabulary(words, counts, min_freq, max_size), min_freq, max_size)
            table, unknown = self.tokenizer.sym2idx, self.tokenizer.unk_idx
            ids_of_words = np.fromiter((table.get(word, unknown) for word in words), np.int64, count=len(words))
            # per process, number -> token id; the last entry (LINE_END = -1) and the placeholders' are <eos>
            self.id_tables = []
            for (_, _, numbers, _), positions in zip(results, global_index):
                id_table = np.full(int(numbers[-1]) + 2 if len(numbers) else 1, table["<eos>"], np.int64)
                id_table[numbers] = ids_of_words[positions]
                self.id_tables.append(id_table)
            self.blocks = list(_blocks_in_text_order(results, self.owners))
        except BaseException:
            self.close()
            raise

    def _number(self, blocks, processes: int) -> tuple[list, list[int]]:
        own = _Numbering(self.files[0])
        helpers, owners = [], []
        try:
            for position, block in enumerate(blocks):
                owner = position % processes
                if owner == 0:
                    own.add(block)
                else:
                    if not helpers:
                        helpers = self._start_helpers(processes)
                    helpers[owner - 1][1].send(block)
                owners.append(owner)
            own.file.flush()
            results = [own.result()]
            for process, connection in helpers:
                connection.send(None)
                status, answer = connection.recv()
                if status == "failed":
                    raise answer
                process.join()
                results.append(answer)
            results += [_Numbering().result()] * (processes - len(results))  # helpers never started: no blocks
            return results, owners
        finally:
            for process, _ in helpers:
                if process.is_alive():
                    process.terminate()

    def _start_helpers(self, processes: int) -> list:
        import multiprocessing

        context = multiprocessing.get_context("fork")  # a fork starts at once; a fresh interpreter imports torch
        helpers = []
        for file in self.files[1:processes]:
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_numbering_process, args=(child_end, file), daemon=True)
            process.start()
            helpers.append((process, parent_end))
        return helpers

    def token_ids(self, dtype):
        """The training text's token ids, block by block, as `CorpusEncoder(self.tokenizer).encode` gives them."""
        numbers = []
        for file in self.files:
            size = file.seek(0, 2) // 4
            numbers.append(np.memmap(file, dtype=np.int32, mode="r", shape=(size,)) if size else None)
        offsets = [0] * len(self.files)
        for owner, (size, _, _) in self.blocks:
            if size:
                chunk = numbers[owner][offsets[owner] : offsets[owner] + size]
                yield self.id_tables[owner][chunk].astype(dtype)
            offsets[owner] += size

    def close(self):
        for file in self.files:
            file.close()


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

    FORMAT = 2  # bump when the way ids are produced changes (2: a last line without a newline gets its <eos>)

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.int32)
        self.word_level = word_level = _is_word_level_transfo_xl(tokenizer)
        # a newline is `<eos>` (the originals' line-by-line readers): the text ends with one, as their last line does
        self.line_ends = word_level or _newline_is_eos(tokenizer)
        self.backend = None if word_level else getattr(tokenizer, "backend_tokenizer", None)
        self.utf8_bytes = self.backend is not None and _is_byte_tokenizer(self.backend)  # ids = the text's bytes
        digest = hashlib.sha256(json.dumps({"format": self.FORMAT, "class": type(tokenizer).__name__}).encode())
        if word_level:
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
        if self.word_level:
            return self._encode_words(block)
        if self.utf8_bytes:
            return np.frombuffer(block.encode("utf-8"), dtype=np.uint8).astype(self.dtype)
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


@functools.cache
def _byte_backend_json() -> str:
    return build_byte_tokenizer().backend_tokenizer.to_str()


def _is_byte_tokenizer(backend) -> bool:
    """Whether `backend` is `build_byte_tokenizer`'s (its whole pipeline, and a literal special token kept as bytes),
    whose ids are the UTF-8 bytes of the text: encoded by `str.encode` then, 100x faster than its Rust pipeline."""
    return backend.encode_special_tokens and backend.to_str() == _byte_backend_json()


def _newline_is_eos(tokenizer) -> bool:
    """Whether `tokenizer`'s pipeline turns a newline into its end-of-sequence token (a converted word-level vocabulary
    of the originals, whose readers end every line, the last one included, with `<eos>`). Asked of the Rust backend
    itself: the tokenizer's own call would set the backend's options."""
    eos = getattr(tokenizer, "eos_token_id", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if eos is None or backend is None:
        return False
    try:
        return backend.encode("\n", add_special_tokens=False).ids == [eos]
    except Exception:  # a vocabulary without an unknown token cannot encode what it lacks
        return False


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
