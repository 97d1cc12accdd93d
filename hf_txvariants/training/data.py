"""Text data for language-model training: loading text with `datasets`, a character-level tokenizer, and the
contiguous ordered segment streams Transformer-XL is trained on (Dai et al. 2019, and the original `LMOrderedIterator`).

The token stream of a split is cut into `global_batch` contiguous rows; data-parallel rank r of W owns the rows
`[r * B / W, (r + 1) * B / W)`. Step i gives every row its i-th segment, so the memory a row carries from step i to
step i + 1 is the context that really precedes the next segment, on one process or many."""

from __future__ import annotations

import contextlib
import gzip
import math
import random
import re
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<unk>", "<eos>")


class DataError(ValueError):
    """Bad user data (missing file, corpus too short ...); the CLI prints its message on one line."""


# --------------------------------------------------------------------------------------------------------------------
# text
def default_corpus() -> str:
    """The embedded demo corpus: docstrings of the Python standard library (see corpus/make_default_corpus.py)."""
    return gzip.decompress(_embedded_corpus_file()).decode("utf-8")


def _embedded_corpus_file() -> bytes:
    return resources.files("hf_txvariants.training").joinpath("corpus/default_corpus.txt.gz").read_bytes()


# Text is read in pieces and handed on in blocks of about this many characters, each ending at a line end where
# possible: the corpus is never one Python string (see token_cache.py).
BLOCK_CHARS = 1 << 22
FILE_READ_CHARS = 1 << 20
DATASET_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}
# suffixes that make a --data that does not exist a missing file rather than a Hub dataset name
FILE_SUFFIXES = {".txt", ".text", ".raw", ".tokens", ".gz", ".bz2", ".xz", ".zip", *DATASET_FORMATS}


@dataclass
class TextSource:
    """Text that is read in bounded memory: `pieces()` yields it in order, in pieces of at most a few MB.

    `description` names it in messages, `identity` names it for the token cache (what it is: paths, dataset name,
    config, split, column) and `fingerprint()` says what it holds now (file sizes and content hashes of their first
    and last MB; a dataset's own fingerprint), so that a cache made from other data is recognised."""

    description: str
    identity: dict
    files: list | None = None  # text files, joined with newlines
    dataset: object | None = None  # a `datasets.Dataset`: the rows of `column` are the lines of the text
    column: str = "text"
    embedded: bool = False

    def pieces(self):
        if self.embedded:
            yield default_corpus()
        elif self.files is not None:
            yield from self._file_pieces()
        else:
            yield from self._row_pieces()

    def _file_pieces(self):
        for index, path in enumerate(self.files):
            if index:
                yield "\n"
            try:
                with open(path, encoding="utf-8") as f:  # universal newlines, as the original readers
                    while piece := f.read(FILE_READ_CHARS):
                        yield piece
            except UnicodeDecodeError as error:
                raise DataError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start} of a block)") from None
            except OSError as error:
                raise DataError(f"cannot read {path}: {error.strerror or error}") from None

    def _row_pieces(self):
        """Each row is one line: its own trailing newline (if any) is dropped and every line ends with a newline (so
        the Hub's wikitext, a row per line of the original files, gives the original files' lines)."""
        rows = self.dataset.select_columns([self.column])
        for batch in rows.iter(batch_size=10_000):
            lines = batch[self.column]
            for line in lines:
                if not isinstance(line, str):
                    raise DataError(
                        f"{self.description}: column {self.column!r} holds {type(line).__name__} values, not text"
                    )
            yield "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def fingerprint(self) -> str:
        import hashlib

        digest = hashlib.sha256()
        if self.embedded:
            digest.update(_embedded_corpus_file())
        elif self.files is not None:
            for path in self.files:
                size = path.stat().st_size
                digest.update(f"{path}:{size}:".encode())
                with open(path, "rb") as f:
                    digest.update(f.read(1 << 20))
                    if size > 2 << 20:
                        f.seek(size - (1 << 20))
                        digest.update(f.read())
        else:
            digest.update(f"{self.dataset._fingerprint}:{self.column}".encode())
        return digest.hexdigest()


