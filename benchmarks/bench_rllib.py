"""GTrXL through RLlib's PPO (`hf_txvariants.rl.rllib`, RLlib's current API stack) beside the project's own loop
(`train_ppo`): the same network (`make_policy("gtrxl", ...)`), the same PPO settings (`ppo_training_settings`), the
same environment steps, one seed, on the proof-of-memory task and on POPGym's RepeatPreviousMedium (with POPGym's
previous action, as in bench_memory_rl_hard.py: mem_len 32, segments of 64).

For each: the MMER (POPGym's score: the best mean return of 100 consecutive training episodes, in [-1, 1]) of both and
their steps/s on this machine (train_ppo: one process, one torch thread, 16 envs; RLlib: 2 remote env runners of 8
envs each and the Learner in the driver, one torch thread per process). Then the RLlib-trained module is saved in
MemoryPolicy's format (`save_pretrained`), loaded with `MemoryPolicy.from_pretrained`, scored frozen (greedy actions,
`evaluate_policy`) beside train_ppo's policy, and pushed with the policy card (`push_to_hub`) to a local stand-in for
the Hub (a folder; the Hub is not reachable here), from which it loads again.

    python benchmarks/bench_rllib.py                          # both tasks, one seed: about 40 minutes on 2 loaded cores
    python benchmarks/bench_rllib.py --tasks txv/ProofOfMemory-v0 --output /tmp/pom.json

Prints the table of benchmarks/results/rllib.md and writes every run (learning curves included) to `--output`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

NUM_ENVS = 16
ENV_RUNNERS = 2
TASKS = {
    # the PPOSettings defaults; GTrXL's default memory (make_policy: mem_len 64). RLlib learns on segments of at most
    # 16 steps (max_seq_len), the longest episode: every episode is one segment, as at 64, but RLlib pads each
    # episode's last segment to max_seq_len, and at 64 most of the Learner's batch would be padding (105 steps/s
    # against 851 for train_ppo on 2026-11-28)
    "txv/ProofOfMemory-v0": dict(total_steps=50_000, previous_action=False, gtrxl={}, ppo={}, max_seq_len=16),
    # bench_memory_rl_hard.py's settings for this task
    "RepeatPreviousMedium": dict(
        total_steps=200_000, previous_action=True, gtrxl={"mem_len": 32}, ppo={"segment_length": 64}
    ),
}
EVALUATION_EPISODES = 200


def window_means(returns_per_iteration: list[list[float]], window: int) -> list[float | None]:
    """After each iteration, the mean return of the last `window` finished episodes (None until there are `window`),
    as `train_ppo`'s `TrainingHistory.mean_returns`."""
    finished, means = [], []
    for returns in returns_per_iteration:
        finished = (finished + list(returns))[-window:]
        means.append(float(np.mean(finished)) if len(finished) == window else None)
    return means


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_train_ppo(task: str, setting: dict, seed: int):
    import torch

    from hf_txvariants.rl import PPOSettings, make_policy, make_vector_env, train_ppo

    envs = make_vector_env(task, NUM_ENVS, seed=seed, previous_action=setting["previous_action"])
    torch.manual_seed(seed)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space, **setting["gtrxl"])
    settings = PPOSettings(total_steps=setting["total_steps"], **setting["ppo"])
    started = load()
    history = train_ppo(policy, envs, settings, seed=seed)
    envs.close()
    return policy, {
        "trainer": "train_ppo",
        "load_before": started,
        "load_after": load(),
        "parameters": policy.num_parameters,
        **history.to_dict(),
    }


