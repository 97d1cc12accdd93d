"""The data pipeline of `txv train`: the byte, word and any-AutoTokenizer tokenizers, datasets with splits and columns,
the memory-mapped token cache (hit, rebuild on other data / another tokenizer, torn files) and the streams read from
it, with clear errors for bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_txvariants.training import TrainArgs, segment_stream, train
from hf_txvariants.training.corpus_tokenizers import CorpusEncoder, build_byte_tokenizer, build_word_tokenizer
from hf_txvariants.training.data import DataError, open_text_source, text_blocks
from hf_txvariants.training.models import ModelError
from hf_txvariants.training.token_cache import plan_corpus
from tiny_configs import TINY_TRAINING

TINY = {**{k: v for k, v in TINY_TRAINING.items() if k != "max_chars"}, "max_steps": 2}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------------------------------------------------
# the reference: kimiyoung/transformer-xl's `Vocab` (pytorch/utils/vocabulary.py), the parts `--tokenizer word` follows
class ReferenceVocab:
    def __init__(self, special=(), min_freq=0, max_size=None):
        self.counter = Counter()
        self.special, self.min_freq, self.max_size = list(special), min_freq, max_size

    @staticmethod
    def tokenize(line, add_eos=False):
        symbols = line.strip().split()
        return symbols + ["<eos>"] if add_eos else symbols

    def count_file(self, path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                self.counter.update(self.tokenize(line))

    def build_vocab(self):
        self.idx2sym, self.sym2idx = [], OrderedDict()
        for sym in self.special:
            self.add_symbol(sym)
        for sym, cnt in self.counter.most_common(self.max_size):
            if cnt < self.min_freq:
                break
            self.add_symbol(sym)

    def add_symbol(self, sym):
        if sym not in self.sym2idx:
            self.idx2sym.append(sym)
            self.sym2idx[sym] = len(self.idx2sym) - 1

    def encode_file(self, path):
        ids = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                ids.extend(self.sym2idx.get(s, self.sym2idx["<unk>"]) for s in self.tokenize(line, add_eos=True))
        return ids


def _write_corpus(path: Path, lines: int, seed: int) -> Path:
    """Zipf-like words (ties in the counts, words seen once), blank and space-padded lines, tabs, non-ASCII words."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)] + ["été", "日本", "naïve", "<unk>", "a-b", "3.14"]
    weights = [1.0 / (i + 1) for i in range(len(words))]
    out = []
    for _ in range(lines):
        if rng.random() < 0.1:
            out.append(rng.choice(["", " ", "\t"]))
            continue
        line = " ".join(rng.choices(words, weights, k=rng.randint(1, 25)))
        line = line.replace(" ", rng.choice([" ", "  ", "\t"]), 1)
        out.append(rng.choice(["", " ", "  "]) + line + rng.choice(["", " "]))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def _args(tmp_path, **fields) -> TrainArgs:
    return TrainArgs(output_dir=str(tmp_path / "run"), token_cache=str(tmp_path / "cache"), **fields)


# --------------------------------------------------------------------------------------------------------------------
# tokenizers
@pytest.mark.slow  # a clean subprocess
def test_byte_tokenizer_ids_are_the_utf8_bytes_and_load_without_the_plugin(tmp_path):
    tokenizer = build_byte_tokenizer()
    text = "héllo wörld\n\t<eos> 日本 \x00\x7f ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))  # the literal "<eos>" in the text stays bytes
    assert tokenizer.decode(ids) == text
    encoder = CorpusEncoder(tokenizer)
    assert encoder.utf8_bytes  # recognised: the corpus is encoded by str.encode ...
    assert encoder.encode(text).tolist() == ids
    encoder.utf8_bytes = False  # ... as its Rust pipeline encodes it
    assert encoder.encode(text + "<pad>\n" + text).tolist() == list((text + "<pad>\n" + text).encode("utf-8"))
    tokenizer.backend_tokenizer.encode_special_tokens = False  # "<eos>" would be a token: not the bytes any more
    assert not CorpusEncoder(tokenizer).utf8_bytes
    tokenizer.backend_tokenizer.encode_special_tokens = True
    assert len(tokenizer) == 258 and (tokenizer.eos_token_id, tokenizer.pad_token_id) == (256, 257)
    tokenizer.save_pretrained(tmp_path / "byte")
    (tmp_path / "text.txt").write_text(text, encoding="utf-8", newline="")
    check = (
        "import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "text = open(sys.argv[2], encoding='utf-8', newline='').read(); ids = t(text)['input_ids']; "
        "assert ids == list(text.encode()), ids; assert t.decode(ids) == text; "
        "assert not any(m.startswith('hf_txvariants') for m in sys.modules); print('ok')"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH="")
    result = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path / "byte"), str(tmp_path / "text.txt")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.stdout.strip() == "ok", result.stderr[-2000:]


