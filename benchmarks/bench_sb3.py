"""GTrXL in Stable-Baselines3 (`hf_txvariants.rl.sb3.MemoryPPO`) beside the project's own loop (`train_ppo`) and
sb3-contrib's `RecurrentPPO` with an LSTM of (nearly) the same parameter count, at the same PPO settings, the same
environment steps and the same seeds, in one run (issue 53, item 1).

- `train_ppo`: `make_policy("gtrxl", ...)`, `make_vector_env` (16 envs), `PPOSettings`.
- `MemoryPPO`: the same network and settings (`ppo_arguments`), SB3's `DummyVecEnv` of the same 16 envs.
- `RecurrentPPO`: `MlpLstmPolicy`, one LSTM layer shared by actor and critic (`shared_lstm=True`,
  `enable_critic_lstm=False`), linear heads on it (`net_arch=[]`), its width chosen so the policy's parameter count is
  the closest to the GTrXL policy's; the same n_steps, batch_size, epochs, learning rate, discount, GAE lambda, clip,
  entropy and value weights, gradient norm. It back-propagates through each env's whole rollout (128 steps) cut at
  episode ends, where the other two learn on stored segments of `segment_length` steps.

MemoryPPO is built with `seed` (SB3 seeds torch, then `make_policy` draws the same initial weights as `train_ppo`'s
run, and the SB3 envs are seeded as `make_vector_env`'s) and torch is seeded again just before `learn`, as `train_ppo`
seeds it when it starts: every draw (actions, minibatches) is then the one `train_ppo` makes, and the two runs are the
same run, update for update (tests/test_rl_sb3.py checks this on a tiny policy). Without that second seeding the
actions come from another stream of the same seed: another sample of the seed noise.

MMER: POPGym's score, the best mean return of 100 consecutive training episodes (after each update), the returns
counted from the rewards the vector env gives (the same for all three). steps/s: environment steps over the training
loop's wall time. One torch thread per process; the trainers alternate seed by seed, so a drifting load weighs on each.

    python benchmarks/bench_sb3.py                                   # RepeatPreviousMedium, 200k steps, seeds 0 1 2
    python benchmarks/bench_sb3.py --task txv/ProofOfMemory-v0 --total-steps 30000 --output /tmp/pom.json

Prints the table of benchmarks/results/sb3.md and writes every run (learning curves included) to `--output`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

NUM_ENVS = 16
TASKS = {
    # benchmarks/results/rllib.md's settings (bench_memory_rl_hard.py's): POPGym's previous action, mem_len 32,
    # segments of 64
    "RepeatPreviousMedium": dict(previous_action=True, gtrxl={"mem_len": 32}, ppo={"segment_length": 64}),
    # the PPOSettings defaults; GTrXL's default memory (make_policy: mem_len 64); segments of 16 (episodes of 6-16)
    "txv/ProofOfMemory-v0": dict(previous_action=False, gtrxl={}, ppo={"segment_length": 16}),
}
TRAINERS = ("train_ppo", "MemoryPPO", "RecurrentPPO")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def gym_spaces(task, previous_action):
    from hf_txvariants.rl import make_env

    env = make_env(task, previous_action=previous_action)
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


def run_train_ppo(task, setting, settings, seed):
    import torch

    from hf_txvariants.rl import make_policy, make_vector_env, train_ppo

    envs = make_vector_env(task, NUM_ENVS, seed=seed, previous_action=setting["previous_action"])
    torch.manual_seed(seed)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space, **setting["gtrxl"])
    history = train_ppo(policy, envs, settings, seed=seed)
    envs.close()
    return policy.num_parameters, history


def sb3_envs(task, previous_action, seed):
    from stable_baselines3.common.env_util import make_vec_env

    from hf_txvariants.rl import make_env

    return make_vec_env(lambda: make_env(task, previous_action=previous_action), n_envs=NUM_ENVS, seed=seed)


def run_memory_ppo(task, setting, settings, seed):
    import torch

    from hf_txvariants.rl.sb3 import MemoryPPO, ppo_arguments

    envs = sb3_envs(task, setting["previous_action"], seed)
    model = MemoryPPO(
        "gtrxl",
        envs,
        policy_kwargs=dict(setting["gtrxl"]),
        seed=seed,
        device="cpu",
        **ppo_arguments(settings, NUM_ENVS),
    )
    torch.manual_seed(seed)  # what train_ppo does first: the same draws, so the same run (see the module's docstring)
    model.learn(settings.total_steps)
    envs.close()
    return model.memory_policy.num_parameters, model.history


def recurrent_ppo(envs, settings, seed, lstm_hidden_size, verbose=0):
    from sb3_contrib import RecurrentPPO

    return RecurrentPPO(
        "MlpLstmPolicy",
        envs,
        learning_rate=settings.learning_rate,
        n_steps=settings.rollout_steps,
        batch_size=settings.rollout_steps * NUM_ENVS // settings.minibatches,
        n_epochs=settings.epochs,
        gamma=settings.gamma,
        gae_lambda=settings.gae_lambda,
        clip_range=settings.clip,
        ent_coef=settings.entropy_coef,
        vf_coef=settings.value_coef,
        max_grad_norm=settings.max_grad_norm,
        policy_kwargs=dict(
            lstm_hidden_size=lstm_hidden_size, n_lstm_layers=1, shared_lstm=True, enable_critic_lstm=False, net_arch=[]
        ),
        seed=seed,
        device="cpu",
        verbose=verbose,
    )


def matched_lstm_width(envs, settings, target: int) -> int:
    """The LSTM width whose RecurrentPPO policy has the parameter count closest to `target`."""
    from hf_txvariants.rl import parameter_matched_hidden_size

    class Counted:
        def __init__(self, width):
            model = recurrent_ppo(envs, settings, 0, width)
            self.num_parameters = sum(p.numel() for p in model.policy.parameters())

    return parameter_matched_hidden_size(Counted, target, low=4, high=1024)


def run_recurrent_ppo(task, setting, settings, seed, width):
    from stable_baselines3.common.callbacks import BaseCallback

    from hf_txvariants.rl import TrainingHistory

    class Returns(BaseCallback):
        """train_ppo's window of returns, from the rewards and dones of every step."""

        def __init__(self, history):
            super().__init__()
            self.history, self.running, self.finished, self.started = history, np.zeros(NUM_ENVS), [], None

        def _on_training_start(self):
            self.started = time.perf_counter()

        def _on_step(self):
            dones = self.locals["dones"]
            self.running += self.locals["rewards"]
            self.finished.extend(self.running[dones].tolist())
            self.history.episodes += int(dones.sum())
            self.running[dones] = 0.0
            return True

        def _on_rollout_end(self):
            window = self.finished[-settings.return_window :]
            self.finished = window
            full = len(window) == settings.return_window
            self.history.steps.append(self.num_timesteps)
            self.history.mean_returns.append(float(np.mean(window)) if full else None)
            self.history.seconds = time.perf_counter() - self.started

    envs = sb3_envs(task, setting["previous_action"], seed)
    model = recurrent_ppo(envs, settings, seed, width)
    history = TrainingHistory(settings={"lstm_hidden_size": width})
    started = time.perf_counter()
    model.learn(settings.total_steps, callback=Returns(history))
    history.seconds = time.perf_counter() - started  # (the last update included, as train_ppo's)
    envs.close()
    return sum(p.numel() for p in model.policy.parameters()), history


