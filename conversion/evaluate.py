"""Evaluate a converted Transformer-XL the way the paper did: the test stream split into ``batch_size`` parallel
streams, consecutive segments of ``tgt_len`` tokens, the memory carried from segment to segment, and the
paper's mem_len / clamp_len / same_length (taken from the converted config and generation_config.json,
or overridden). Prints the loss, perplexity and bits per character.

    python -m conversion.evaluate --model transfo-xl-wt103 --text wikitext-103/test.txt
    python -m conversion.evaluate --model transfo-xl-enwik8 --text enwik8/test.txt.raw --tgt-len 128
    python -m conversion.evaluate --model DIR --ids tokens.txt       # whitespace-separated token ids

Text files are tokenized with the converted tokenizer by the original rules, line by line: wt103 appends
``<eos>`` to each line, lm1b wraps each line as ``<S> ... <S>``, enwik8/text8 read the raw text.
With the real wt103 checkpoint this reproduces the paper's 18.3 test perplexity (tf/sota/wt103.sh settings:
--batch-size 16 --tgt-len 128 --mem-len 1600 --clamp-len 1000 --same-length, all defaults of the preset).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

from hf_txvariants.cli import non_negative_int, positive_int
from hf_txvariants.cli.errors import run_guarded
from hf_txvariants.txv_compat import output_cache


def read_ids(path):
    with open(path, encoding="utf-8") as f:
        tokens = f.read().split()
    bad = next((t for t in tokens if not t.isdigit()), None)
    if bad is not None:
        raise ValueError(f"{path}: token ids must be non-negative integers, found {bad!r}")
    if not tokens:
        raise ValueError(f"{path}: no token ids")
    return torch.tensor([int(t) for t in tokens], dtype=torch.long)


def tokenize_file(tokenizer, path, kind):
    ids = []
    with open(path, encoding="utf-8") as f:
        if kind in ("enwik8", "text8", "chars"):
            text = f.read()
            if kind == "text8":
                text = text.strip()
            return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        for line in f:
            line = line.strip()
            piece = tokenizer(line, add_special_tokens=False)["input_ids"] if line else []
            if kind == "lm1b":
                s = tokenizer.convert_tokens_to_ids("<S>")
                piece = [s] + piece + [s]
            elif tokenizer.eos_token_id is not None:
                piece = piece + [tokenizer.eos_token_id]
            ids.extend(piece)
    return torch.tensor(ids, dtype=torch.long)


def batchify(data, batch_size):
    """As the original LMOrderedIterator: drop the tail, one contiguous stream per row -> [batch, steps]."""
    steps = data.numel() // batch_size
    if steps < 2:
        raise ValueError(f"{data.numel()} tokens are too few for batch size {batch_size}")
    return data[: steps * batch_size].view(batch_size, steps)


@torch.no_grad()
def evaluate(model, data, batch_size, tgt_len, max_segments=None, progress=True):
    """Mean negative log-likelihood (nats/token) and token count over ``data`` (1-d tensor of ids)."""
    model.eval()
    device = next(model.parameters()).device
    stream = batchify(data, batch_size).to(device)
    steps = stream.shape[1]
    starts = list(range(0, steps - 1, tgt_len))
    if max_segments:
        starts = starts[:max_segments]
    total, count, past = 0.0, 0, None
    it = starts
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(starts, desc="evaluating", unit="segment", file=sys.stderr)
    for a in it:
        seq = min(tgt_len, steps - 1 - a)
        x = stream[:, a : a + seq]
        y = stream[:, a + 1 : a + 1 + seq]
        out = model(input_ids=x, cache=past, use_cache=True, logits_to_keep=0)
        past = output_cache(out)
        nll = -out.logits.float().gather(-1, y[..., None])[..., 0]
        total += nll.sum().item()
        count += nll.numel()
    return total / count, count


def main(argv=None, prog="python -m conversion.evaluate"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a converted model directory (or Hub id)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="a text file, tokenized by the original rules")
    src.add_argument("--ids", help="a file of whitespace-separated token ids")
    ap.add_argument("--batch-size", type=positive_int, default=None, help="parallel streams (paper: 16)")
    ap.add_argument("--tgt-len", type=positive_int, default=None, help="segment length (preset's eval_tgt_len)")
    ap.add_argument("--mem-len", type=non_negative_int)
    ap.add_argument("--clamp-len", type=int)
    ap.add_argument("--same-length", type=lambda s: s.lower() in ("1", "true", "yes"), default=None)
    ap.add_argument("--max-segments", type=positive_int, help="stop early (quick checks)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = ap.parse_args(argv)
    return run_guarded(lambda: evaluate_converted(args), "error: ", args.debug)


def evaluate_converted(args) -> dict:
    """Loads the converted model, tokenizes the text (or reads the ids), evaluates and prints the result."""
    from transformers import AutoTokenizer

    import hf_txvariants  # noqa: F401 - registers TransfoXL with the Auto classes
    from hf_txvariants.training.models import load_model

    model = load_model(args.model, dtype=getattr(torch, args.dtype)).to(args.device)
    gen = {}
    gen_path = os.path.join(args.model, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path, encoding="utf-8") as f:
            gen = json.load(f)
    if args.mem_len is not None:
        model.reset_memory_length(args.mem_len)
    if args.clamp_len is not None:
        model.config.clamp_len = args.clamp_len
    if args.same_length is not None:
        model.config.same_length = args.same_length
    tgt_len = args.tgt_len or gen.get("eval_tgt_len") or 128
    batch_size = args.batch_size or 16
    if args.text:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        kind = tokenizer.init_kwargs.get("txv_vocab_kind", "word")
        data = tokenize_file(tokenizer, args.text, kind)
    else:
        data = read_ids(args.ids)
    c = model.config
    print(
        f"evaluating {data.numel()} tokens: batch_size={batch_size} tgt_len={tgt_len} mem_len={c.mem_len} "
        f"clamp_len={c.clamp_len} same_length={c.same_length} memory_init={c.memory_init}",
        file=sys.stderr,
    )
    loss, count = evaluate(model, data, batch_size, tgt_len, args.max_segments, progress=not args.no_progress)
    result = dict(loss=loss, perplexity=math.exp(loss), bpc=loss / math.log(2), tokens=count)
    print(json.dumps(result))
    print(f"| loss {loss:.4f} | ppl {math.exp(loss):9.3f} | bpc {loss / math.log(2):8.4f} | {count} tokens")
    return result


if __name__ == "__main__":
    sys.exit(main())
