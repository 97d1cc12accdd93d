"""GTrXL in TorchRL (`hf_txvariants.rl.torchrl`: `MemoryModule`, TorchRL's `Collector` and `ClipPPOLoss` through
`train_clip_ppo`) beside the project's own loop (`train_ppo`): the same network (`make_policy("gtrxl", ...)`), the same
PPO settings (`PPOSettings`), the same environment steps and seeds, in one run (issue 53, item 2).

- `train_ppo`: `make_vector_env` (16 envs), one process.
- TorchRL: `make_torchrl_env` (a `SerialEnv` of 16 `GymWrapper`s with `InitTracker`, one process: on 2 shared cores
  16 `ParallelEnv` workers would measure the scheduler), the module's primer, `train_clip_ppo`.

What differs in the maths: ClipPPOLoss standardises the advantages by their std clamped at 1e-6 (`train_ppo`: std +
1e-8) and runs the shared body twice per minibatch (once as the actor, once as the critic);
the rest (GAE from the values computed while acting, segments re-run from the stored memory, clip, entropy, value
weight, gradient norm, Adam eps 1e-5) is `train_ppo`'s. MMER: POPGym's score, the best mean return of 100 consecutive
training episodes. steps/s: environment steps over the training loop's wall time. One torch thread.

    python benchmarks/bench_torchrl.py                               # RepeatPreviousMedium, 200k steps, seeds 0 1 2
    python benchmarks/bench_torchrl.py --task txv/ProofOfMemory-v0 --total-steps 30000 --output /tmp/pom.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

NUM_ENVS = 16
TASKS = {
    # benchmarks/results/rllib.md's (and bench_sb3.py's) settings: POPGym's previous action, mem_len 32, segments of 64
    "RepeatPreviousMedium": dict(previous_action=True, gtrxl={"mem_len": 32}, ppo={"segment_length": 64}),
    "txv/ProofOfMemory-v0": dict(previous_action=False, gtrxl={}, ppo={"segment_length": 16}),
}
TRAINERS = ("train_ppo", "TorchRL")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_train_ppo(task, setting, settings, seed):
    import torch

    from hf_txvariants.rl import make_policy, make_vector_env, train_ppo

    envs = make_vector_env(task, NUM_ENVS, seed=seed, previous_action=setting["previous_action"])
    torch.manual_seed(seed)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space, **setting["gtrxl"])
    history = train_ppo(policy, envs, settings, seed=seed)
    envs.close()
    return policy.num_parameters, history


def run_torchrl(task, setting, settings, seed):
    import torch

    from hf_txvariants.rl import make_env, make_policy
    from hf_txvariants.rl.torchrl import MemoryModule, make_torchrl_env, train_clip_ppo

    env = make_torchrl_env(task, NUM_ENVS, previous_action=setting["previous_action"])
    spaces = make_env(task, previous_action=setting["previous_action"])
    torch.manual_seed(seed)
    module = MemoryModule(make_policy("gtrxl", spaces.observation_space, spaces.action_space, **setting["gtrxl"]))
    env.append_transform(module.make_tensordict_primer())
    history = train_clip_ppo(env, module, settings, seed=seed)
    return module.policy.num_parameters, history


def table(records: list[dict]) -> str:
    lines = [
        "| task | trainer | seed | steps | MMER | final mean return | steps/s | x train_ppo "
        "| load (1/5/15 min) at start |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    speed = {(r["task"], r["seed"]): r["steps_per_second"] for r in records if r["trainer"] == "train_ppo"}
    for r in records:
        base = speed.get((r["task"], r["seed"]))
        ratio = f"{r['steps_per_second'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {r['task']} | {r['trainer']} | {r['seed']} | {r['steps'][-1]:,} | {r['mmer']:.3f} | "
            f"{r['final_mean_return']:.3f} | {r['steps_per_second']:,.0f} | {ratio} | {r['load_before']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="RepeatPreviousMedium", choices=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    parser.add_argument("--output", default="torchrl_runs.json", help="every run, learning curves included (JSON)")
    args = parser.parse_args(argv)

    import torch

    from hf_txvariants.rl import PPOSettings
    from hf_txvariants.txv_files import atomic_write_bytes

    torch.set_num_threads(1)
    setting = TASKS[args.task]
    settings = PPOSettings(total_steps=args.total_steps, **setting["ppo"])
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load {load()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        flush=True,
    )
    records = []
    for i, seed in enumerate(args.seeds):
        for trainer in list(args.trainers) if i % 2 == 0 else list(reversed(args.trainers)):
            print(f"{args.task} seed {seed}: {trainer}, {settings.total_steps:,} steps ...", flush=True)
            started = load()
            run = run_train_ppo if trainer == "train_ppo" else run_torchrl
            parameters, history = run(args.task, setting, settings, seed)
            record = {"task": args.task, "trainer": trainer, "seed": seed, "parameters": parameters}
            record.update(load_before=started, load_after=load(), **history.to_dict())
            records.append(record)
            print(f"  MMER {record['mmer']:.3f}, {record['steps_per_second']:.0f} steps/s", flush=True)
            atomic_write_bytes(Path(args.output), json.dumps(records, indent=1).encode())  # after every run
    print("\n" + table(records))
    return records


if __name__ == "__main__":
    main()
