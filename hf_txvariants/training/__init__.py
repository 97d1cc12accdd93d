"""Training, fine-tuning and evaluation helpers for hf_txvariants models (not imported by any modeling file)."""

from .arguments import TrainArgs
from .checkpoints import latest_checkpoint
from .data import (
    DataError,
    SegmentStream,
    build_char_tokenizer,
    default_corpus,
    encode,
    load_text,
    segment_dataset,
    segment_stream,
    split_text,
)
from .evaluation import evaluate_sliding_window, evaluate_stream, evaluate_text, summarize
from .loop import read_metrics, train
from .models import ModelError, build_config, build_model, lm_forward, load_model, uses_memory, variant_names

__all__ = [
    "DataError",
    "ModelError",
    "SegmentStream",
    "TrainArgs",
    "build_char_tokenizer",
    "build_config",
    "build_model",
    "default_corpus",
    "encode",
    "evaluate_sliding_window",
    "evaluate_stream",
    "evaluate_text",
    "latest_checkpoint",
    "lm_forward",
    "load_model",
    "load_text",
    "read_metrics",
    "segment_dataset",
    "segment_stream",
    "split_text",
    "summarize",
    "train",
    "uses_memory",
    "variant_names",
]
