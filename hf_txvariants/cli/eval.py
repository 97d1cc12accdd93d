"""`txv eval`: bits per token and perplexity of a saved model on a text, in segments (the memory carried) or with a
sliding window."""

from __future__ import annotations

import argparse
import json

from . import non_negative_int, positive_int


def add_parser(sub, name: str, help_text: str):
    """`txv eval` (see hf_txvariants_commands.COMMANDS)."""
    ev = sub.add_parser(name, help=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ev.add_argument("--model", required=True, help="saved model folder or Hub repo id")
    ev.add_argument("--data", help="text file / folder / saved dataset (default: the embedded corpus)")
    ev.add_argument("--text-column", default="text", help="column of a saved `datasets` folder that holds the text")
    ev.add_argument("--max-chars", type=positive_int, help="use only the first N characters")
    ev.add_argument("--seg-len", type=positive_int, default=64, help="tokens per evaluation segment")
    ev.add_argument("--mem-len", type=non_negative_int, help="memory length at evaluation (memory models)")
    ev.add_argument("--batch-size", type=positive_int, default=1, help="rows evaluated in parallel")
    ev.add_argument(
        "--window", type=positive_int, help="score with a sliding window of this length instead (no memory)"
    )
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.set_defaults(func=run)
    return ev


def run(args):
    from ..training import encode, evaluate_sliding_window, evaluate_text, load_model, load_text
    from ..training.models import load_tokenizer, uses_memory

    if args.no_progress:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the "Loading weights" bar too
    model = load_model(args.model)
    tokenizer = load_tokenizer(args.model)
    text = load_text(args.data, args.text_column)
    if args.max_chars:
        text = text[: args.max_chars]
    tokens = encode(tokenizer, text)
    if args.mem_len is not None and hasattr(model, "reset_memory_length"):
        model.reset_memory_length(args.mem_len)
    progress = not args.no_progress
    if args.window:
        result = evaluate_sliding_window(model, tokens, args.window, args.batch_size, progress=progress)
        how = f"sliding window {args.window}"
    else:
        result = evaluate_text(model, tokens, args.batch_size, args.seg_len, progress=progress)
        how = f"segments of {args.seg_len}" + (f", memory {model.config.mem_len}" if uses_memory(model) else "")
    print(
        f"{result['bpc']:.4f} bits per token, perplexity {result['perplexity']:.3f}, {result['tokens']} tokens "
        f"({how}), {result['tokens_per_second']:,.0f} tokens/s"
    )
    print(json.dumps(result))