def run_rllib(task: str, setting: dict, seed: int):
    """RLlib's PPO with the module; returns the trained module and the run's record."""
    import dataclasses

    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env

    from hf_txvariants.rl import PPOSettings, TrainingHistory, make_env
    from hf_txvariants.rl.rllib import EPISODE_RETURNS, EpisodeReturns, memory_module_spec, ppo_training_settings

    previous_action = setting["previous_action"]
    env = make_env(task, previous_action=previous_action)
    settings = PPOSettings(total_steps=setting["total_steps"], **setting["ppo"])
    max_seq_len = setting.get("max_seq_len", settings.segment_length)
    spec = memory_module_spec(
        "gtrxl", env.observation_space, env.action_space, max_seq_len=max_seq_len, **setting["gtrxl"]
    )
    env.close()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster for this run only
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=ENV_RUNNERS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},  # one torch thread per env runner, as train_ppo's
    )
    try:
        register_env("txv-task", lambda _: make_env(task, previous_action=previous_action))
        config = (
            PPOConfig()
            .environment("txv-task")
            .env_runners(num_env_runners=ENV_RUNNERS, num_envs_per_env_runner=NUM_ENVS // ENV_RUNNERS)
            .learners(num_learners=0)
            .training(**ppo_training_settings(settings, NUM_ENVS))
            .rl_module(rl_module_spec=spec)
            .callbacks(EpisodeReturns)
            .debugging(seed=seed)
        )
        built = time.perf_counter()
        algo = config.build_algo()
        build_seconds = time.perf_counter() - built
        history = TrainingHistory(settings=dataclasses.asdict(settings))
        returns, started_load, started = [], load(), time.perf_counter()
        while not history.steps or history.steps[-1] < settings.total_steps:
            result = algo.train()
            runners = result["env_runners"]
            returns.append(runners.get(EPISODE_RETURNS, []))
            history.steps.append(int(runners["num_env_steps_sampled_lifetime"]))
            history.episodes += len(returns[-1])
            history.seconds = time.perf_counter() - started
        history.mean_returns = window_means(returns, settings.return_window)
        module = algo.get_module()
        policy_state = {name: tensor.clone() for name, tensor in module.policy.state_dict().items()}
        algo.stop()
    finally:
        ray.shutdown()
    return (
        module,
        policy_state,
        {
            "trainer": "rllib",
            "env_runners": ENV_RUNNERS,
            "build_seconds": build_seconds,
            "load_before": started_load,
            "load_after": load(),
            "parameters": module.policy.num_parameters,
            **history.to_dict(),
        },
    )


class LocalHub:
    """A stand-in for `huggingface_hub.HfApi` (the two calls `push_to_hub` makes): a repo is a folder under `root`,
    an upload copies the folder's files into it."""

    def __init__(self, root: Path):
        self.root = root

    def create_repo(self, repo_id, private=False, exist_ok=True, repo_type="model"):
        (self.root / repo_id).mkdir(parents=True, exist_ok=exist_ok)

    def upload_folder(self, *, repo_id, folder_path, repo_type, commit_message, revision=None, create_pr=False):
        for file in Path(folder_path).iterdir():
            shutil.copy2(file, self.root / repo_id / file.name)
        return f"local://{self.root / repo_id} ({commit_message})"


def frozen_score(policy, task: str, previous_action: bool) -> float:
    from hf_txvariants.rl import make_vector_env
    from hf_txvariants.rl.evaluate import evaluate_policy

    envs = make_vector_env(task, NUM_ENVS, seed=10_000, previous_action=previous_action)
    try:
        return float(np.mean(evaluate_policy(policy, envs, EVALUATION_EPISODES, seed=10_000)))
    finally:
        envs.close()


def share(task: str, setting: dict, module, policy_state: dict, workdir: Path) -> dict:
    """Saves the RLlib-trained module in MemoryPolicy's format, loads it back, scores it frozen, pushes it with the
    card to a local stand-in for the Hub, and loads the pushed folder."""
    import torch

    from hf_txvariants.rl import MemoryPolicy

    folder = workdir / "rllib-policy"
    files = module.save_pretrained(folder)
    loaded = MemoryPolicy.from_pretrained(folder)
    same = all(torch.equal(loaded.state_dict()[name], tensor) for name, tensor in policy_state.items())
    score = frozen_score(loaded, task, setting["previous_action"])
    repo_id = f"txv-bench/gtrxl-rllib-{task.replace('/', '-')}"
    hub = LocalHub(workdir / "hub")
    commit = loaded.push_to_hub(repo_id, task=task, mean_return=score, api=hub)
    pushed = MemoryPolicy.from_pretrained(workdir / "hub" / repo_id)
    card = (workdir / "hub" / repo_id / "README.md").read_text()
    return {
        "saved_files": files,
        "reloaded_weights_equal": same,
        "frozen_mean_return": score,
        "pushed": commit,
        "pushed_files": sorted(p.name for p in (workdir / "hub" / repo_id).iterdir()),
        "pushed_weights_equal": all(
            torch.equal(pushed.state_dict()[name], tensor) for name, tensor in policy_state.items()
        ),
        "card_metadata": card.split("---")[1].strip(),
    }


def table(records: list[dict]) -> str:
    lines = [
        "| task | trainer | steps | MMER | final mean return | frozen greedy mean return (200 episodes) | steps/s "
        "| load (1/5/15 min) before / after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        trainer = "RLlib PPO, 2 env runners" if r["trainer"] == "rllib" else "train_ppo"
        lines.append(
            f"| {r['task']} | {trainer} | {r['steps'][-1]:,} | {r['mmer']:.3f} | {r['final_mean_return']:.3f} | "
            f"{r['frozen_mean_return']:.3f} | {r['steps_per_second']:,.0f} | {r['load_before']} / {r['load_after']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, help="override every task's budget (e.g. a quick check)")
    parser.add_argument("--output", default="rllib_runs.json", help="every run, learning curves included (JSON)")
    args = parser.parse_args(argv)

    import torch

    from hf_txvariants.txv_files import atomic_write_bytes

    torch.set_num_threads(1)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load {load()}", flush=True)
    records = []
    with tempfile.TemporaryDirectory(prefix="txv-bench-rllib-") as tmp:
        for i, task in enumerate(args.tasks):
            setting = dict(TASKS[task])
            if args.total_steps:
                setting["total_steps"] = args.total_steps
            # the order alternates between tasks, so that a load that drifts over the run weighs on both trainers
            order = ("train_ppo", "rllib") if i % 2 == 0 else ("rllib", "train_ppo")
            for trainer in order:
                print(f"{task}: {trainer}, {setting['total_steps']:,} steps ...", flush=True)
                if trainer == "train_ppo":
                    policy, record = run_train_ppo(task, setting, args.seed)
                    record["frozen_mean_return"] = frozen_score(policy, task, setting["previous_action"])
                else:
                    module, policy_state, record = run_rllib(task, setting, args.seed)
                    workdir = Path(tmp) / task.replace("/", "-")
                    record.update(share(task, setting, module, policy_state, workdir))
                record.update(task=task, seed=args.seed, setting=setting)
                records.append(record)
                print(
                    f"  MMER {record['mmer']:.3f}, {record['steps_per_second']:.0f} steps/s, frozen "
                    f"{record['frozen_mean_return']:.3f}, load {record['load_before']} -> {record['load_after']}",
                    flush=True,
                )
                if trainer == "rllib":
                    print(
                        f"  saved {record['saved_files']}, from_pretrained weights equal: "
                        f"{record['reloaded_weights_equal']}; pushed {record['pushed_files']} to {record['pushed']}, "
                        f"weights equal: {record['pushed_weights_equal']}\n  card metadata:\n    "
                        + record["card_metadata"].replace("\n", "\n    "),
                        flush=True,
                    )
                atomic_write_bytes(Path(args.output), json.dumps(records, indent=1).encode())  # after every run
    print("\n" + table(records))
    return records


if __name__ == "__main__":
    main()