def test_word_vocabulary_and_ids_match_the_original_vocab(tmp_path):
    train_file = _write_corpus(tmp_path / "train.txt", 400, seed=0)
    valid_file = _write_corpus(tmp_path / "valid.txt", 60, seed=1)
    for min_freq, max_size in ((0, None), (3, None), (0, 50), (2, 120)):
        reference = ReferenceVocab(special=["<eos>", "<unk>"], min_freq=min_freq, max_size=max_size)
        reference.count_file(train_file)
        reference.build_vocab()
        args = _args(
            tmp_path,
            data=str(train_file),
            valid_data=str(valid_file),
            tokenizer="word",
            vocab_min_freq=min_freq,
            vocab_max_size=max_size,
        )
        corpus = plan_corpus(args).prepare()
        assert corpus.tokenizer.idx2sym == reference.idx2sym, (min_freq, max_size)
        assert corpus.train_ids.tolist() == reference.encode_file(train_file)
        assert corpus.valid_ids.tolist() == reference.encode_file(valid_file)
    assert len(set(reference.idx2sym)) < len(set(Counter(train_file.read_text().split())))  # some words became <unk>


@pytest.mark.parametrize("processes", [1, 2, 3])
@pytest.mark.parametrize(("min_freq", "max_size"), [(0, None), (2, None), (0, 7), (2, 9)])
def test_one_pass_word_numbering_equals_counting_then_encoding(tmp_path, min_freq, max_size, processes):
    """`WordNumbering` reads the training text once, its blocks shared by `processes`; the reference counts it (the
    original's Counter, line by line) and then encodes it with the built tokenizer. Many small blocks (a placeholder
    per block; words first met in a block of another process), words that look like the line-end placeholder (NUL
    characters) and a literal `<eos>`, which the original counts as a word, and counts that tie at the `max_size`
    boundary."""
    from hf_txvariants.training.corpus_tokenizers import WordNumbering

    rng = random.Random(min_freq * 100 + (max_size or 0))
    words = ["a", "b", "c", "d", "e", "f", "<eos>", "<unk>", "\x00", "\x00\x00", "x\x00y", "été", "g", "h"]
    words += [f"w{i}" for i in range(40)]  # rarer words, first met in later blocks
    weights = [1.0 / (i + 1) ** 0.5 for i in range(len(words))]
    lines = [" ".join(rng.choices(words, weights, k=rng.randint(0, 6))) for _ in range(300)]
    text = "\n".join(lines) + "\n"
    blocks, position = [], 0
    while position < len(text):  # blocks ending at a line end, of 1 to 5 lines
        end = position
        for _ in range(rng.randint(1, 5)):
            end = text.find("\n", end) + 1 or len(text)
        blocks.append(text[position:end])
        position = end
    reference = ReferenceVocab(special=["<eos>", "<unk>"], min_freq=min_freq, max_size=max_size)
    for line in text.splitlines(keepends=True):
        reference.counter.update(reference.tokenize(line))
    reference.build_vocab()
    expected = [reference.sym2idx.get(s, 1) for line in lines for s in reference.tokenize(line, add_eos=True)]

    numbering = WordNumbering(iter(blocks), tmp_path, min_freq, max_size, processes)
    try:
        assert numbering.tokenizer.idx2sym == reference.idx2sym
        assert np.concatenate(list(numbering.token_ids(np.int32))).tolist() == expected
        encoder = CorpusEncoder(numbering.tokenizer)
        assert np.concatenate([encoder.encode(block) for block in blocks]).tolist() == expected
    finally:
        numbering.close()
    assert not list(tmp_path.iterdir())  # the numbers' temporary file leaves nothing behind


