"""Length generalisation of Shaw's relative positions (Shaw et al. 2018's claim: clipped relative positions let a
model trained on short sequences run on longer ones).

Two tiny character language models with the same width, depth and training budget are trained on sequences of
`--train-length` bytes of the embedded corpus (hf_txvariants/training/corpus), in the same run:
  * Shaw (`txv_shaw`, relative keys and values, k = --max-relative-position)
  * the peer: the vanilla Transformer (`txv_vanilla`) with sinusoidal absolute positions and token embeddings scaled
    by sqrt(d) as in Vaswani et al. (learned positions cannot even run past their table).
Both are then evaluated on held-out text with windows of `--train-length` and of 2 x `--train-length` tokens. Reported:
mean loss (nats/byte) at positions [0, L) and [L, 2L) of the long windows, and the ratio loss[L, 2L) / loss at
length L (1.0 = no jump). Run: python benchmarks/bench_shaw_length.py  (3.6 CPU-minutes of user time; wall time
depends on machine load)
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import torch

from hf_txvariants import ShawConfig, ShawForCausalLM, VanillaConfig, VanillaForCausalLM

CORPUS = Path(__file__).resolve().parents[1] / "hf_txvariants" / "training" / "corpus" / "default_corpus.txt.gz"


def load_bytes():
    data = torch.tensor(list(gzip.open(CORPUS).read()), dtype=torch.long)
    split = int(0.9 * len(data))
    return data[:split], data[split:]


def train(model, data, length, steps, batch_size, lr, seed):
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(data) - length - 1, (batch_size,), generator=generator)
        batch = torch.stack([data[s : s + length] for s in starts])
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return float(loss.detach())


@torch.no_grad()
def position_losses(model, data, length, windows, seed=1):
    """`[length - 1]` mean next-byte loss per position over `windows` random held-out windows."""
    generator = torch.Generator().manual_seed(seed)
    model.eval()
    starts = torch.randint(0, len(data) - length - 1, (windows,), generator=generator)
    total = torch.zeros(length - 1)
    for chunk in starts.split(16):
        batch = torch.stack([data[s : s + length] for s in chunk])
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
        total += losses.sum(0)
    return total / windows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--max-relative-position", type=int, default=16)
    parser.add_argument("--eval-windows", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    train_data, eval_data = load_bytes()
    length = args.train_length
    common = dict(
        vocab_size=256,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden_size,
        dropout=0.0,
        attention_dropout=0.0,
        pre_lnorm=True,
    )
    models = {
        "shaw": lambda: ShawForCausalLM(ShawConfig(**common, max_relative_position=args.max_relative_position)),
        "vanilla-sinusoidal": lambda: VanillaForCausalLM(
            VanillaConfig(
                **common, position_embedding_type="sinusoidal", scale_embedding=True, max_position_embeddings=4 * length
            )
        ),
    }
    print(f"train length {length}, eval lengths {length} and {2 * length}, {args.steps} steps x {args.batch_size}")
    print("| model | train s | loss @L (pos <L) | loss @2L pos <L | loss @2L pos [L,2L) | ratio [L,2L) / @L |")
    print("|---|---|---|---|---|---|")
    for name, make in models.items():
        torch.manual_seed(args.seed)
        model = make()
        start = time.perf_counter()
        train(model, train_data, length, args.steps, args.batch_size, args.lr, args.seed)
        seconds = time.perf_counter() - start
        short = position_losses(model, eval_data, length, args.eval_windows).mean()
        long = position_losses(model, eval_data, 2 * length, args.eval_windows)
        first, second = long[: length - 1].mean(), long[length - 1 :].mean()
        print(
            f"| {name} | {seconds:.0f} | {short:.3f} | {first:.3f} | {second:.3f} | {second / short:.3f} |", flush=True
        )


if __name__ == "__main__":
    main()
