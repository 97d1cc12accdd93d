"""How strongly the past reaches a fresh policy's output through GTrXL's gates (issue 30), against TrXL-I: the norm of
d(logits at the last step) / d(encoded input k steps back), and the gradient norm reaching the attention weights and
the feed-forward weights, for `make_policy`'s RepeatPreviousMedium policies at initialisation (8 random one-hot suit
sequences of 40 steps, seed 0). Arms are AGENT:GATE_INIT:B_G as in bench_gtrxl_rl_gate_sweep.py.

    python benchmarks/bench_gtrxl_init_reach.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gtrxl_rl_gate_sweep import init_gate_matrices  # noqa: E402

ARMS = [
    "trxl_i:default:2",
    "gtrxl:normal:2",
    "gtrxl:normal:1",
    "gtrxl:normal:0",
    "gtrxl:xavier:2",
    "gtrxl:xavier:1",
    "gtrxl:xavier:0",
]
LENGTH, LAGS = 40, (0, 1, 8, 32)


def reach(arm: str) -> dict:
    from hf_txvariants.rl import make_policy, make_vector_env

    agent, gate_init, gate_bias = arm.split(":")
    envs = make_vector_env("RepeatPreviousMedium", 1, seed=0)
    torch.manual_seed(0)
    fields = {"gate_bias": float(gate_bias)} if agent == "gtrxl" else {}
    policy = make_policy(agent, envs.single_observation_space, envs.single_action_space, **fields)
    init_gate_matrices(policy, gate_init)
    suits = torch.randint(0, 4, (8, LENGTH), generator=torch.Generator().manual_seed(0))
    observations = torch.cat(
        [
            torch.nn.functional.one_hot(suits, 4),
            torch.nn.functional.one_hot((torch.arange(LENGTH) == 0).long(), 2).expand(8, -1, -1),
        ],
        dim=-1,
    ).float()
    inputs = policy.encoder(observations).detach().requires_grad_(True)
    starts = torch.zeros(8, LENGTH, dtype=torch.bool)
    starts[:, 0] = True
    hidden, _ = policy.body(inputs, policy.initial_state(8), starts)
    logits = policy.policy_head(hidden)
    (gradient,) = torch.autograd.grad(logits[:, -1].pow(2).sum(), inputs, retain_graph=True)
    result = {f"k={k}": gradient[:, LENGTH - 1 - k].norm(dim=-1).mean().item() for k in LAGS}
    policy.zero_grad()
    logits.pow(2).sum().backward()
    for part in ("attention.", "feed_forward."):
        norms = [p.grad.norm() ** 2 for n, p in policy.named_parameters() if part in n and p.grad is not None]
        result[part.rstrip(".")] = float(sum(norms) ** 0.5)
    return result


def main():
    torch.set_num_threads(1)
    print(
        "| arm (agent:gate init:b_g) | "
        + " | ".join(f"d logits / d input, k={k} back" for k in LAGS)
        + " | grad norm, attention | grad norm, feed-forward |"
    )
    print("|---|" + "---|" * (len(LAGS) + 2))
    for arm in ARMS:
        r = reach(arm)
        print(
            f"| {arm} | "
            + " | ".join(f"{r[f'k={k}']:.1e}" for k in LAGS)
            + f" | {r['attention']:.1e} | {r['feed_forward']:.1e} |"
        )


if __name__ == "__main__":
    main()