def test_word_tokenizer_saves_as_transfo_xl_and_reloads_with_the_same_ids(tmp_path):
    from transformers import AutoTokenizer

    import hf_txvariants  # noqa: F401  (registers TransfoXLTokenizer)

    tokenizer = build_word_tokenizer(["the cat sat\non the mat\n\nthe end"])
    tokenizer.save_pretrained(tmp_path / "word")
    assert json.loads((tmp_path / "word" / "vocab.json").read_text()) == tokenizer.sym2idx
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "word")
    assert type(reloaded).__name__ == "TransfoXLTokenizer" and reloaded.whitespace_split
    line = "the dog sat on the mat"  # split at whitespace as the corpus was; "dog" is unknown
    assert reloaded.tokenize(line) == line.split()
    assert reloaded(line)["input_ids"] == [tokenizer.sym2idx.get(w, tokenizer.sym2idx["<unk>"]) for w in line.split()]
    assert reloaded.decode(reloaded(line)["input_ids"]) == "the <unk> sat on the mat"
    assert CorpusEncoder(reloaded).fingerprint == CorpusEncoder(tokenizer).fingerprint  # a resumed run hits the cache


def test_a_word_outside_a_vocabulary_without_unk_is_named(tmp_path):
    from hf_txvariants.tokenization_transfo_xl import TransfoXLTokenizer

    (tmp_path / "vocab.json").write_text(json.dumps({"<eos>": 0, "the": 1, "cat": 2}))
    tokenizer = TransfoXLTokenizer(vocab_json_file=str(tmp_path / "vocab.json"), additional_special_tokens=[])
    assert CorpusEncoder(tokenizer).encode("the cat\nthe\n").tolist() == [1, 2, 0, 1, 0]
    with pytest.raises(DataError, match="the word 'dog' is not in the tokenizer's vocabulary, which has no <unk>"):
        CorpusEncoder(tokenizer).encode("the dog\n")


