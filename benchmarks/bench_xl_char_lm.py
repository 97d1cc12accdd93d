"""The XL family on one character-LM budget: Transformer-XL, TrXL-I, GTrXL (with and without the final layer
norm), adaptive span, and the composed GTrXL + adaptive span, trained from scratch with the same data, steps,
optimiser and size. Reports the first training loss, the mean of the last 10, the validation loss (nats/char,
carried memory) and the gradient norm of the first step.

    python benchmarks/bench_xl_char_lm.py --steps 150 --threads 1

The corpus is the package's embedded default corpus (Python standard-library docstrings)."""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_txvariants.training.data import build_char_tokenizer, default_corpus, encode, segment_stream
from hf_txvariants.training.models import build_config, build_model, lm_forward

SPAN = dict(adapt_span_enabled=True, attn_span=128, adapt_span_ramp=16, adapt_span_init=0.5, adapt_span_loss=2e-6)

# name -> (variant, extra config fields)
MODELS = {
    "transfo-xl": ("transfo-xl", {}),
    "trxl (post-LN, gtrxl file)": ("txv_gtrxl", {"gate_type": "trxl", "final_layer_norm": False}),
    "trxl_i": ("txv_gtrxl", {"gate_type": "trxl_i"}),
    "gtrxl (gru)": ("txv_gtrxl", {"gate_type": "gru"}),
    "gtrxl (gru), no final LN (before the fix)": ("txv_gtrxl", {"gate_type": "gru", "final_layer_norm": False}),
    "adaptive_span": ("txv_adaptive_span", SPAN),
    "gtrxl (gru) + adaptive span": ("txv_gtrxl", {"gate_type": "gru", **SPAN}),
}


def train_and_evaluate(name, tokens, valid_tokens, vocab_size, args) -> dict:
    variant, extra = MODELS[name]
    torch.manual_seed(args.seed)
    config = build_config(
        variant,
        vocab_size,
        d_model=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        mem_len=args.mem_len,
        seg_len=args.seg_len,
        dropout=0.0,
        **extra,
    )
    model = build_model(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    stream = segment_stream(tokens, args.batch, args.seg_len)
    memory = model.base_model.initial_cache(args.batch)
    losses, first_grad_norm, started = [], None, time.time()
    for step in range(args.steps):
        inputs, targets = stream.segment(step % stream.num_segments)
        loss, memory = lm_forward(model, inputs, targets, memory)
        if getattr(model.config, "adapt_span_enabled", False):
            loss = loss + model.config.adapt_span_loss * model.base_model.get_spans().mean(-1).sum()
        optimizer.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip))
        first_grad_norm = grad_norm if first_grad_norm is None else first_grad_norm
        optimizer.step()
        model.clamp_spans_()
        losses.append(loss.item())
    train_seconds = time.time() - started
    model.eval()
    valid = segment_stream(valid_tokens, args.batch, args.seg_len)
    memory, total = model.base_model.initial_cache(args.batch), 0.0
    with torch.no_grad():
        for step in range(valid.num_segments):
            inputs, targets = valid.segment(step)
            loss, memory = lm_forward(model, inputs, targets, memory)
            total += loss.item()
    return {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "first_loss": round(losses[0], 3),
        "last10_loss": round(sum(losses[-10:]) / 10, 3),
        "valid_loss": round(total / valid.num_segments, 3),
        "first_grad_norm": round(first_grad_norm, 4),
        "train_seconds": round(train_seconds, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seg-len", type=int, default=64)
    parser.add_argument("--mem-len", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--chars", type=int, default=400_000, help="characters of the corpus used (last 10%%: valid)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = default_corpus()[: args.chars]
    tokenizer = build_char_tokenizer(text)
    tokens = encode(tokenizer, text)
    split = int(0.9 * len(tokens))
    valid_tokens = tokens[split:][: args.batch * args.seg_len * 20 + 1]
    results = []
    for name in args.models:
        result = train_and_evaluate(name, tokens[:split], valid_tokens, len(tokenizer), args)
        print(json.dumps(result), flush=True)
        results.append(result)
    print(
        f"\nchar LM, {args.steps} steps x {args.batch} x {args.seg_len} chars, d_model {args.d_model}, "
        f"{args.layers} layers, mem_len {args.mem_len}, AdamW lr {args.lr}, seed {args.seed}:"
    )
    print("| model | parameters | first loss | last-10 train loss | valid loss (nats/char) | first grad norm | s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['parameters']} | {r['first_loss']} | {r['last10_loss']} | {r['valid_loss']} | "
            f"{r['first_grad_norm']} | {r['train_seconds']} |"
        )
    return results


if __name__ == "__main__":
    main()
