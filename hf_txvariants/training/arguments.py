"""The settings of a `txv train` run: `TrainArgs`, whose every field is a command-line flag (read by
transformers' `HfArgumentParser`), validated on construction so that a bad value names its flag before any work."""

from __future__ import annotations

import argparse
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Literal

from .data import DataError
from .optimizers import SCHEDULES_WITH_FLOOR


class JsonError(argparse.ArgumentTypeError, ValueError):
    """Bad JSON for `--extra-config` (argparse prints an ArgumentTypeError's own message; callers of the Python API
    catch it as a ValueError)."""


class JsonDict(dict):
    """A dict that parses itself from a JSON string (the type of `--extra-config` on the command line)."""

    def __init__(self, value=None):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise JsonError(f"not valid JSON ({error}): {value!r}") from None
            if not isinstance(value, dict):
                raise JsonError(f"expected a JSON object such as '{{\"clamp_len\": 400}}', got {value!r}")
        super().__init__(value or {})


def _arg(default=None, help: str = "", **metadata):
    """A TrainArgs field with its `--help` text (read by transformers.HfArgumentParser)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: JsonDict(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class TrainArgs:
    """Every setting of a training run; each field is a `txv train` flag (`--d-model`, `--resume latest`, ...)."""

    output_dir: str = _arg("txv-run", "folder for metrics.jsonl, TensorBoard logs, checkpoints/ and model/")
    data: str | None = _arg(
        None,
        "training text: a text file, a folder of text files, a saved `datasets` folder, a "
        "parquet/JSON/CSV file or folder, or a Hub dataset name (default: the embedded "
        "corpus)",
    )
    data_config: str | None = _arg(None, "the config of a --data dataset, e.g. wikitext-103-raw-v1")
    train_split: str | None = _arg(None, "the split of a --data dataset to train on (default: train)")
    valid_split: str | None = _arg(
        None,
        "the split of the dataset (--valid-data, else --data) to validate on, e.g. "
        "validation (default: --valid-data's train split, else the last "
        "--valid-fraction of --data)",
    )
    valid_data: str | None = _arg(
        None, "held-out text, any kind --data takes (default: the last --valid-fraction of --data)"
    )
    valid_fraction: float = _arg(
        0.05, "fraction of the characters held out for validation when neither --valid-data nor --valid-split is given"
    )
    text_column: str = _arg("text", "column of a dataset that holds the text (each row one line)")
    max_chars: int | None = _arg(None, "use only the first N characters of --data")
    tokenizer: str | None = _arg(
        None,
        "char (a character vocabulary of the training text), byte (the 256 byte "
        "values, as for enwik8), word (Transformer-XL's word vocabulary of the "
        "training text, <eos> at line ends), or a tokenizer folder / Hub name "
        "(AutoTokenizer). Default: --model's tokenizer with --model, else char",
    )
    vocab_min_freq: int = _arg(0, "--tokenizer word: drop words seen fewer times (they become <unk>)")
    vocab_max_size: int | None = _arg(None, "--tokenizer word: keep at most the N most frequent words")
    token_cache: str | None = _arg(
        None,
        "folder of the token cache (memory-mapped token ids, one tokenisation per "
        "data and tokenizer; default: $TXV_TOKEN_CACHE, else "
        "$HF_HOME/txv-token-cache)",
    )
    variant: str = _arg("transfo-xl", "model variant (a registered text variant, see `txv train --help`)")
    model: str | None = _arg(
        None, "start from this saved model folder or Hub repo id (and its tokenizer) instead of a new config"
    )
    d_model: int = _arg(128, "hidden size")
    n_layer: int = _arg(4, "number of layers")
    n_head: int = _arg(4, "attention heads per layer")
    d_inner: int | None = _arg(None, "feed-forward inner size (default: 4 x d-model)")
    mem_len: int = _arg(64, "memory length of the memory variants (0: no memory)")
    seg_len: int = _arg(64, "tokens per training segment")
    dropout: float = _arg(0.1, "dropout rate in [0, 1)")
    batch_size: int = _arg(16, "global batch: rows over all processes and accumulation chunks")
    grad_accum: int = _arg(1, "gradient accumulation chunks per step (each with its own memory)")
    data_order: Literal["transformer-xl", "adaptive-span"] = _arg(
        "transformer-xl",
        "how each row is read, as an original trainer does: transformer-xl (kimiyoung's ordered iterator: "
        "segments from the row's start, the last one shorter, then a new epoch from the start with the memory "
        "emptied) or adaptive-span (whole segments; then a new pass at a random offset below --seg-len, drawn "
        "from --seed, with the memory zeroed)",
    )
    lr: float = _arg(1e-3, "peak learning rate (after the warm-up)")
    warmup_steps: int = _arg(20, "linear warm-up steps")
    lr_schedule: Literal[
        "cosine", "constant", "transformer-xl", "transformer-xl-inv-sqrt", "transformer-xl-constant", "adaptive-span"
    ] = _arg(
        "cosine",
        "cosine: linear warm-up, then cosine decay from the end of the warm-up to --eta-min at --max-steps; "
        "constant: linear warm-up, then constant; the originals' schedules, each step at the rate the original "
        "gives it: transformer-xl (kimiyoung's train.py --scheduler cosine: cosine counted from step 0), "
        "transformer-xl-inv-sqrt, transformer-xl-constant (its inv_sqrt and constant), adaptive-span (warm-up to "
        "step W, then constant). The formulas: hf_txvariants.training.optimizers.LR_SCHEDULES",
    )
    eta_min: float = _arg(0.0, "the cosine schedules' final learning rate (train.py's --eta_min)")
    optimizer: Literal["adamw", "adagrad"] = _arg(
        "adamw",
        "adamw (Adam with --weight-decay 0), or adagrad: adaptive-span's Adagrad, which clips each "
        "parameter tensor's gradient at --clip-norm instead of the global norm",
    )
    weight_decay: float = _arg(0.0, "AdamW weight decay of the matrices")
    clip_norm: float = _arg(
        0.25,
        "gradient-norm clipping (0: none): of all gradients together, or of each parameter "
        "tensor with --optimizer adagrad",
    )
    max_steps: int = _arg(200, "optimizer steps")
    eval_every: int = _arg(50, "validate every N steps (0: only at the end)")
    eval_batch_size: int = _arg(8, "validation rows")
    eval_segments: int | None = _arg(None, "validate on the first N segments of each row (default: all)")
    eval_seg_len: int | None = _arg(
        None,
        "tokens per validation segment (default: --seg-len); a memory model's memory is then lengthened by "
        "seg-len - eval-seg-len, as kimiyoung's train.py evaluates (its --eval_tgt_len)",
    )
    save_every: int = _arg(0, "write a checkpoint every N steps (0: only at the end)")
    resume: str | None = _arg(
        None, "'latest' (the newest complete, loadable checkpoint of --output-dir) or a checkpoint folder"
    )
    seed: int = _arg(0, "random seed")
    mixed_precision: Literal["no", "bf16", "fp16"] | None = _arg(
        None,
        "autocast precision (default: the Accelerate config's mixed_precision under `accelerate launch`, else "
        "no); under FSDP, no or bf16",
    )
    dtype: Literal["float32", "float64"] = _arg(
        "float32",
        "the dtype of the weights, the memory and the arithmetic (float64 for comparing a run with a reference "
        "step for step)",
    )
    cpu: bool = _arg(False, "train on CPU even with GPUs (so do all processes when there are more than GPUs: gloo)")
    tensorboard: bool = _arg(True, "log to TensorBoard in OUTPUT_DIR/logs")
    progress: bool = _arg(True, "show a progress bar")
    save_model: bool = _arg(True, "save the final model and tokenizer to OUTPUT_DIR/model")
    extra_config: JsonDict = _arg({}, "JSON object of extra config fields, e.g. '{\"clamp_len\": 400}'")

    def __post_init__(self):
        """Every bad setting is a ValueError naming the flag, before anything is loaded or trained."""
        self.extra_config = JsonDict(self.extra_config)
        positive = (
            "d_model",
            "n_layer",
            "n_head",
            "seg_len",
            "batch_size",
            "grad_accum",
            "max_steps",
            "eval_batch_size",
        )
        optional_positive = ("d_inner", "max_chars", "eval_segments", "eval_seg_len", "vocab_max_size")
        non_negative = ("mem_len", "warmup_steps", "eval_every", "save_every", "seed", "vocab_min_freq")
        for name in positive + optional_positive + non_negative:
            value = getattr(self, name)
            if value is None and name in optional_positive:
                continue
            low = 0 if name in non_negative else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DataError(f"--{flag_name(name)} must be an integer >= {low}, got {value!r}")
        for name, low, high in (
            ("lr", 0.0, None),
            ("dropout", 0.0, 1.0),
            ("weight_decay", 0.0, None),
            ("clip_norm", 0.0, None),
            ("eta_min", 0.0, None),
            ("valid_fraction", 0.0, 1.0),
        ):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and value >= low and (high is None or value < high) and (name != "lr" or value > 0)
            ok = ok and (name != "valid_fraction" or value > 0)
            if not ok:
                bounds = f"in [{low}, {high})" if high is not None else ("> 0" if name == "lr" else f">= {low}")
                raise DataError(f"--{flag_name(name)} must be a finite number {bounds}, got {value!r}")
        for name in ("optimizer", "lr_schedule", "data_order", "dtype"):
            choices = typing.get_args(typing.get_type_hints(TrainArgs)[name])
            if getattr(self, name) not in choices:
                raise DataError(f"--{flag_name(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.eta_min and self.lr_schedule not in SCHEDULES_WITH_FLOOR:
            raise DataError(
                f"--eta-min {self.eta_min} applies to --lr-schedule {' or '.join(SCHEDULES_WITH_FLOOR)}, "
                f"not {self.lr_schedule}"
            )
        if self.eta_min > self.lr:
            raise DataError(f"--eta-min {self.eta_min} is above --lr {self.lr}")
        if self.optimizer == "adagrad" and self.weight_decay:
            raise DataError(f"--weight-decay {self.weight_decay} needs --optimizer adamw (adagrad has none)")
        if self.mixed_precision is not None and self.mixed_precision not in ("no", "bf16", "fp16"):
            raise DataError(f"--mixed-precision must be one of no, bf16, fp16, got {self.mixed_precision!r}")
        if self.tokenizer is not None and not self.tokenizer:
            raise DataError("--tokenizer must be char, byte, word or a tokenizer folder / Hub name, got ''")
        if self.tokenizer != "word" and (self.vocab_min_freq or self.vocab_max_size is not None):
            raise DataError(
                f"--vocab-min-freq / --vocab-max-size apply to --tokenizer word, not "
                f"--tokenizer {self.tokenizer or 'char (the default)'}"
            )
        if self.resume is not None and not self.resume:
            raise DataError("--resume must be 'latest' or a checkpoint folder, got an empty string")


def size_fields(args: TrainArgs) -> dict:
    return dict(
        d_model=args.d_model,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_inner=args.d_inner,
        mem_len=args.mem_len,
        seg_len=args.seg_len,
        dropout=args.dropout,
    )


def flag_name(name: str) -> str:
    return name.replace("_", "-")