def table(records: list[dict]) -> str:
    lines = [
        "| task | trainer | seed | parameters | steps | MMER | final mean return | steps/s | x train_ppo | "
        "load (1/5/15 min) at start |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    speed = {(r["task"], r["seed"]): r["steps_per_second"] for r in records if r["trainer"] == "train_ppo"}
    for r in records:
        base = speed.get((r["task"], r["seed"]))
        ratio = f"{r['steps_per_second'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {r['task']} | {r['trainer']} | {r['seed']} | {r['parameters']:,} | {r['steps'][-1]:,} | "
            f"{r['mmer']:.3f} | {r['final_mean_return']:.3f} | {r['steps_per_second']:,.0f} | {ratio} | "
            f"{r['load_before']} |"
        )
    by_trainer = {}
    for r in records:
        by_trainer.setdefault((r["task"], r["trainer"]), []).append(r)
    lines += ["", "| task | trainer | seeds | MMER mean (min-max) | steps/s mean |", "|---|---|---|---|---|"]
    for (task, trainer), runs in by_trainer.items():
        mmers = [r["mmer"] for r in runs]
        lines.append(
            f"| {task} | {trainer} | {' '.join(str(r['seed']) for r in runs)} | {np.mean(mmers):.3f} "
            f"({min(mmers):.3f}-{max(mmers):.3f}) | {np.mean([r['steps_per_second'] for r in runs]):,.0f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="RepeatPreviousMedium", choices=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    parser.add_argument("--output", default="sb3_runs.json", help="every run, learning curves included (JSON)")
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
    from hf_txvariants.rl import make_policy

    target = make_policy("gtrxl", *gym_spaces(args.task, setting["previous_action"]), **setting["gtrxl"]).num_parameters
    width = matched_lstm_width(sb3_envs(args.task, setting["previous_action"], 0), settings, target)
    print(f"GTrXL policy: {target:,} parameters; RecurrentPPO's LSTM: {width} wide", flush=True)
    records = []
    for i, seed in enumerate(args.seeds):
        order = list(args.trainers) if i % 2 == 0 else list(reversed(args.trainers))
        for trainer in order:
            print(f"{args.task} seed {seed}: {trainer}, {settings.total_steps:,} steps ...", flush=True)
            started = load()
            if trainer == "train_ppo":
                parameters, history = run_train_ppo(args.task, setting, settings, seed)
            elif trainer == "MemoryPPO":
                parameters, history = run_memory_ppo(args.task, setting, settings, seed)
            else:
                parameters, history = run_recurrent_ppo(args.task, setting, settings, seed, width)
            record = {"task": args.task, "trainer": trainer, "seed": seed, "parameters": parameters}
            record.update(load_before=started, load_after=load(), **history.to_dict())
            records.append(record)
            print(
                f"  MMER {record['mmer']:.3f}, {record['steps_per_second']:.0f} steps/s, load {started} -> "
                f"{record['load_after']}",
                flush=True,
            )
            atomic_write_bytes(Path(args.output), json.dumps(records, indent=1).encode())  # after every run
    print("\n" + table(records))
    return records


if __name__ == "__main__":
    main()