def _tiny_bpe_folder(folder: Path, text: str) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        [text],
        trainers.BpeTrainer(
            vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


def test_a_saved_bpe_tokenizer_folder_trains_with_the_trainer_path(tmp_path):
    from transformers import AutoTokenizer

    from hf_txvariants.training.data import default_corpus
    from hf_txvariants.training.trainer import train_with_trainer

    folder = _tiny_bpe_folder(tmp_path / "bpe", default_corpus()[:50_000])
    text_file = tmp_path / "text.txt"
    text_file.write_text(default_corpus()[50_000:70_000])
    args = _args(tmp_path, data=str(text_file), tokenizer=str(folder), save_model=True, **{**TINY, "max_steps": 2})
    corpus = plan_corpus(args).prepare()
    bpe = AutoTokenizer.from_pretrained(folder)
    start, stop = plan_corpus(args).train.bounds()
    assert corpus.train_ids.tolist() == bpe(text_file.read_text()[start:stop], add_special_tokens=False)["input_ids"]
    metrics = train_with_trainer(args)
    assert np.isfinite(metrics["eval_loss"])
    assert AutoTokenizer.from_pretrained(tmp_path / "run" / "model").get_vocab() == bpe.get_vocab()


# --------------------------------------------------------------------------------------------------------------------
# end to end
def test_word_level_training_with_an_adaptive_softmax(tmp_path):
    args = _args(
        tmp_path,
        tokenizer="word",
        vocab_max_size=300,
        max_chars=40_000,
        extra_config={"cutoffs": [50, 150], "div_val": 2},
        **TINY,
    )
    result = train(args)
    assert result["config"].vocab_size == len(result["tokenizer"]) == 302  # <eos>, <unk>, 300 words
    assert type(result["tokenizer"]).__name__ == "TransfoXLTokenizer"
    assert result["config"].cutoffs == [50, 150] and np.isfinite(result["eval"][-1]["bpc"])
    too_large = _args(
        tmp_path, tokenizer="word", vocab_max_size=300, max_chars=40_000, extra_config={"cutoffs": [50, 400]}, **TINY
    )
    with pytest.raises(ModelError, match=r"cutoffs must be below vocab_size \(302\), got \[50, 400\]"):
        train(too_large)


def test_byte_level_training_and_a_tokenizer_larger_than_the_model(tmp_path):
    result = train(_args(tmp_path, tokenizer="byte", max_chars=20_000, **TINY))
    assert result["config"].vocab_size == 258 and result["config"].eos_token_id == 256
    assert np.isfinite(result["eval"][-1]["bpc"])
    char_model = train(_args(tmp_path, max_chars=20_000, save_model=True, **{**TINY, "max_steps": 1}))
    smaller = char_model["config"].vocab_size
    with pytest.raises(ModelError, match=f"the tokenizer has 258 tokens but .* has vocab_size {smaller}"):
        train(_args(tmp_path, model=char_model["model_dir"], tokenizer="byte", max_chars=20_000, **TINY))


# --------------------------------------------------------------------------------------------------------------------
# the cache
@pytest.mark.parametrize("tokenizer", [None, "word"])
def test_a_resumed_run_maps_the_ids_of_its_first_start(tmp_path, tokenizer):
    import dataclasses

    args = _args(tmp_path, tokenizer=tokenizer, max_chars=20_000, save_model=False, **TINY)
    train(args)
    cache = tmp_path / "cache"
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    train(dataclasses.replace(args, max_steps=3, resume="latest"))  # the checkpoint's tokenizer, the same ids
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before


def test_cache_is_reused_and_rebuilt_for_other_data_another_tokenizer_or_a_torn_file(tmp_path):
    data = _write_corpus(tmp_path / "train.txt", 300, seed=2)
    args = _args(tmp_path, data=str(data), tokenizer="word")
    warnings, informed = [], []
    first = plan_corpus(args).prepare(warn=warnings.append, inform=informed.append)
    ids_file = next(f for f in first.files if "-train-" in f.name)
    assert len(informed) == 3 and not warnings  # vocabulary, training ids, validation ids
    informed.clear()
    again = plan_corpus(args).prepare(warn=warnings.append, inform=informed.append)
    assert not informed and not warnings and np.array_equal(again.train_ids, first.train_ids)  # a hit: nothing built
    assert isinstance(again.train_ids, np.memmap) and again.train_ids.dtype == np.uint16

    # the data changed: vocabulary and ids rebuilt, and said
    _write_corpus(data, 320, seed=3)
    changed = plan_corpus(args).prepare(warn=warnings.append)
    assert len(warnings) == 3 and all("other data" in w for w in warnings), warnings
    assert not np.array_equal(changed.train_ids[: len(first.train_ids)], first.train_ids)

    # a torn ids file, an unreadable header: rebuilt, and said
    warnings.clear()
    with open(ids_file, "r+b") as f:
        f.truncate(ids_file.stat().st_size - 2)
    plan_corpus(args).prepare(warn=warnings.append)
    assert len(warnings) == 1 and "torn" in warnings[0] and ids_file.name in warnings[0]
    header = ids_file.with_suffix(".json")
    header.write_text('{"data": ')
    warnings.clear()
    rebuilt = plan_corpus(args).prepare(warn=warnings.append)
    assert len(warnings) == 1 and "unreadable" in warnings[0]
    assert np.array_equal(rebuilt.train_ids, changed.train_ids)

    # the same tokenizer folder with other contents: another tokenizer, rebuilt
    folder = _tiny_bpe_folder(tmp_path / "bpe", data.read_text())
    bpe_args = _args(tmp_path, data=str(data), tokenizer=str(folder))
    plan_corpus(bpe_args).prepare()
    _tiny_bpe_folder(folder, data.read_text()[:3000])
    warnings.clear()
    plan_corpus(bpe_args).prepare(warn=warnings.append)
    assert len(warnings) == 2 and all("another tokenizer" in w for w in warnings)
    assert not list((tmp_path / "cache").glob(".*"))  # no temporary file left behind


@pytest.mark.exact
def test_memory_mapped_stream_gives_the_segments_of_the_in_memory_stream(tmp_path):
    corpus = plan_corpus(_args(tmp_path, tokenizer="byte", max_chars=30_000)).prepare()
    ids = corpus.train_ids
    in_memory = torch.tensor(np.asarray(ids), dtype=torch.long)
    for rank in range(2):
        mapped = segment_stream(ids, 4, 32, rank=rank, world_size=2)
        assert mapped.tokens.data_ptr() == ids.ctypes.data  # the map itself, not a copy of the corpus
        loaded = segment_stream(in_memory, 4, 32, rank=rank, world_size=2)
        assert mapped.num_segments == loaded.num_segments
        for step in (0, 1, mapped.num_segments - 1, mapped.num_segments):
            for a, b in zip(mapped.segment(step), loaded.segment(step)):
                assert a.dtype == torch.long and torch.equal(a, b)


# --------------------------------------------------------------------------------------------------------------------
# datasets
def _parquet_dataset(folder: Path) -> Path:
    import datasets

    folder.mkdir()
    datasets.Dataset.from_dict(
        {"text": [" = Title = \n", "", " first line of text \n", "second line\n"] * 40, "id": list(range(160))}
    ).to_parquet(str(folder / "train.parquet"))
    datasets.Dataset.from_dict({"text": ["valid words here\n", ""] * 30, "id": list(range(60))}).to_parquet(
        str(folder / "validation.parquet")
    )
    return folder


def test_a_dataset_folder_with_splits_and_columns(tmp_path):
    folder = _parquet_dataset(tmp_path / "ds")
    args = _args(tmp_path, data=str(folder), valid_split="validation", tokenizer="word")
    corpus = plan_corpus(args).prepare()
    vocab = corpus.tokenizer.sym2idx
    # each row is a line (its own newline dropped), each line ends in <eos>, as the original files' lines
    expected_train = []
    for row in [" = Title = \n", "", " first line of text \n", "second line\n"] * 40:
        expected_train += [vocab[w] for w in row.split()] + [vocab["<eos>"]]
    assert corpus.train_ids.tolist() == expected_train
    assert corpus.valid_ids.tolist() == ([vocab["<unk>"]] * 3 + [vocab["<eos>"]] * 2) * 30
    source = open_text_source(str(folder), split="validation", split_flag="--valid-split")
    assert "".join(text_blocks(source)).startswith("valid words here\n\nvalid words here\n")

    with pytest.raises(
        DataError,
        match=r"has no split 'test' \(its splits: train, validation\); choose one with "
        r"--valid-split",
    ):
        plan_corpus(_args(tmp_path, data=str(folder), valid_split="test"))
    with pytest.raises(DataError, match=r"no column 'content' \(columns: text, id\); choose one with --text-column"):
        plan_corpus(_args(tmp_path, data=str(folder), text_column="content"))
    with pytest.raises(DataError, match="column 'id' holds int values, not text"):
        plan_corpus(_args(tmp_path, data=str(folder), text_column="id")).prepare()


def test_a_saved_dataset_dict_and_a_hub_name_offline(tmp_path):
    import datasets

    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a b c"] * 50}),
            "dev": datasets.Dataset.from_dict({"text": ["a b"] * 50}),
        }
    ).save_to_disk(str(tmp_path / "dd"))
    corpus = plan_corpus(_args(tmp_path, data=str(tmp_path / "dd"), valid_split="dev", tokenizer="byte")).prepare()
    assert bytes(np.asarray(corpus.valid_ids, dtype=np.uint8)) == b"a b\n" * 50
    with pytest.raises(DataError, match=r"has no split 'validation' \(its splits: train, dev\)"):
        plan_corpus(_args(tmp_path, data=str(tmp_path / "dd"), valid_split="validation"))
    with pytest.raises(DataError, match="could not load the dataset no-such-dataset-xyz"):
        plan_corpus(_args(tmp_path, data="no-such-dataset-xyz", data_config="raw"))


def test_bad_flags_are_named():
    with pytest.raises(DataError, match="--vocab-min-freq / --vocab-max-size apply to --tokenizer word"):
        TrainArgs(tokenizer="byte", vocab_max_size=10)
    with pytest.raises(DataError, match="--vocab-max-size must be an integer >= 1"):
        TrainArgs(tokenizer="word", vocab_max_size=0)
    with pytest.raises(ModelError, match="could not load the tokenizer from --tokenizer /no/such/folder"):
        plan_corpus(TrainArgs(tokenizer="/no/such/folder"))
