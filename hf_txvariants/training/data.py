"""Text data for language-model training: loading text with `datasets`, a character-level tokenizer, and the
contiguous ordered segment streams Transformer-XL is trained on (Dai et al. 2019, and the original `LMOrderedIterator`).

The token stream of a split is cut into `global_batch` contiguous rows; data-parallel rank r of W owns the rows
`[r * B / W, (r + 1) * B / W)`. Step i gives every row its i-th segment, so the memory a row carries from step i to
step i + 1 is the context that really precedes the next segment, on one process or many."""

from __future__ import annotations

import gzip
import math
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
    data = resources.files("hf_txvariants.training").joinpath("corpus/default_corpus.txt.gz").read_bytes()
    return gzip.decompress(data).decode("utf-8")


def load_text(source: str | Path | None = None, text_column: str = "text") -> str:
    """The text of `source`: None (the embedded corpus), a text file, a folder of text files, or a folder saved
    with `datasets.Dataset.save_to_disk` (its `text_column` is joined with newlines). Files are read with `datasets`."""
    if source is None:
        return default_corpus()
    path = Path(source)
    if not path.exists():
        raise DataError(f"data file not found: {path}")
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        import datasets

        dataset = datasets.load_from_disk(str(path))
        if isinstance(dataset, datasets.DatasetDict):
            if "train" not in dataset:
                raise DataError(f"dataset folder {path} has splits {list(dataset)}, expected a 'train' split")
            dataset = dataset["train"]
        if text_column not in dataset.column_names:
            raise DataError(f"dataset at {path} has no column {text_column!r} (columns: {dataset.column_names})")
        return "\n".join(dataset[text_column])
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    files = [f for f in files if not f.name.startswith(".")]
    if not files:
        raise DataError(f"no text files found in {path}")
    import datasets
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        dataset = datasets.load_dataset("text", data_files=[str(f) for f in files], split="train", sample_by="document")
    except Exception as error:  # datasets raises many types for unreadable files
        raise DataError(f"could not read text from {path}: {str(error).splitlines()[0]}") from None
    finally:
        if not quiet:
            enable_progress_bars()
    return "\n".join(dataset["text"])


def split_text(text: str, valid_fraction: float) -> tuple[str, str]:
    """Training and validation text: the last `valid_fraction` of the characters is held out."""
    if not 0.0 < valid_fraction < 1.0:
        raise DataError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
    cut = int(len(text) * (1.0 - valid_fraction))
    return text[:cut], text[cut:]


# --------------------------------------------------------------------------------------------------------------------
# tokenizer
def build_char_tokenizer(text: str, max_vocab: int | None = None):
    """A character-level `PreTrainedTokenizerFast` (a `tokenizers` WordLevel model over single characters): every
    character of `text` (the most frequent `max_vocab` if given) plus `<unk>` and `<eos>`, and `<pad>` as the last id
    (so that pipelines can batch; the characters keep the ids they had before `<pad>` existed); saved with the
    model. Padding is on the left, where a causal LM's next token is the last position of every row."""
    from collections import Counter

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not text:
        raise DataError("cannot build a tokenizer from empty text")
    counts = Counter(text)
    chars = sorted(c for c, _ in counts.most_common(max_vocab)) if max_vocab else sorted(counts)
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in chars:
        vocab.setdefault(char, len(vocab))
    vocab.setdefault("<pad>", len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>", padding_side="left",
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
@dataclass
class SegmentStream:
    """The rows of one rank: `rows` is `[local_rows, n_steps * seg_len + 1]` (one extra token for the last target)."""

    rows: torch.Tensor
    seg_len: int

    @property
    def num_segments(self) -> int:
        return (self.rows.shape[1] - 1) // self.seg_len

    def segment(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of segment `step` (wraps around after the last one)."""
        start = (step % self.num_segments) * self.seg_len
        return self.rows[:, start : start + self.seg_len], self.rows[:, start + 1 : start + self.seg_len + 1]

    def __iter__(self):
        for step in range(self.num_segments):
            yield self.segment(step)


def segment_stream(
    tokens: torch.Tensor, global_batch: int, seg_len: int, rank: int = 0, world_size: int = 1, name: str = "corpus"
) -> SegmentStream:
    """Cuts `tokens` into `global_batch` contiguous rows and returns those of `rank` (see the module docstring)."""
    if global_batch % world_size:
        raise DataError(f"the global batch size ({global_batch}) must be divisible by the number of processes ({world_size})")
    row_length = (len(tokens) - 1) // global_batch
    if row_length < seg_len:
        need = global_batch * seg_len + 1
        raise DataError(
            f"{name} is too short: {len(tokens)} tokens, but one segment of {seg_len} tokens for each of the "
            f"{global_batch} rows needs at least {need}; give more text or lower --batch-size/--seg-len"
        )
    usable = (row_length // seg_len) * seg_len
    rows = torch.stack([tokens[r * row_length : r * row_length + usable + 1] for r in range(global_batch)])
    per_rank = global_batch // world_size
    return SegmentStream(rows[rank * per_rank : (rank + 1) * per_rank].contiguous(), seg_len)


def segment_dataset(tokens: torch.Tensor, batch_size: int, seg_len: int, name: str = "corpus"):
    """A `datasets.Dataset` of segments for `Trainer`, ordered so that consecutive batches of `batch_size` examples
    (read in order, see `OrderedSegmentSampler`) continue the same rows: example `i * batch_size + r` is segment `i`
    of row `r`. Columns: `input_ids` and `labels` (= input_ids; the model shifts them)."""
    import datasets

    stream = segment_stream(tokens, batch_size, seg_len, name=name)
    inputs = [stream.rows[r, s * seg_len : (s + 1) * seg_len].tolist() for s in range(stream.num_segments) for r in range(batch_size)]
    return datasets.Dataset.from_dict({"input_ids": inputs, "labels": inputs})


def num_tokens_for(num_steps: int, global_batch: int, seg_len: int) -> int:
    return num_steps * global_batch * seg_len + 1


def bits_per_token(nats_per_token: float) -> float:
    return nats_per_token / math.log(2)
