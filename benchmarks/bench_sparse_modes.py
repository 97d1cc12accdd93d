"""Sparse Transformer head modes at equal compute (Child et al. 2019, sec. 4.3): "interleaved" (one factor per residual
block), "merged" (every head attends to the union), "per_head" (heads split between the factors), for the strided
and the fixed pattern, on a task that needs long-range attention.

    python benchmarks/bench_sparse_modes.py                 # defaults below
    python benchmarks/bench_sparse_modes.py --grid-positions --period 16   # two hops

Task (copy at a distance): a row is `period` random tokens (vocabulary `vocab`) repeated until `length`; from the
second period on, every token is predictable from the one `period` positions back. Position t predicts x_{t+1}, so the
query at t needs the key at t + 1 - period, `period - 1` back: with `period - 1` a multiple of `stride` the strided
pattern's column factor reaches it directly (one hop); otherwise it takes two hops, the row factor (the previous
`stride` positions) in an earlier layer than the column factor, which interleaved heads have only in one layer order
(the fixed pattern reaches it through the summary positions). The score is the loss (bits per token) on the predictable
positions of held-out rows after the same number of steps, the same model (layers, width, heads) and the same batches
(equal compute: the modes differ only in which keys each head sees; merged heads see the union, so they do a little
more attention work, reported as time per step). Chance is log2(vocab) bits. `--grid-positions` gives the positions a
row and a column embedding (rows of `stride`), so that "the same column, k rows back" is one learned relation.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from hf_txvariants import SparseTransformerConfig, SparseTransformerForCausalLM


def batch_of_rows(generator, batch, length, period, vocab):
    prefix = torch.randint(0, vocab, (batch, period), generator=generator)
    return prefix.repeat(1, math.ceil(length / period))[:, :length]


def train_and_score(pattern, mode, seed, args):
    torch.manual_seed(seed)
    config = SparseTransformerConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        max_position_embeddings=args.length,
        attention_pattern=pattern,
        pattern_mode=mode,
        stride=args.stride,
        summary_size=args.summary,
        gradient_checkpointing_min_layers=0,
        image_shape=[args.length // args.stride, args.stride, 1] if args.grid_positions else None,
    )
    model = SparseTransformerForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + seed)  # the same batches for every mode
    labels_mask = torch.arange(args.length) >= args.period  # predictable positions
    start = time.perf_counter()
    model.train()
    for _ in range(args.steps):
        ids = batch_of_rows(data, args.batch, args.length, args.period, args.vocab)
        labels = ids.masked_fill(~labels_mask, -100)
        loss = model(ids, labels=labels, use_cache=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    model.eval()
    held_out = torch.Generator().manual_seed(99)
    ids = batch_of_rows(held_out, 64, args.length, args.period, args.vocab)
    with torch.no_grad():
        loss = model(ids, labels=ids.masked_fill(~labels_mask, -100), use_cache=False).loss
    return loss.item() / math.log(2), step_ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--period", type=int, default=17)
    parser.add_argument("--stride", type=int, default=8)
    parser.add_argument("--summary", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--patterns", nargs="+", default=["strided", "fixed"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared CPU)")
    parser.add_argument(
        "--grid-positions",
        action="store_true",
        help="positions as rows of `stride` (image_shape [length / stride, stride, 1]: a row and a column embedding) "
        "instead of one learned embedding per position",
    )
    args = parser.parse_args()
    if args.grid_positions and args.length % args.stride:
        parser.error(f"--grid-positions needs --length ({args.length}) to be a multiple of --stride ({args.stride})")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; {vars(args)}")
    print("| pattern | mode | held-out bits/token (per seed) | mean | ms per step |")
    print("|---|---|---|---|---|")
    for pattern in args.patterns:
        for mode in ("interleaved", "merged", "per_head"):
            results = [train_and_score(pattern, mode, seed, args) for seed in args.seeds]
            bits = [b for b, _ in results]
            step_ms = sum(ms for _, ms in results) / len(results)
            print(
                f"| {pattern} | {mode} | {', '.join(f'{b:.3f}' for b in bits)} | {sum(bits) / len(bits):.3f} | "
                f"{step_ms:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
