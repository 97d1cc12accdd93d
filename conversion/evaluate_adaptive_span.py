"""Evaluate a converted adaptive-span model (`txv_adaptive_span_original`) the way the original's `full_eval` does
(facebookresearch/adaptive-span, trainer.py, run by `main.py --full-eval-mode --batch-sz 8`):

    python -m conversion.evaluate_adaptive_span --model adaptive-span-enwik8 --text data/enwik8/test.txt

The text is a file in the original's format (data/enwik8/test.txt or data/text8/test.txt as its get_data.sh prepares
them: whitespace-separated symbols, every line ends with `<eos>`), numbered by the converted tokenizer exactly as the
original's data.py numbers it. The ids are cut into `--batch-size` contiguous rows (the tail that does not fill a row is
dropped), then read block by block (`--block-size`, the model's `block_size` by default), the cache carried from block
to block from zero vectors; a block's loss is the mean next-token negative log-likelihood, including the token after
the block; the result is the mean over blocks, stopping (as the original) once fewer than a block and one token remain.
Prints the loss, bits per character and the number of blocks.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from hf_txvariants.cli import positive_int
from hf_txvariants.cli.errors import run_guarded


def read_original_format(tokenizer, path) -> torch.Tensor:
    """The ids of data.py's `_tokenize`: every line's whitespace-separated symbols, then `<eos>`; an unknown symbol
    is an error naming it and its line."""
    vocab = tokenizer.get_vocab()
    ids = []
    with open(path, encoding="utf8") as f:
        for number, line in enumerate(f, 1):
            for symbol in line.split() + ["<eos>"]:
                if symbol not in vocab:
                    raise ValueError(
                        f"{path}:{number}: symbol {symbol!r} is not in the model's vocabulary (was the "
                        "text prepared as the original's get_data.sh does?)"
                    )
                ids.append(vocab[symbol])
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def full_eval(model, data: torch.Tensor, batch_size: int, block_size: int, max_blocks: int | None = None):
    """(mean loss over blocks in nats, number of blocks) as the original's `full_eval`."""
    from hf_txvariants.txv_compat import output_cache

    rows = data.numel() // batch_size
    if rows <= block_size:
        raise ValueError(
            f"{data.numel()} tokens are too few for batch size {batch_size} and block size {block_size}: "
            "every row needs more than one block"
        )
    device = next(model.parameters()).device
    stream = data[: rows * batch_size].view(batch_size, rows).to(device)
    model.eval()
    cache, total, blocks, position = model.initial_cache(batch_size), 0.0, 0, 0
    while True:
        inputs = stream[:, position : position + block_size]
        targets = stream[:, position + 1 : position + block_size + 1]
        output = model(input_ids=inputs, cache=cache, shift_labels=targets, use_cache=True)
        cache = output_cache(output)
        total += output.lm_loss.item()
        blocks += 1
        position += block_size
        if position >= rows - block_size or (max_blocks and blocks >= max_blocks):
            break
    return total / blocks, blocks


def main(argv=None, prog="python -m conversion.evaluate_adaptive_span"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model converted by conversion.adaptive_span (or a Hub id)")
    ap.add_argument("--text", required=True, help="a test file in the original's format (e.g. data/enwik8/test.txt)")
    ap.add_argument("--batch-size", type=positive_int, default=8, help="rows read in parallel (the original's 8)")
    ap.add_argument("--block-size", type=positive_int, help="tokens per block (default: the model's block_size)")
    ap.add_argument("--max-blocks", type=positive_int, help="stop early (quick checks)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = ap.parse_args(argv)
    return run_guarded(lambda: evaluate_converted(args), "error: ", args.debug)


def evaluate_converted(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_txvariants  # noqa: F401 - registers the Auto classes

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device)
    if model.config.model_type != "txv_adaptive_span_original":
        raise ValueError(
            f"{args.model} is a {model.config.model_type!r} model; this evaluation is for models "
            "converted by conversion.adaptive_span (use conversion.evaluate for Transformer-XL)"
        )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data = read_original_format(tokenizer, args.text)
    block_size = args.block_size or model.config.block_size
    print(f"evaluating {data.numel()} tokens: batch_size={args.batch_size} block_size={block_size}", file=sys.stderr)
    loss, blocks = full_eval(model, data, args.batch_size, block_size, args.max_blocks)
    result = dict(loss=loss, bpc=loss / math.log(2), blocks=blocks, tokens=data.numel())
    print(json.dumps(result))
    print(f"| loss {loss:.4f} | bpc {loss / math.log(2):.3f} | {blocks} blocks of {args.batch_size} x {block_size}")
    return result


if __name__ == "__main__":
    sys.exit(main())
