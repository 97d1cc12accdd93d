"""A memory agent for reinforcement learning in a few lines: `MemoryPolicy` (GTrXL, TrXL-I, or the GRU and MLP
baselines at the same parameter budget) trained with PPO on vectorised gymnasium environments.

Tasks: the proof-of-memory task (`txv/ProofOfMemory-v0`: see the goal's side for 2 steps, walk there after it is
gone) and POPGym's (`pip install popgym`): RepeatFirstEasy (say the first card's suit at every step of a 52-card deal)
and RepeatPreviousEasy (say the suit of the card 4 steps back). The score is POPGym's MMER: the best mean return of
100 consecutive training episodes, in [-1, 1] (1: always right).

    python examples/rl_memory.py        # GTrXL and GRU, proof-of-memory and RepeatFirstEasy, 100k steps each: minutes
    python examples/rl_memory.py --tasks RepeatPreviousEasy --agents gtrxl trxl_i gru mlp --seeds 0 1 2

The loop itself, with any policy, is:

    envs = make_vector_env("RepeatFirstEasy", num_envs=16, seed=0)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space)
    history = train_ppo(policy, envs, PPOSettings(total_steps=150_000), seed=0)

and acting with a trained policy, one step at a time (the memory is reset where an episode starts):

    state, starts = policy.initial_state(envs.num_envs), torch.ones(envs.num_envs, dtype=torch.bool)
    observations, _ = envs.reset(seed=1)
    while ...:
        step = policy.act(observations, state, starts, greedy=True)
        observations, rewards, terminated, truncated, _ = envs.step(step.actions.numpy())
        state, starts = step.state, torch.as_tensor(terminated | truncated)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields

import torch

from hf_txvariants.rl import (
    AGENTS,
    DEFAULT_GTRXL_FIELDS,
    RL_GATE_BIAS,
    PPOSettings,
    make_policy,
    make_vector_env,
    train_ppo,
)


def progress(task, agent, seed, every):
    def log(history):
        if every and len(history.steps) % every == 0:
            score = history.mean_returns[-1]
            score = "(fewer than return_window episodes so far)" if score is None else f"{score:.3f}"
            print(f"  {task} {agent} seed {seed}: {history.steps[-1]} steps, mean return {score}", flush=True)

    return log


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=["txv/ProofOfMemory-v0", "RepeatFirstEasy"],
        help="POPGym task names (RepeatFirstEasy, ...) or gymnasium ids",
    )
    parser.add_argument("--agents", nargs="+", default=["gtrxl", "gru"], choices=AGENTS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument(
        "--previous-action",
        action="store_true",
        help="show the previous action too, as POPGym's baselines do (POPGym tasks only)",
    )
    for name, value in DEFAULT_GTRXL_FIELDS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=value, help="GTrXL shape")
    parser.add_argument(
        "--gate-bias",
        type=float,
        default=RL_GATE_BIAS,
        help="b_g of GTrXL's GRU gates (the paper's: 2; make_policy's RL default: 0, see RL_GATE_BIAS)",
    )
    parser.add_argument(
        "--episode-clock",
        action="store_true",
        help="give every agent the step within its episode (EpisodeClock), e.g. for POPGym's Autoencode",
    )
    for setting in fields(PPOSettings):
        default = 100_000 if setting.name == "total_steps" else setting.default
        parser.add_argument(f"--{setting.name.replace('_', '-')}", type=type(setting.default), default=default)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small models are fastest on one)")
    parser.add_argument("--log-every", type=int, default=10, help="print the mean return every this many updates")
    parser.add_argument("--output", help="write every run's learning curve to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = PPOSettings(**{s.name: getattr(args, s.name) for s in fields(PPOSettings)})
    gtrxl_fields = {name: getattr(args, name) for name in DEFAULT_GTRXL_FIELDS}
    runs = []
    for task in args.tasks:
        for agent in args.agents:
            for seed in args.seeds:
                envs = make_vector_env(task, args.num_envs, seed=seed, previous_action=args.previous_action)
                torch.manual_seed(seed)
                shape = {**gtrxl_fields, **({"gate_bias": args.gate_bias} if agent == "gtrxl" else {})}
                policy = make_policy(
                    agent,
                    envs.single_observation_space,
                    envs.single_action_space,
                    episode_clock=args.episode_clock,
                    **shape,
                )
                history = train_ppo(policy, envs, settings, seed=seed, log=progress(task, agent, seed, args.log_every))
                envs.close()
                runs.append(
                    {
                        "task": task,
                        "agent": agent,
                        "seed": seed,
                        "parameters": policy.num_parameters,
                        **history.to_dict(),
                    }
                )
                print(
                    f"{task} {agent} seed {seed}: MMER {history.mmer:.3f}, {history.steps_per_second:.0f} steps/s",
                    flush=True,
                )
    print(f"\n{settings.total_steps} steps x {len(args.seeds)} seed(s), {args.num_envs} envs:")
    print("| task | agent | parameters | MMER per seed | steps/s |")
    print("|---|---|---|---|---|")
    for task in args.tasks:
        for agent in args.agents:
            rows = [r for r in runs if r["task"] == task and r["agent"] == agent]
            scores = " / ".join(f"{r['mmer']:.3f}" for r in rows)
            speed = sum(r["steps_per_second"] for r in rows) / len(rows)
            print(f"| {task} | {agent} | {rows[0]['parameters']} | {scores} | {speed:.0f} |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"settings": asdict(settings), "gtrxl": gtrxl_fields, "runs": runs}, f, indent=2)
    return runs


if __name__ == "__main__":
    main()
