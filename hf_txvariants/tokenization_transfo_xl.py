"""Transformer-XL's word-level tokenizer: transformers 4.x's `TransfoXLTokenizer`, on transformers 5, without pickle.

It tokenizes as transformers 4.46.3 did (same tokens, ids, decodes): Moses punctuation normalisation, the Moses
tokenizer with aggressive dash splits, the special tokens never split, numbers split (`23,000` -> `23 @,@ 000`,
`1.80` -> `1 @.@ 80`), lower-casing when `lower_case` is set, `<unk>` for unknown words; decoding runs the Moses
detokenizer and joins the numbers again. sacremoses, the library the original uses, does the Moses steps.

Where the vocabulary comes from, first found wins:
* `vocab.json` (what `save_pretrained` writes: the symbols in id order as a JSON {symbol: id}; no pickle);
* `vocab.txt` (one symbol per line, its first word: the original's `vocab_file`; 4.x preferred it to the pickle too);
* `vocab.pkl` / `vocab.bin`, the legacy files: the pickled attributes of the 4.x tokenizer (pickle.dump, or
  torch.save for the 2019 Hub files), read by the project's restricted unpickler (`txv_safe_pickle`) with the
  `TRANSFO_XL_TOKENIZER_CLASSES` allow-list: containers and strings are read, the sacremoses objects, compiled
  regexes, `AddedToken`s and `Trie` they also hold become inert records (never imported, never called), any other
  global is refused naming the file and the global. Only `idx2sym`, `sym2idx` and `unk_idx` are used (as 4.x did),
  plus `lower_case` / `delimiter` where tokenizer_config.json does not set them.

Differences from 4.46.3, on purpose: `__call__` also returns an `attention_mask`, a missing pad token becomes the
eos token and batches pad on the left, so that batched generation works (4.x had no pad token and no mask).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from transformers import PreTrainedTokenizer

from .txv_safe_pickle import (
    TRANSFO_XL_TOKENIZER_CLASSES,
    PickledObject,
    is_torch_file,
    load_plain_pickle,
    load_torch_file,
)

try:  # a dependency of hf-txvariants; a remote-code user without it gets the error of `_moses()`
    import sacremoses
except ImportError:  # pragma: no cover - exercised in a subprocess test
    sacremoses = None

VOCAB_FILES_NAMES = {
    "vocab_json_file": "vocab.json",
    "vocab_file": "vocab.txt",
    "pretrained_vocab_file": "vocab.pkl",
    "pretrained_vocab_file_torch": "vocab.bin",
}
LEGACY_VOCAB_FILES = ("vocab.pkl", "vocab.bin")

# 4.x's number splitting and joining (tokenization_transfo_xl.MATCH_NUMBERS / DETOKENIZE_NUMBERS)
_NUMBER_SEPARATOR = re.compile(r"(?<=\d)[,.](?=\d)")
_SPLIT_NUMBERS = [(re.compile(r" @\,@ "), ","), (re.compile(r" @\.@ "), ".")]


def _moses():
    if sacremoses is None:
        raise ImportError(
            "TransfoXLTokenizer needs the sacremoses package (the Moses tokenizer Transformer-XL's "
            "vocabulary was built with): pip install sacremoses"
        )
    return sacremoses


def tokenize_numbers(words: list[str]) -> list[str]:
    """`["5,000", "1.73"]` -> `["5", "@,@", "000", "1", "@.@", "73"]`."""
    out = []
    for word in words:
        out.extend(_NUMBER_SEPARATOR.sub(r" @\g<0>@ ", word).split())
    return out


def detokenize_numbers(text: str) -> str:
    """`"5 @,@ 000 1 @.@ 73"` -> `"5,000 1.73"`."""
    for pattern, replacement in _SPLIT_NUMBERS:
        text = pattern.sub(replacement, text)
    return text


def read_legacy_vocabulary(path: str | os.PathLike) -> dict:
    """The vocabulary of a transformers 4.x `vocab.pkl` / 2019 `vocab.bin`, read without executing the pickle:
    {"idx2sym": [...], "sym2idx": {...}, "unk_idx": int | None, "lower_case": bool | None, "delimiter": ...}.
    A file that is not such a vocabulary is a `ValueError` naming it; a refused global an `UnsafePickleError`."""
    path = os.fspath(path)
    if is_torch_file(path):
        state = load_torch_file(path, classes=TRANSFO_XL_TOKENIZER_CLASSES, load_tensors=False)
    else:
        state = load_plain_pickle(path, classes=TRANSFO_XL_TOKENIZER_CLASSES, encoding="utf-8")
    if isinstance(state, PickledObject):  # a pickled tokenizer object rather than its __dict__
        state = state.state
    if not isinstance(state, dict):
        raise ValueError(
            f"{path}: expected the pickled attributes of a TransfoXLTokenizer (a dict), found {type(state).__name__}"
        )
    idx2sym = state.get("idx2sym")
    if not isinstance(idx2sym, list) or not idx2sym or not all(isinstance(s, str) for s in idx2sym):
        raise ValueError(f"{path}: 'idx2sym' must be a non-empty list of strings (the vocabulary in id order)")
    sym2idx = {symbol: index for index, symbol in enumerate(idx2sym)}
    if len(sym2idx) != len(idx2sym):
        raise ValueError(f"{path}: 'idx2sym' holds a symbol twice")
    pickled = state.get("sym2idx")
    if pickled is not None and (not isinstance(pickled, dict) or dict(pickled) != sym2idx):
        raise ValueError(f"{path}: 'sym2idx' does not match 'idx2sym'")
    unk_idx = state.get("unk_idx")
    if unk_idx is not None and (not isinstance(unk_idx, int) or not 0 <= unk_idx < len(idx2sym)):
        raise ValueError(f"{path}: 'unk_idx' {unk_idx!r} is not an id of the vocabulary")
    lower_case, delimiter = state.get("lower_case"), state.get("delimiter")
    return {
        "idx2sym": idx2sym,
        "sym2idx": sym2idx,
        "unk_idx": unk_idx,
        "lower_case": lower_case if isinstance(lower_case, bool) else None,
        "delimiter": delimiter if isinstance(delimiter, str) else None,
    }


def _read_vocabulary_text(path: str) -> list[str]:
    """4.x's `_build_from_file`: the first word of every line."""
    symbols = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.strip().split()
            if not words:
                raise ValueError(f"{path}: line {number} is empty (one symbol per line expected)")
            symbols.setdefault(words[0], None)
    return list(symbols)


