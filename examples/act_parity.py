"""Graves 2016's parity task with the ACT RNN: do the steps pondered grow with the difficulty of the input?

    python examples/act_parity.py [--bits 16] [--train-steps 3000] [--time-penalty 0.001] [--seed 0]

The task (Graves 2016, section 3.1): each sequence is one input vector of `--bits` entries; a random number k of them
(1 <= k <= bits, at random places) are set to +1 or -1, the others to 0; the target is 1 if the number of +1 entries
is odd, else 0. The network is an `ACTRNNForSequenceClassification` (a simple tanh RNN, as in the paper, with the
vector given as `inputs_embeds` of length 1) that may update its state up to `--max-steps` times on that one vector.
The paper used 64 bits, 128 tanh units and up to 1M training batches; this is a small version for a CPU.

After training, fresh vectors of every difficulty k are evaluated: the mean number of updates N, the mean ponder cost
N + R and the accuracy per k, and the correlation between k and N. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_txvariants import ACTRNNConfig, ACTRNNForSequenceClassification


def parity_batch(batch_size: int, bits: int, generator: torch.Generator, nonzero: int | None = None):
    """Vectors with `nonzero` (or a random 1..bits) entries set to +-1 at random places, and their parity targets."""
    if nonzero is None:
        counts = torch.randint(1, bits + 1, (batch_size,), generator=generator)
    else:
        counts = torch.full((batch_size,), nonzero)
    ranks = torch.rand(batch_size, bits, generator=generator).argsort(-1).argsort(-1)  # a random order of the places
    chosen = ranks < counts[:, None]
    signs = torch.randint(0, 2, (batch_size, bits), generator=generator) * 2 - 1
    vectors = torch.where(chosen, signs, 0).float()
    targets = (vectors == 1).sum(-1) % 2
    return vectors[:, None, :], targets, counts


def evaluate(model, bits: int, generator: torch.Generator, per_difficulty: int = 512):
    rows = []
    with torch.no_grad():
        for nonzero in range(1, bits + 1):
            vectors, targets, _ = parity_batch(per_difficulty, bits, generator, nonzero)
            output = model(inputs_embeds=vectors)
            rows.append(
                {
                    "nonzero": nonzero,
                    "mean_updates": float(output.n_updates.mean()),
                    "mean_ponder_cost": float(output.ponder_cost.mean()),
                    "accuracy": float((output.logits.argmax(-1) == targets).float().mean()),
                }
            )
    return rows


def correlation(xs, ys) -> float:
    x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()).clamp(min=1e-12))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--max-steps", type=int, default=20, help="M, the most updates per input (paper: 100)")
    parser.add_argument("--time-penalty", type=float, default=0.001, help="tau, the weight of the ponder cost")
    parser.add_argument("--train-steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one is fastest for this small RNN)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    config = ACTRNNConfig(
        vocab_size=2,  # unused: the inputs are vectors
        embedding_size=args.bits,
        hidden_size=args.hidden_size,
        rnn_type="tanh",
        max_ponder_steps=args.max_steps,
        time_penalty=args.time_penalty,
        num_labels=2,
        initializer_range=0.1,
    )
    model = ACTRNNForSequenceClassification(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = time.time()
    for step in range(1, args.train_steps + 1):
        vectors, targets, _ = parity_batch(args.batch_size, args.bits, generator)
        output = model(inputs_embeds=vectors, labels=targets)
        optimizer.zero_grad()
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 500 == 0:
            accuracy = float((output.logits.argmax(-1) == targets).float().mean())
            print(
                f"step {step}: loss {float(output.loss.detach()):.3f} accuracy {accuracy:.3f} "
                f"updates {float(output.n_updates.mean()):.2f}",
                flush=True,
            )
    model.eval()
    rows = evaluate(model, args.bits, generator)
    results = {
        "args": vars(args),
        "train_seconds": round(time.time() - start, 1),
        "overall_accuracy": sum(r["accuracy"] for r in rows) / len(rows),
        "corr_nonzero_vs_updates": correlation([r["nonzero"] for r in rows], [r["mean_updates"] for r in rows]),
        "by_difficulty": rows,
    }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
