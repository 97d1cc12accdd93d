"""The Reformer paper's duplication task (Kitaev et al. 2020, section 5): sequences 0 w 0 w with w random symbols;
the model must copy w, which needs attention from each position of the second half to the matching position of the
first. Small models, one run, the same budget for every variant:

* full attention, separate Q and K (the Transformer baseline: `local` layers whose chunk covers the sequence);
* full attention, shared QK (`lsh` layers whose chunk covers the sequence: no hashing);
* LSH attention (shared QK) with 1, 2 and 4 hash rounds (chunks of `--chunk` positions).

Reports the accuracy of the copied half (greedy next-symbol prediction with the true prefix) on held-out sequences,
evaluated with the hash rounds the model was trained with and, as in the paper's Table 2, with 1, 2, 4 and 8 rounds,
and the training time. The defaults are the paper's setup (one layer, shared-QK LSH) at a reduced length (128 instead
of 1024) and budget, long and short enough that the variants separate.

    python benchmarks/bench_reformer_duplication.py
    python benchmarks/bench_reformer_duplication.py --steps 1500 --half 255
"""

from __future__ import annotations

import argparse
import time

import torch

from hf_txvariants import TxvReformerConfig, TxvReformerForCausalLM


def make_batch(count: int, half: int, symbols: int, generator) -> torch.Tensor:
    """`[count, 2 * (half + 1)]`: 0 w 0 w with w of `half` symbols drawn from 1..symbols."""
    w = torch.randint(1, symbols + 1, (count, half), generator=generator)
    zero = torch.zeros(count, 1, dtype=torch.long)
    return torch.cat([zero, w, zero, w], dim=1)


def copy_labels(ids: torch.Tensor, half: int) -> torch.Tensor:
    """Only the copied half is scored (the first half is random)."""
    labels = ids.clone()
    labels[:, : half + 2] = -100
    return labels


def build(variant: str, args) -> TxvReformerForCausalLM:
    length = 2 * (args.half + 1)
    common = dict(
        vocab_size=args.symbols + 1,
        hidden_size=args.hidden_size,
        num_attention_heads=args.heads,
        attention_head_size=args.hidden_size // args.heads,
        feed_forward_size=2 * args.hidden_size,
        axial_pos_embds=False,
        max_position_embeddings=length,
        hidden_dropout_prob=0.0,
        lsh_attention_probs_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        pad_token_id=0,
        use_cache=False,
    )
    if variant == "full, separate QK":
        return TxvReformerForCausalLM(
            TxvReformerConfig(**common, attn_layers=["local"] * args.layers, local_attn_chunk_length=length)
        )
    if variant == "full, shared QK":
        return TxvReformerForCausalLM(
            TxvReformerConfig(**common, attn_layers=["lsh"] * args.layers, lsh_attn_chunk_length=length)
        )
    hashes = int(variant.split()[1])
    return TxvReformerForCausalLM(
        TxvReformerConfig(
            **common,
            attn_layers=["lsh"] * args.layers,
            lsh_attn_chunk_length=args.chunk,
            num_hashes=hashes,
            num_buckets=args.buckets,
        )
    )


def copy_accuracy(model, test_ids: torch.Tensor, half: int) -> float:
    with torch.no_grad():
        logits = model(test_ids).logits[:, half + 1 : -1]
    return (logits.argmax(-1) == test_ids[:, half + 2 :]).float().mean().item()


def run(variant: str, args, test_ids: torch.Tensor) -> dict:
    torch.manual_seed(args.seed)
    model = build(variant, args)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    model.train()
    for _ in range(args.steps):
        ids = make_batch(args.batch_size, args.half, args.symbols, generator)
        loss = model(ids, labels=copy_labels(ids, args.half)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    result = {"loss": loss.item(), "accuracy": copy_accuracy(model, test_ids, args.half), "seconds": seconds}
    if variant.startswith("LSH"):
        trained_hashes = model.config.num_hashes
        for hashes in EVAL_HASHES:
            model.config.num_hashes = hashes
            result[hashes] = copy_accuracy(model, test_ids, args.half)
        model.config.num_hashes = trained_hashes
    return result


EVAL_HASHES = (1, 2, 4, 8)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--half", type=int, default=63, help="symbols in w (the sequence is 2 * (half + 1))")
    parser.add_argument("--symbols", type=int, default=32)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    test_ids = make_batch(256, args.half, args.symbols, torch.Generator().manual_seed(12345))
    variants = ["full, separate QK", "full, shared QK", "LSH 1 hash", "LSH 2 hashes", "LSH 4 hashes"]
    print(
        f"duplication task: length {2 * (args.half + 1)}, {args.symbols} symbols, {args.layers} layer(s), d "
        f"{args.hidden_size}, {args.steps} steps x {args.batch_size}; LSH chunk {args.chunk}, {args.buckets} buckets"
    )
    evaluated = " | ".join(f"eval {h} round{'s' if h > 1 else ''}" for h in EVAL_HASHES)
    print(f"| variant | copy accuracy (held out) | {evaluated} | final train loss | train time (s) |")
    print("|---|---|" + "---|" * len(EVAL_HASHES) + "---|---|")
    for variant in variants:
        result = run(variant, args, test_ids)
        others = " | ".join(f"{result[h]:.3f}" if h in result else "-" for h in EVAL_HASHES)
        print(
            f"| {variant} | {result['accuracy']:.3f} | {others} | {result['loss']:.3f} | {result['seconds']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
