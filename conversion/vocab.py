"""The original Transformer-XL vocabularies (cache.pkl / cache.pt) as a fast tokenizer, without running pickles.

``cache.pkl`` (TF code) is a Python 2, protocol 2 pickle of ``data_utils.Corpus`` holding a
``vocabulary.Vocab``; ``cache.pt`` (PyTorch code) is the same object saved with ``torch.save``. Both are read
with the restricted unpickler (conversion/safe_pickle.py): the Vocab's recorded state (``idx2sym``,
``lower_case``, ``delimiter``, ``special``) is all that is used; the encoded corpus arrays are not loaded.

The tokenizer (tokenizers' ``tokenizer.json``, loaded with ``AutoTokenizer`` and no pickle at all) keeps the
original ids and the original's rules:

* word level (wt103, lm1b, ptb...): split on whitespace, lower-case if the Vocab did, unknown words ->
  ``<unk>``/``<UNK>``; for corpora trained with an ``<eos>`` per line (wt103), a newline becomes ``<eos>``.
  lm1b wrapped every sentence as ``<S> ... <S>``: conversion.evaluate does that per line.
* character level: text8 (letters, ``_`` for a space) and enwik8 (one token per byte of the UTF-8 text, the
  symbols being the byte values "0".."255"; newlines are dropped, as the original preprocessing did).
"""

from __future__ import annotations

import os

from .errors import ConversionError
from .safe_pickle import VOCAB_CLASSES, PickledObject, is_torch_file, load_plain_pickle, load_torch_file

__all__ = ["read_vocab", "build_tokenizer", "convert_vocab"]


def _text(x):
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError:
            return x.decode("latin1")
    return x


def read_vocab(path):
    """-> dict(idx2sym, lower_case, delimiter, special, dataset) from a cache.pkl / cache.pt, safely."""
    path = os.fspath(path)
    if is_torch_file(path):
        obj = load_torch_file(path, classes=VOCAB_CLASSES, load_tensors=False, numpy_stubs=True)
    else:
        obj = load_plain_pickle(path, classes=VOCAB_CLASSES, encoding="bytes")
    dataset = None
    if isinstance(obj, PickledObject) and obj.name == "Corpus":
        dataset = _text(obj.get("dataset"))
        obj = obj.get("vocab")
    if not isinstance(obj, PickledObject) or obj.name != "Vocab":
        raise ConversionError(f"{path}: expected a pickled data_utils.Corpus or vocabulary.Vocab, found {obj!r}")
    idx2sym = obj.get("idx2sym")
    if not isinstance(idx2sym, list) or not idx2sym:
        raise ConversionError(f"{path}: the Vocab has no idx2sym list (was build_vocab() run?)")
    idx2sym = [_text(s) for s in idx2sym]
    if len(set(idx2sym)) != len(idx2sym):
        raise ConversionError(f"{path}: duplicate symbols in the vocabulary")
    delimiter = obj.get("delimiter")
    return dict(
        idx2sym=idx2sym,
        lower_case=bool(obj.get("lower_case", True)),
        delimiter=_text(delimiter) if delimiter is not None else None,
        special=[_text(s) for s in obj.get("special") or []],
        dataset=dataset,
        vocab_file=_text(obj.get("vocab_file")),
    )


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table, the one tokenizers' ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _kind(info, dataset=None):
    ds = dataset or info.get("dataset")
    syms = info["idx2sym"]
    if ds == "enwik8" or (ds is None and all(s.isdigit() and int(s) < 256 for s in syms) and len(syms) <= 256):
        return "enwik8"
    if ds == "text8" or (ds is None and all(len(s) == 1 for s in syms)):
        return "text8"
    if info.get("delimiter") == "":
        return "chars"
    return "lm1b" if ds == "lm1b" or "<S>" in syms else "word"


def build_tokenizer(info, dataset=None):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = _kind(info, dataset)
    syms = info["idx2sym"]
    vocab = {s: i for i, s in enumerate(syms)}
    special = {}
    norms = []
    if kind == "enwik8":
        b2u = _bytes_to_unicode()
        vocab = {b2u[int(s)]: i for i, s in enumerate(syms)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.normalizer = normalizers.Replace("\n", "")  # the original preprocessing drops newline bytes
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
            ]
        )
        tok.decoder = decoders.ByteLevel()
    elif kind in ("text8", "chars"):
        unk = next((u for u in ("<unk>", "<UNK>") if u in vocab), "<unk>")
        tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
        if info["lower_case"]:
            norms.append(normalizers.Lowercase())
        norms.append(normalizers.Replace(Regex(r"[\r\n]"), ""))
        if kind == "text8":
            norms.append(normalizers.Replace(" ", "_"))
        tok.normalizer = normalizers.Sequence(norms)
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Sequence(([decoders.Replace("_", " ")] if kind == "text8" else []) + [decoders.Fuse()])
    else:
        unk = next((u for u in ("<unk>", "<UNK>") if u in vocab), None)
        tok = Tokenizer(models.WordLevel(vocab, unk_token=unk or "<unk>"))
        if unk:
            special["unk_token"] = unk
        if info["lower_case"]:
            norms.append(normalizers.Lowercase())
        if kind == "word" and "<eos>" in vocab:
            norms.append(normalizers.Replace("\n", " <eos> "))  # the original appends <eos> to every line
            special["eos_token"] = "<eos>"
        if kind == "lm1b":
            special["bos_token"] = special["eos_token"] = "<S>"
        if norms:
            tok.normalizer = normalizers.Sequence(norms)
        if info.get("delimiter") not in (None, " "):
            tok.pre_tokenizer = pre_tokenizers.Split(info["delimiter"], behavior="removed")
        else:
            tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        # Every word decodes with the space before it, so a continuation decoded alone (as the text-generation
        # pipeline does) does not stick to the prompt: "w1 w2" + " w3 w4".
        tok.decoder = decoders.Sequence([decoders.Replace(Regex("^"), " "), decoders.Fuse()])
    # A pad token for batching (pipelines refuse to batch without one). The vocabulary is the checkpoint's, so an
    # existing special token pads (masked out by the attention mask): <eos>, else <unk>. A vocabulary with neither
    # (raw bytes) gets none: a real character as pad would be dropped from decoded text.
    pad = special.get("eos_token") or next((u for u in ("<unk>", "<UNK>") if u in vocab), None)
    if pad is not None:
        special["pad_token"] = pad
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, clean_up_tokenization_spaces=False, padding_side="left", **special
    )
    fast.model_input_names = ["input_ids"]
    fast.init_kwargs["txv_vocab_kind"] = kind
    # special tokens must keep their original ids
    for name, token in special.items():
        if fast.convert_tokens_to_ids(token) != vocab[token]:
            raise ConversionError(f"{name} {token!r} changed id while building the tokenizer")
    if len(fast) != len(syms):
        raise ConversionError(f"tokenizer has {len(fast)} tokens, the vocabulary {len(syms)}")
    return fast, kind


def convert_vocab(path, dataset=None):
    info = read_vocab(path)
    tokenizer, kind = build_tokenizer(info, dataset)
    info["kind"] = kind
    eos = None
    if kind == "word" and "<eos>" in info["idx2sym"]:
        eos = info["idx2sym"].index("<eos>")
    elif kind == "lm1b":
        eos = info["idx2sym"].index("<S>")
    info["eos_token_id"] = eos
    return tokenizer, info
