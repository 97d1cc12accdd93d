"""Reformer (txv_reformer) generation: time per new token with the cache against recomputing the whole sequence
(`use_cache=False`), at several prefix lengths, CPU, float32, batch 1, greedy.

Both give the same tokens (tests/test_modeling_txv_reformer.py). With the cache, the layers before the first LSH layer
(and every layer while the sequence fits in one LSH chunk) cost one chunk window per token; from the first LSH layer
on, the layers are recomputed over the whole sequence from the cached inputs (LSH's sort changes earlier positions'
outputs). So the gain is largest when the first LSH layer comes late; the `--layers` stacks show both ends.

    python benchmarks/bench_reformer_generation.py
    python benchmarks/bench_reformer_generation.py --prefixes 256 1024 --tokens 4
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers.utils import logging

from hf_txvariants import TxvReformerConfig, TxvReformerForCausalLM
from hf_txvariants.txv_compat import output_cache

logging.set_verbosity_error()

STACKS = {
    "local,lsh x3": ["local", "lsh"] * 3,
    "local x4, lsh x2": ["local"] * 4 + ["lsh"] * 2,
    "local x6": ["local"] * 6,
}


def make_model(layers, max_length):
    torch.manual_seed(0)
    config = TxvReformerConfig(
        vocab_size=256,
        hidden_size=128,
        num_attention_heads=2,
        attention_head_size=64,
        feed_forward_size=256,
        attn_layers=layers,
        axial_pos_shape=[max_length // 64, 64],
        axial_pos_embds_dim=[64, 64],
        max_position_embeddings=max_length,
        lsh_attn_chunk_length=64,
        local_attn_chunk_length=64,
        num_hashes=2,
        hash_seed=0,
        hidden_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        lsh_attention_probs_dropout_prob=0.0,
    )
    return TxvReformerForCausalLM(config).eval()


@torch.no_grad()
def per_token_seconds(model, prefix, tokens, use_cache):
    """Mean seconds per token over `tokens` greedy steps after `prefix` (the prompt's forward not counted)."""
    ids = prefix
    out = model(ids, use_cache=use_cache)
    next_id = out.logits[:, -1].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(tokens):
        ids = torch.cat([ids, next_id], dim=1)
        if use_cache:
            out = model(next_id, cache=output_cache(out))
        else:
            out = model(ids, use_cache=False)
        next_id = out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - start) / tokens


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefixes", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--tokens", type=int, default=8, help="new tokens timed per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="best of N, cached and uncached interleaved")
    args = parser.parse_args()
    max_length = 64 * ((max(args.prefixes) + args.tokens) // 64 + 1)
    max_length = 1 << (max_length - 1).bit_length()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch 1, d 128, 6 layers, chunks of 64")
    print("| layers | prefix | with cache (ms/token) | without cache (ms/token) | ratio (without / with) |")
    print("|---|---|---|---|---|")
    for name, layers in STACKS.items():
        model = make_model(layers, max_length)
        for prefix_length in args.prefixes:
            prefix = torch.randint(0, 256, (1, prefix_length), generator=torch.Generator().manual_seed(0))
            with_cache, without_cache = float("inf"), float("inf")
            for _ in range(args.repeats):
                with_cache = min(with_cache, per_token_seconds(model, prefix, args.tokens, True))
                without_cache = min(without_cache, per_token_seconds(model, prefix, args.tokens, False))
            print(
                f"| {name} | {prefix_length} | {1e3 * with_cache:.1f} | {1e3 * without_cache:.1f} | "
                f"{without_cache / with_cache:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
