"""Al-Rfou et al. (2019)'s auxiliary losses on vs off, on a small byte-level language model.

The paper trains a 64-layer character Transformer and reports that its three auxiliary losses speed up convergence
and improve the final bits per character: "multiple positions" (predict the next byte at every position, not only
the last), "intermediate layer losses" (every layer l < L predicts with the shared softmax until training progress
l / 2L) and "multiple targets" (extra classifiers predict the bytes 2..n ahead, weight 0.5). Here, in one run, the
same `txv_vanilla` model (same width, depth, seed, data order and steps) is trained on bytes of the embedded corpus
(hf_txvariants/training/corpus) with:
  * all-positions      : the next byte at every position (multiple positions; the standard LM loss), the reference
  * last-position      : only the last position's next byte (all three losses off, the paper's bare setting)
  * + intermediate     : + intermediate layer losses (schedule driven by set_training_progress, as the Trainer
                         callback does)
  * + future targets   : + multiple targets (n = 2, weight 0.5): all three, the paper's setting
and evaluated on held-out windows by the next-byte loss at every position (bits per byte; the auxiliary terms are
training-only). Run: python benchmarks/bench_vanilla_aux_losses.py
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import torch
from bench_shaw_length import load_bytes, position_losses, train

from hf_txvariants import VanillaConfig, VanillaForCausalLM

SETTINGS = {  # the reference row first: the others are compared with it
    "all-positions": dict(),
    "last-position": dict(loss_on_all_positions=False),
    "+ intermediate": dict(intermediate_loss_weight=1.0),
    "+ future targets": dict(intermediate_loss_weight=1.0, num_future_targets=2, future_target_loss_weight=0.5),
}


def training_progress_hook(steps: int):
    """A forward pre-hook that sets `set_training_progress(call / steps)` before every training forward pass, as the
    Trainer callback does, so that the shared training loop drives Al-Rfou's intermediate-loss schedule."""
    calls = itertools.count()

    def hook(model, args, kwargs):
        if model.training:
            model.set_training_progress(min(1.0, next(calls) / steps))

    return hook


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--eval-windows", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_data, eval_data = load_bytes()
    common = dict(
        vocab_size=256,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden_size,
        dropout=0.0,
        attention_dropout=0.0,
        pre_lnorm=True,
        max_position_embeddings=args.length,
    )
    print(
        f"{args.layers} layers x {args.hidden_size}, length {args.length}, {args.steps} steps x {args.batch_size},"
        f" seeds {args.seeds}"
    )
    print("| setting | train s / seed | held-out bits/byte per seed | mean | vs all-positions |")
    print("|---|---|---|---|---|")
    means = {}
    for name, overrides in SETTINGS.items():
        bits, seconds = [], 0.0
        for seed in args.seeds:
            torch.manual_seed(seed)
            model = VanillaForCausalLM(VanillaConfig(**common, **overrides))
            model.register_forward_pre_hook(training_progress_hook(args.steps), with_kwargs=True)
            start = time.perf_counter()
            train(model, train_data, args.length, args.steps, args.batch_size, args.lr, seed)
            seconds += time.perf_counter() - start
            bits.append(float(position_losses(model, eval_data, args.length, args.eval_windows).mean()) / math.log(2))
        means[name] = sum(bits) / len(bits)
        versus = means[name] / means["all-positions"]
        print(
            f"| {name} | {seconds / len(args.seeds):.0f} | {' / '.join(f'{b:.3f}' for b in bits)} |"
            f" {means[name]:.3f} | {versus:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
