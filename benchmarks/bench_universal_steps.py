"""Universal Transformer with ACT: the average number of steps per position on easy versus hard inputs.

    python benchmarks/bench_universal_steps.py [--train-steps 400] [--seed 0]

A small encoder task with two kinds of rows, told apart by the first token (`--task window`, the default):
    easy (token 10): y_t = x_t                                   (copy the digit)
    hard (token 11): y_t = max(x_{t-2}, ..., x_{t+2})             (the largest digit of a window of five)
or (`--task hops`) pointer chasing over the row's digits: easy y_t = x_{x_t}, hard y_t = x_{x_{x_{x_t}}}.
One UniversalTransformerForMaskedLM (ACT, max 8 steps) is trained on a mix of both for `--train-steps` steps, then
evaluated on fresh rows of each kind: mean steps per position (n_updates), ponder cost and accuracy. Both kinds are
measured on the same model in the same run. CPU, a few minutes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from hf_txvariants import UniversalTransformerConfig, UniversalTransformerForMaskedLM

EASY, HARD, LENGTH = 10, 11, 12


def follow(digits: torch.Tensor, hops: int) -> torch.Tensor:
    """hops >= 1: y_t = x_{x_{...x_t}} (each digit points at a position 0..9 of the row)."""
    pointer = digits
    for _ in range(hops):
        pointer = digits.gather(1, pointer)
    return pointer


def make_batch(batch_size: int, hard: bool | None, generator: torch.Generator, task: str = "window"):
    digits = torch.randint(0, 10, (batch_size, LENGTH), generator=generator)
    if hard is None:
        is_hard = torch.rand(batch_size, generator=generator) < 0.5
    else:
        is_hard = torch.full((batch_size,), hard)
    if task == "hops":  # easy: one hop, hard: three hops
        targets = torch.where(is_hard[:, None], follow(digits, 3), follow(digits, 1))
    else:
        windows = torch.nn.functional.pad(digits, (2, 2)).unfold(1, 5, 1)  # [batch, LENGTH, 5], 0 off the edges
        targets = torch.where(is_hard[:, None], windows.max(-1).values, digits)
    task = torch.where(is_hard, HARD, EASY)[:, None]
    input_ids = torch.cat([task, digits], dim=1)
    labels = torch.cat([torch.full_like(task, -100), targets], dim=1)
    return input_ids, labels


def evaluate(model, hard: bool, generator, task: str, batches: int = 8):
    steps = ponder = correct = total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            input_ids, labels = make_batch(64, hard, generator, task)
            output = model(input_ids, labels=labels)
            real = labels != -100
            steps += float(output.n_updates[real].sum())
            correct += float((output.logits.argmax(-1) == labels)[real].sum())
            ponder += float(output.ponder_cost[real].sum())
            total += int(real.sum())
    return {"mean_steps": steps / total, "ponder_cost": ponder / total, "accuracy": correct / total}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--act-loss-weight", type=float, default=0.001)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--halting-bias-init", type=float, default=-1.0)
    parser.add_argument(
        "--task",
        choices=["window", "hops"],
        default="window",
        help="window: copy vs max of 5; hops: pointer chasing, 1 hop vs 3 hops",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    config = UniversalTransformerConfig(
        vocab_size=12,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        num_hidden_layers=8,
        use_act=True,
        act_loss_weight=args.act_loss_weight,
        halting_bias_init=args.halting_bias_init,
        dropout=0.0,
    )
    model = UniversalTransformerForMaskedLM(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = time.time()
    for step in range(1, args.train_steps + 1):
        input_ids, labels = make_batch(64, None, generator, args.task)
        loss = model(input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step}: loss {float(loss.detach()):.3f}", flush=True)
    model.eval()
    results = {
        "train_steps": args.train_steps,
        "act_loss_weight": args.act_loss_weight,
        "halting_bias_init": args.halting_bias_init,
        "task": args.task,
        "train_seconds": round(time.time() - start, 1),
        "easy": evaluate(model, False, generator, args.task),
        "hard": evaluate(model, True, generator, args.task),
    }
    results["hard_over_easy_steps"] = results["hard"]["mean_steps"] / results["easy"]["mean_steps"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
