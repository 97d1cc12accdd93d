"""Runs a saved `MemoryPolicy` in its environment and prints the mean return.

    python -m hf_txvariants.rl.evaluate --policy FOLDER_OR_REPO_ID --task txv/ProofOfMemory-v0 --episodes 100

`--task` is what `make_env` takes: a POPGym task name (`POPGYM_TASKS`) or a gymnasium id. Actions are the most likely
ones unless `--sample` is given. A policy saved for other observation or action spaces than the task's is refused,
naming both.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from .envs import make_vector_env
from .policy import MemoryPolicy


@torch.no_grad()
def evaluate_policy(policy: MemoryPolicy, envs, episodes: int, deterministic: bool = True, seed: int = 0) -> list:
    """The returns of `episodes` episodes of `policy` on `envs` (a vector env that resets within the step, as
    `make_vector_env` builds). Env i plays `(episodes + i) // num_envs` of them (SB3's `evaluate_policy` split), so
    short episodes are not over-counted."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    policy.check_spaces(envs.single_observation_space, envs.single_action_space)
    policy.eval()
    num_envs = envs.num_envs
    targets = np.array([(episodes + i) // num_envs for i in range(num_envs)])
    counts, running, returns = np.zeros(num_envs, dtype=int), np.zeros(num_envs), []
    observations, _ = envs.reset(seed=seed)
    state = policy.initial_state(num_envs)
    starts = np.ones(num_envs, dtype=bool)
    while (counts < targets).any():
        step = policy.act(observations, state, starts, greedy=deterministic)
        observations, rewards, terminated, truncated, _ = envs.step(policy.env_actions(step.actions))
        state, starts = step.state, np.logical_or(terminated, truncated)
        running += rewards
        for i in np.flatnonzero(starts):
            if counts[i] < targets[i]:
                returns.append(float(running[i]))
                counts[i] += 1
            running[i] = 0.0
    return returns


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True, help="a folder MemoryPolicy.save_pretrained wrote, or a Hub repo id")
    parser.add_argument("--task", required=True, help="a POPGym task name or a gymnasium id")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", action="store_true", help="sample the actions (default: the most likely)")
    parser.add_argument("--device", default=None, help="e.g. cuda (default: cpu)")
    args = parser.parse_args(argv)
    try:
        policy = MemoryPolicy.from_pretrained(args.policy, device=args.device)
        envs = make_vector_env(args.task, max(1, min(args.num_envs, args.episodes)), seed=args.seed)
        try:
            returns = evaluate_policy(policy, envs, args.episodes, deterministic=not args.sample, seed=args.seed)
        finally:
            envs.close()
    except (ValueError, FileNotFoundError) as error:  # one clear line, no traceback
        raise SystemExit(f"error: {error}") from None
    mean = float(np.mean(returns))
    print(
        f"{args.task}: mean return {mean:.4f} +/- {np.std(returns):.4f} over {len(returns)} episodes "
        f"({'sampled' if args.sample else 'greedy'} actions)"
    )
    return mean


if __name__ == "__main__":
    main()