def _quiet_datasets():
    """datasets' progress bars off while it loads (restored after)."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    @contextlib.contextmanager
    def quiet():
        was_quiet = are_progress_bars_disabled()
        disable_progress_bars()
        try:
            yield
        finally:
            if not was_quiet:
                enable_progress_bars()

    return quiet()


def _pick_split(dataset, name: str, split: str | None, split_flag: str):
    """The split `split` (None: "train") of a DatasetDict, or a Dataset that has no splits (only `split` None)."""
    import datasets

    if isinstance(dataset, datasets.DatasetDict):
        wanted = split or "train"
        if wanted not in dataset:
            raise DataError(
                f"dataset {name} has no split {wanted!r} (its splits: {', '.join(dataset)}); "
                f"choose one with {split_flag}"
            )
        return dataset[wanted], wanted
    if split is not None:
        raise DataError(f"dataset {name} has no splits (one table), so {split_flag} {split} does not apply")
    return dataset, None


def open_text_source(
    source: str | Path | None = None,
    text_column: str = "text",
    data_config: str | None = None,
    split: str | None = None,
    split_flag: str = "--train-split",
) -> TextSource:
    """The text of `source`: None (the embedded corpus), a text file, a folder of text files (joined with newlines),
    a folder saved with `datasets` `save_to_disk`, a parquet / JSON / CSV / arrow file or a folder of them, or a Hub
    dataset name (with `data_config`), read with `datasets.load_dataset`. For datasets, `split` (default "train")
    picks the split and `text_column` the column whose rows are the lines of the text. Bad input is a `DataError`
    naming the file, split or column (with the ones that exist)."""
    if source is None:
        if data_config is not None or split is not None:
            raise DataError(f"--data-config / {split_flag} apply to a dataset given with --data")
        return TextSource("the embedded corpus", {"embedded": True}, embedded=True)
    name = str(source)
    path = Path(source)
    import datasets

    if path.exists():
        path = path.resolve()
        if path.is_dir() and any((path / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
            with _quiet_datasets():
                try:
                    dataset = datasets.load_from_disk(str(path))
                except Exception as error:  # datasets raises many types for a damaged folder
                    raise DataError(f"could not read the saved dataset {path}: {_first_line(error)}") from None
            return _dataset_source(dataset, str(path), {"saved": str(path)}, text_column, split, split_flag)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        files = [
            f
            for f in files
            if not any(part.startswith(".") for part in (f.relative_to(path).parts if path.is_dir() else (f.name,)))
        ]
        if not files:
            raise DataError(f"no text files found in {path}")
        formats = {DATASET_FORMATS.get(f.suffix.lower()) for f in files}
        if formats == {None}:  # plain text
            if data_config is not None or split is not None:
                raise DataError(f"{path} is text, not a dataset: --data-config / {split_flag} do not apply")
            return TextSource(str(path), {"files": [str(f) for f in files]}, files=files)
        if len(formats) > 1:
            raise DataError(f"{path} mixes data formats ({sorted(str(f) for f in formats)}): give one kind of file")
        if path.is_dir():  # datasets finds the splits from the file names (train.parquet, validation-*.json ...)
            loader_args = ((str(path), data_config), {})
        else:
            loader_args = ((formats.pop(),), {"data_files": [str(f) for f in files]})
    elif (
        Path(name).is_absolute()
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or "\\" in name
        or Path(name).suffix.lower() in FILE_SUFFIXES
    ):  # a path (a Hub dataset is `name` or `owner/name`, without a file suffix)
        raise DataError(f"data file not found: {path}")
    else:  # a Hub dataset name
        loader_args = ((name, data_config), {})
    with _quiet_datasets():
        try:
            dataset = datasets.load_dataset(*loader_args[0], **loader_args[1])
        except Exception as error:  # offline, unknown name or config, unreadable files: one line naming the source
            raise DataError(
                f"could not load the dataset {name}"
                + (f" (config {data_config})" if data_config else "")
                + f": {_first_line(error)}"
            ) from None
    identity = {"dataset": str(path) if path.exists() else name, "config": data_config}
    return _dataset_source(dataset, name, identity, text_column, split, split_flag)


def _dataset_source(dataset, name, identity, text_column, split, split_flag) -> TextSource:
    dataset, split_name = _pick_split(dataset, name, split, split_flag)
    if text_column not in dataset.column_names:
        raise DataError(
            f"dataset {name}{f' split {split_name!r}' if split_name else ''} has no column {text_column!r} "
            f"(columns: {', '.join(dataset.column_names)}); choose one with --text-column"
        )
    description = f"{name}" + (f" [{split_name}]" if split_name else "")
    return TextSource(
        description, {**identity, "split": split_name, "column": text_column}, dataset=dataset, column=text_column
    )


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


_LAST_SPACE = re.compile(r"\s(?=\S*\Z)")


def text_blocks(source: TextSource, start: int = 0, stop: int | None = None, block_chars: int = BLOCK_CHARS):
    """The characters [start, stop) of `source`'s text in blocks of about `block_chars`, each ending at a line end
    (else at a space; a longer run without either is cut at the block size), so no line or word is split between
    two blocks where avoidable. Memory: one block."""
    position, buffer, size = 0, [], 0
    for piece in source.pieces():
        end = position + len(piece)
        low, high = max(start - position, 0), len(piece) if stop is None else min(len(piece), stop - position)
        position = end
        if low < high:
            piece = piece[low:high]
            buffer.append(piece)
            size += len(piece)
        if size >= block_chars:
            text = "".join(buffer)
            cut = text.rfind("\n") + 1
            if not cut:
                space = _LAST_SPACE.search(text)
                cut = space.end() if space else len(text)
            yield text[:cut]
            buffer, size = [text[cut:]], len(text) - cut
        if stop is not None and position >= stop:
            break
    if size:
        yield "".join(buffer)


def count_chars(source: TextSource, stop: int | None = None) -> int:
    """The number of characters of `source`'s text (at most `stop`), read in pieces."""
    total = 0
    for piece in source.pieces():
        total += len(piece)
        if stop is not None and total >= stop:
            return stop
    return total