def _read_vocabulary_json(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{path}: expected {{symbol: id}} with the ids 0 .. n-1")
    return sorted(vocab, key=vocab.__getitem__)


class TransfoXLTokenizer(PreTrainedTokenizer):
    """Transformer-XL's word-level tokenizer (transformers 4.x's `TransfoXLTokenizer`, same arguments and outputs).

    Args:
        special: symbols added first when a vocabulary is built (kept for 4.x configs; nothing is built here).
        lower_case: lower-case the text before tokenizing; None: what the legacy vocabulary file says, else False.
        delimiter: "" for a character-level vocabulary; anything else tokenizes with Moses (as 4.x did).
        vocab_json_file / vocab_file / pretrained_vocab_file / pretrained_vocab_file_torch: see the module doc.
        never_split: patterns the Moses tokenizer keeps whole (default: the special tokens).
        unk_idx: the id unknown words get (default: that of `<unk>`, else `<UNK>`).
        language: the Moses language.
        aggressive_dash_splits, split_numbers: the Moses settings (4.x: both on; recorded by `save_pretrained`).
        whitespace_split: tokenize as the original Transformer-XL `Vocab` does (the line split at whitespace, no Moses,
            no number splitting; decoding joins the words with spaces): the tokenizer of a vocabulary built by
            `txv train --tokenizer word`. Default False (4.x's Moses pipeline).
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]
    padding_side = "left"  # for generation: a batch ends with every row's last real token
    _auto_class = "AutoTokenizer"  # save_pretrained copies this file (and what it imports) and writes auto_map

    def __init__(
        self,
        special=None,
        min_freq=0,
        max_size=None,
        lower_case=None,
        delimiter=None,
        vocab_file=None,
        pretrained_vocab_file=None,
        pretrained_vocab_file_torch=None,
        vocab_json_file=None,
        never_split=None,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token=None,
        additional_special_tokens=None,
        language="en",
        unk_idx=None,
        aggressive_dash_splits=True,
        split_numbers=True,
        whitespace_split=False,
        **kwargs,
    ):
        moses = _moses()
        extra_special_tokens = kwargs.pop("extra_special_tokens", None)  # transformers 5's name of the same list
        if extra_special_tokens is None:
            extra_special_tokens = ["<formula>"] if additional_special_tokens is None else additional_special_tokens
        self.special = list(special or [])
        self.min_freq, self.max_size = min_freq, max_size
        self.language = language
        self.aggressive_dash_splits, self.split_numbers = bool(aggressive_dash_splits), bool(split_numbers)
        self.whitespace_split = bool(whitespace_split)
        self.moses_punct_normalizer = moses.MosesPunctNormalizer(language)
        self.moses_tokenizer = moses.MosesTokenizer(language)
        self.moses_detokenizer = moses.MosesDetokenizer(language)

        vocabulary = self._read_vocabulary(
            vocab_json_file, vocab_file, pretrained_vocab_file, pretrained_vocab_file_torch
        )
        self.idx2sym = vocabulary["idx2sym"]
        self.sym2idx = vocabulary["sym2idx"]
        self.vocab_file = vocab_file
        self.lower_case = bool(vocabulary.get("lower_case")) if lower_case is None else bool(lower_case)
        self.delimiter = vocabulary.get("delimiter") if delimiter is None else delimiter
        if unk_idx is None:
            unk_idx = vocabulary.get("unk_idx")
        if unk_idx is not None and not (isinstance(unk_idx, int) and 0 <= unk_idx < len(self.idx2sym)):
            raise ValueError(f"unk_idx {unk_idx!r} is not an id of the {len(self.idx2sym)}-symbol vocabulary")
        self.unk_idx = unk_idx
        if pad_token is None:
            pad_token = eos_token  # 4.x had none: pad with <eos>, masked out by the attention mask
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("special_tokens_pattern", "none")
        super().__init__(
            special=self.special,
            min_freq=min_freq,
            max_size=max_size,
            lower_case=self.lower_case,
            delimiter=self.delimiter,
            unk_token=unk_token,
            eos_token=eos_token,
            pad_token=pad_token,
            extra_special_tokens=extra_special_tokens,
            language=language,
            unk_idx=unk_idx,
            aggressive_dash_splits=self.aggressive_dash_splits,
            split_numbers=self.split_numbers,
            whitespace_split=self.whitespace_split,
            **kwargs,
        )
        self.never_split = list(never_split) if never_split is not None else list(self.all_special_tokens)
        self.init_kwargs["never_split"] = self.never_split

    @staticmethod
    def _read_vocabulary(vocab_json_file, vocab_file, pretrained_vocab_file, pretrained_vocab_file_torch) -> dict:
        if vocab_json_file is not None:
            symbols = _read_vocabulary_json(vocab_json_file)
        elif vocab_file is not None:
            symbols = _read_vocabulary_text(vocab_file)
        elif pretrained_vocab_file is not None or pretrained_vocab_file_torch is not None:
            return read_legacy_vocabulary(pretrained_vocab_file or pretrained_vocab_file_torch)
        else:
            raise ValueError(
                "TransfoXLTokenizer needs a vocabulary: vocab.json, vocab.txt or a legacy vocab.pkl / "
                "vocab.bin (none was found)"
            )
        sym2idx = {symbol: index for index, symbol in enumerate(symbols)}
        # 4.x's vocab.txt reader: <UNK> before <unk>
        return {"idx2sym": symbols, "sym2idx": sym2idx, "unk_idx": sym2idx.get("<UNK>", sym2idx.get("<unk>"))}

    # ------------------------------------------------------------------------------------------------ vocabulary
    @property
    def additional_special_tokens(self) -> list[str]:
        """4.x's name of transformers 5's `extra_special_tokens`."""
        return [str(token) for token in self.extra_special_tokens]

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.additional_special_tokens)

    @property
    def do_lower_case(self):
        return self.lower_case

    @property
    def vocab_size(self):
        return len(self.idx2sym)

    def get_vocab(self):
        vocab = dict(self.sym2idx)
        vocab.update(self._added_tokens_encoder)
        return vocab

    def _convert_token_to_id(self, sym):
        if sym in self.sym2idx:
            return self.sym2idx[sym]
        if self.unk_idx is not None:
            return self.unk_idx
        for unk in ("<unk>", "<UNK>"):
            if unk in self.sym2idx:
                return self.sym2idx[unk]
        raise ValueError(f"the word {sym!r} is not in the vocabulary, which has no <unk> token to replace it")

    def _convert_id_to_token(self, idx):
        if not 0 <= idx < len(self.idx2sym):
            raise ValueError(f"token id {idx} is outside the vocabulary (0 .. {len(self.idx2sym) - 1})")
        return self.idx2sym[idx]

    # ---------------------------------------------------------------------------------------------- tokenization
    def tokenize(self, text, **kwargs):
        if self.lower_case:
            # 4.x lower-cased the text outside the special tokens before splitting on them
            special = "|".join(re.escape(token) for token in self.all_special_tokens)
            text = re.sub(rf"({special})|(.+?)", lambda m: m.group(1) or m.group(2).lower(), text)
        return super().tokenize(text, **kwargs)

    def moses_pipeline(self, text: str) -> list[str]:
        """Moses punctuation normalisation and tokenization, then number splitting."""
        text = self.moses_punct_normalizer.normalize(text)
        words = self.moses_tokenizer.tokenize(
            text,
            aggressive_dash_splits=self.aggressive_dash_splits,
            return_str=False,
            escape=False,
            protected_patterns=self.never_split,
        )
        return tokenize_numbers(words) if self.split_numbers else words

    def _tokenize(self, line, add_eos=False, add_double_eos=False):
        line = line.strip()
        if self.lower_case:
            line = line.lower()
        if self.delimiter == "":
            symbols = list(line)
        elif self.whitespace_split:
            symbols = line.split()
        else:
            symbols = self.moses_pipeline(line)
        if add_double_eos:  # lm1b
            return ["<S>", *symbols, "<S>"]
        return [*symbols, "<eos>"] if add_eos else symbols

    def convert_tokens_to_string(self, tokens):
        if self.whitespace_split:
            return " ".join(tokens).strip()
        text = self.moses_detokenizer.detokenize(tokens)
        return (detokenize_numbers(text) if self.split_numbers else text).strip()

    def _decode(
        self,
        token_ids,
        skip_special_tokens=False,
        clean_up_tokenization_spaces=None,
        spaces_between_special_tokens=True,
        **kwargs,
    ):
        """4.x's decode: added tokens outside the vocabulary are joined with spaces, the rest detokenized."""
        tokens = self.convert_ids_to_tokens(token_ids, skip_special_tokens=skip_special_tokens)
        if isinstance(tokens, str):
            tokens = [tokens]
        special = set(self.all_special_tokens)
        standalone = set(self._added_tokens_encoder) - special | {
            token for token in self.additional_special_tokens if self.convert_tokens_to_ids(token) >= self.vocab_size
        }
        pieces, run = [], []
        for token in tokens:
            if skip_special_tokens and token in special:
                continue
            if token in standalone:
                if run:
                    text = self.convert_tokens_to_string(run)
                    if text:
                        pieces.append(text)
                    run = []
                pieces.append(token)
            else:
                run.append(token)
        if run:
            pieces.append(self.convert_tokens_to_string(run))
        text = (" " if spaces_between_special_tokens else "").join(pieces)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return self.clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    # ------------------------------------------------------------------------------------------------------ saving
    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        """The vocabulary as vocab.json ({symbol: id}, no pickle)."""
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_json_file"]
        path = os.path.join(save_directory, name) if os.path.isdir(save_directory) else save_directory
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.sym2idx, f, ensure_ascii=False, indent=0)
            f.write("\n")
        return (path,)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save, written to a temporary folder first and moved into `save_directory` file by file
        (each file is replaced whole; the model files already there are left alone). The vocabulary is vocab.json;
        the unk id is recorded, so a legacy vocabulary's behaviour survives; this file and txv_safe_pickle.py are
        copied for `trust_remote_code=True`."""
        if kwargs.get("push_to_hub"):
            return super().save_pretrained(save_directory, *args, **kwargs)
        target = Path(save_directory)
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tokenizer.", dir=target.parent))
        try:
            self.init_kwargs["unk_idx"] = self.unk_idx
            written = super().save_pretrained(staging, *args, **kwargs)
            for path in sorted(staging.iterdir()):
                os.replace(path, target / path.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return tuple(str(target / Path(path).name) for path in written)


__all__ = ["TransfoXLTokenizer", "read_legacy_vocabulary", "LEGACY_VOCAB_FILES"]