def load_text(
    source: str | Path | None = None,
    text_column: str = "text",
    data_config: str | None = None,
    split: str | None = None,
) -> str:
    """The whole text of `source` as one string (see `open_text_source`; for small texts: training streams it into
    the token cache instead)."""
    return "".join(text_blocks(open_text_source(source, text_column, data_config, split)))


def split_text(text: str, valid_fraction: float) -> tuple[str, str]:
    """Training and validation text: the last `valid_fraction` of the characters is held out."""
    if not 0.0 < valid_fraction < 1.0:
        raise DataError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    cut = int(len(text) * (1.0 - valid_fraction))
    return text[:cut], text[cut:]


# --------------------------------------------------------------------------------------------------------------------
# tokenizer
def build_char_tokenizer(text, max_vocab: int | None = None):
    """A character-level `PreTrainedTokenizerFast` (a `tokenizers` WordLevel model over single characters): every
    character of `text` (a string, or an iterable of string blocks: counted block by block; the most frequent
    `max_vocab` if given) plus `<unk>` and `<eos>`, and `<pad>` as the last id
    (so that pipelines can batch; the characters keep the ids they had before `<pad>` existed); saved with the
    model. Padding is on the left, where a causal LM's next token is the last position of every row."""
    from collections import Counter

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    counts = Counter()
    for block in [text] if isinstance(text, str) else text:
        counts.update(block)
    if not counts:
        raise DataError("cannot build a tokenizer from empty text")
    chars = sorted(c for c, _ in counts.most_common(max_vocab)) if max_vocab else sorted(counts)
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in chars:
        vocab.setdefault(char, len(vocab))
    vocab.setdefault("<pad>", len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<pad>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def encode(tokenizer, text: str, chunk: int = 65536) -> torch.Tensor:
    """The whole text as one 1-D LongTensor of token ids (encoded in chunks, in parallel)."""
    backend = tokenizer.backend_tokenizer
    pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
    ids = [i for encoding in backend.encode_batch(pieces, add_special_tokens=False) for i in encoding.ids]
    return torch.tensor(ids, dtype=torch.long)


# --------------------------------------------------------------------------------------------------------------------
# segment streams
def as_token_tensor(tokens) -> torch.Tensor:
    """A 1-D token sequence as a tensor without copying: a tensor as is, a numpy array (a memory-mapped token cache
    included, see token_cache.py) through `torch.from_numpy`, anything else (a list) through `torch.tensor`."""
    if isinstance(tokens, torch.Tensor):
        return tokens
    import numpy as np

    if isinstance(tokens, np.ndarray):
        if not tokens.flags.writeable:
            # a read-only memory map: torch warns that writing would be undefined; the streams only slice and copy
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
                return torch.from_numpy(tokens)
        return torch.from_numpy(tokens)
    return torch.tensor(tokens, dtype=torch.long)


# How a training stream walks its rows, as each original trainer does (both cut the corpus into `global_batch` rows
# of `len(tokens) // global_batch` tokens, the remainder dropped):
# * "transformer-xl": kimiyoung/transformer-xl's `LMOrderedIterator` (pytorch/data_utils.py) under train.py: segments
#   at 0, seg_len, 2 seg_len, ... of every row, the last one shorter (it ends at the row's last token, which is only
#   a target); then the next epoch starts again at 0 with the memory emptied (train.py's `mems = tuple()`).
# * "adaptive-span": facebookresearch/adaptive-span's `train_iteration` (trainer.py): whole segments only; once the
#   next one would not fit, a new pass starts at a random offset below seg_len (`random.randrange`, here from
#   `random.Random(seed)`) with the memory zeroed.
DATA_ORDERS = ("transformer-xl", "adaptive-span")


@dataclass(frozen=True)
class SegmentPlan:
    """Where step `step` of a stream reads: `length` tokens of every row from `start`, and whether the memory starts
    afresh there (the first step of a pass)."""

    start: int
    length: int
    fresh_memory: bool


@dataclass
class SegmentStream:
    """The rows of one rank, read from `tokens` (1-D; a memory-mapped cache is never copied whole: each segment
    gathers its rows' slices): row r is `tokens[offsets[r] : offsets[r] + row_length]`, and step i reads the
    segment `plan(i)` of every row with its next-token targets (see DATA_ORDERS). Iterating gives one pass of
    evaluation segments from the start of the rows: every segment of the first pass ("transformer-xl", whose
    evaluation reads the whole text) or the whole segments ("adaptive-span", whose `full_eval` skips the rest).
    Segments come out as int64."""

    tokens: torch.Tensor
    offsets: list[int]
    row_length: int
    seg_len: int
    order: str = "transformer-xl"
    seed: int = 0

    def __post_init__(self):
        if self.order not in DATA_ORDERS:
            raise DataError(f"data order must be one of {', '.join(DATA_ORDERS)}, got {self.order!r}")
        self._plans: list[SegmentPlan] = []  # "adaptive-span": the plans made so far, step by step
        self._random = random.Random(self.seed)
        self._next_start, self._next_fresh = 0, True

    @property
    def num_rows(self) -> int:
        return len(self.offsets)

    @property
    def num_segments(self) -> int:
        """The segments of one pass from the start of the rows (an epoch of "transformer-xl")."""
        if self.order == "transformer-xl":
            return -(-(self.row_length - 1) // self.seg_len)
        return (self.row_length - 1) // self.seg_len

    @property
    def rows(self) -> torch.Tensor:
        """All rows at once, `[num_rows, row_length]` (a copy of the rank's part of the corpus: for small streams)."""
        return torch.stack([self.tokens[o : o + self.row_length] for o in self.offsets]).long()

    def window(self, row: int, start: int, length: int) -> torch.Tensor:
        """`length` tokens of row `row` from position `start` (int64)."""
        offset = self.offsets[row] + start
        return self.tokens[offset : offset + length].long()

    def plan(self, step: int) -> SegmentPlan:
        """Where training step `step` (from 0) reads."""
        if self.order == "transformer-xl":
            index = step % self.num_segments
            start = index * self.seg_len
            return SegmentPlan(start, min(self.seg_len, self.row_length - 1 - start), index == 0)
        while len(self._plans) <= step:  # the random offsets of later passes depend on the ones before
            self._plans.append(SegmentPlan(self._next_start, self.seg_len, self._next_fresh))
            self._next_start, self._next_fresh = self._next_start + self.seg_len, False
            if self._next_start >= self.row_length - self.seg_len:
                self._next_start, self._next_fresh = self._random.randrange(self.seg_len), True
        return self._plans[step]

    def read(self, plan: SegmentPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets `[num_rows, plan.length]` of the segment `plan`."""
        both = torch.stack([self.window(r, plan.start, plan.length + 1) for r in range(self.num_rows)])
        return both[:, :-1], both[:, 1:]

    def segment(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of training step `step` (`plan(step)`)."""
        return self.read(self.plan(step))

    def __iter__(self):
        for index in range(self.num_segments):
            start = index * self.seg_len
            yield self.read(SegmentPlan(start, min(self.seg_len, self.row_length - 1 - start), index == 0))


def segment_stream(
    tokens,
    global_batch: int,
    seg_len: int,
    rank: int = 0,
    world_size: int = 1,
    name: str = "corpus",
    order: str = "transformer-xl",
    seed: int = 0,
) -> SegmentStream:
    """Cuts `tokens` (a 1-D tensor, numpy array or memory-mapped cache) into `global_batch` contiguous rows and
    returns those of `rank`, read in `order` (see DATA_ORDERS; `seed` draws the "adaptive-span" offsets)."""
    if global_batch % world_size:
        raise DataError(
            f"the global batch size ({global_batch}) must be divisible by the number of processes ({world_size})"
        )
    if order not in DATA_ORDERS:
        raise DataError(f"data order must be one of {', '.join(DATA_ORDERS)}, got {order!r}")
    tokens = as_token_tensor(tokens)
    row_length = len(tokens) // global_batch
    # "transformer-xl" reads a row while it has a target left; "adaptive-span" needs one whole segment
    needed = 2 if order == "transformer-xl" else seg_len + 1
    if row_length < needed:
        what = f"a whole segment of {seg_len} and its targets" if order == "adaptive-span" else "a token and its target"
        raise DataError(
            f"{name} is too short: {len(tokens)} tokens cut into {global_batch} rows of {row_length}, but one "
            f"segment needs {needed} tokens a row ({what}: at least {global_batch * needed} tokens); give more text "
            "or lower --batch-size" + ("/--seg-len" if order == "adaptive-span" else "")
        )
    per_rank = global_batch // world_size
    offsets = [r * row_length for r in range(rank * per_rank, (rank + 1) * per_rank)]
    return SegmentStream(tokens, offsets, row_length, seg_len, order, seed)


class SegmentDataset(torch.utils.data.Dataset):
    """A stream's segments as examples for `Trainer`, ordered so that consecutive batches of `num_rows` examples (read
    in order, see `OrderedSegmentSampler`) continue the same rows: example `i * num_rows + r` is step `i`'s segment of
    row `r`. Without `steps`, the steps are one pass from the rows' start (an evaluation); with `steps`, the first
    `steps` training steps of `SegmentStream.plan` (epochs, restarts), as `txv train` reads them.

    Each example: `input_ids` and `shift_labels` (the next tokens, the one after the segment included: every token of
    the stream is predicted once, as in `txv train`), int64, and with `steps` `fresh_memory` (True on the first step
    of a pass, where `MemoryTrainer` starts the memory afresh). Examples are read from the tokens when asked for (a
    memory-mapped cache stays on disk)."""

    def __init__(self, stream: SegmentStream, steps: int | None = None):
        self.stream, self.steps = stream, steps

    def __len__(self) -> int:
        return (self.stream.num_segments if self.steps is None else self.steps) * self.stream.num_rows

    def plan(self, step: int) -> SegmentPlan:
        if self.steps is not None:
            return self.stream.plan(step)
        start = step * self.stream.seg_len
        return SegmentPlan(start, min(self.stream.seg_len, self.stream.row_length - 1 - start), step == 0)

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < len(self):
            raise IndexError(f"segment example {index} out of range (0 .. {len(self) - 1})")
        step, row = divmod(index, self.stream.num_rows)
        plan = self.plan(step)
        both = self.stream.window(row, plan.start, plan.length + 1)
        example = {"input_ids": both[:-1], "shift_labels": both[1:]}
        if self.steps is not None:
            example["fresh_memory"] = torch.tensor(plan.fresh_memory)
        return example


def segment_dataset(
    tokens,
    batch_size: int,
    seg_len: int,
    name: str = "corpus",
    order: str = "transformer-xl",
    seed: int = 0,
    steps: int | None = None,
) -> SegmentDataset:
    """A `SegmentDataset` of `tokens` cut into `batch_size` rows (see `segment_stream`) for `Trainer`: one pass, or
    the first `steps` training steps in `order`."""
    return SegmentDataset(segment_stream(tokens, batch_size, seg_len, name=name, order=order, seed=seed), steps)


def num_tokens_for(num_steps: int, global_batch: int, seg_len: int) -> int:
    return num_steps * global_batch * seg_len + 1


def bits_per_token(nats_per_token: float) -> float:
    return nats_per_token / math.log(2)
