"""GTrXL on public memory-RL tasks against the baselines RL users pick: PPO with GTrXL (GRU gate), TrXL-I (identity
map reordering, no gates), a GRU of the same parameter count and a memoryless MLP of the same count, with the same
PPO settings and the same environment steps, over several seeds.

Tasks:
- POPGym (Morad et al. 2023) RepeatFirstEasy (say the first card's suit at every step of a 52-card deal) and
  RepeatPreviousEasy (the suit of the card 4 steps back); observations are one-hot suits with POPGym's first-step
  flag; the previous action is NOT shown (with it RepeatFirst needs no memory, see `hf_txvariants.rl.popgym_env`).
- The proof-of-memory task of CleanRL's `ppo_trxl` (`txv/ProofOfMemory-v0`, written from its description).

Score: POPGym's MMER, the best mean return of 100 consecutive training episodes over the run, in [-1, 1], and the
sample efficiency: the steps after which that mean first reached 0.9. Steps per
second are each agent's whole training loop (acting, environment, learning) on one thread, with `--workers` runs
going at once.

    python benchmarks/bench_memory_rl.py            # 4 agents x 3 tasks x 5 seeds, about an hour on 2 CPU cores
    python benchmarks/bench_memory_rl.py --quick    # 1 seed, short budgets: a few minutes

Writes `--output` (every run's learning curve, JSON), `--plot` (the curves, PNG) and prints the table for
benchmarks/RESULTS.md (`--summarise RUNS_JSON` prints it again from a finished run's JSON).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from multiprocessing import get_context
from pathlib import Path

import numpy as np

TASKS = {"RepeatFirstEasy": 300_000, "RepeatPreviousEasy": 300_000, "txv/ProofOfMemory-v0": 100_000}
QUICK_TASKS = {"RepeatFirstEasy": 30_000, "RepeatPreviousEasy": 30_000, "txv/ProofOfMemory-v0": 12_000}
AGENTS = ["gtrxl", "trxl_i", "gru", "mlp"]
NUM_ENVS = 16
HERE = Path(__file__).resolve().parent


def run_one(task: str, agent: str, seed: int, total_steps: int) -> dict:
    """One training run in its own process, on one thread."""
    import torch

    torch.set_num_threads(1)
    from hf_txvariants.rl import PPOSettings, make_policy, make_vector_env, train_ppo

    envs = make_vector_env(task, NUM_ENVS, seed=seed)
    torch.manual_seed(seed)
    # the paper's b_g = 2, as in the stored runs (measured before make_policy's GTrXL defaulted to b_g = 0)
    fields = {"gate_bias": 2.0} if agent == "gtrxl" else {}
    policy = make_policy(agent, envs.single_observation_space, envs.single_action_space, **fields)
    # segments of 16: the PPOSettings default when the stored runs were made (64 since)
    history = train_ppo(policy, envs, PPOSettings(total_steps=total_steps, segment_length=16), seed=seed)
    envs.close()
    return {"task": task, "agent": agent, "seed": seed, "parameters": policy.num_parameters, **history.to_dict()}


def write_json_atomically(path: Path, payload: dict):
    from hf_txvariants.txv_files import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(payload, indent=1).encode())


def steps_to_reach(run: dict, level: float) -> int | None:
    """The environment steps after which the 100-episode mean return first reached `level` (None: never)."""
    return next((s for s, r in zip(run["steps"], run["mean_returns"]) if r is not None and r >= level), None)


def summary_table(runs: list[dict], tasks, agents, level: float = 0.9) -> str:
    lines = [
        f"| task | agent | parameters | MMER mean ± std | MMER per seed | final mean return "
        f"| steps to {level} per seed | steps/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for task in tasks:
        for agent in agents:
            rows = sorted((r for r in runs if r["task"] == task and r["agent"] == agent), key=lambda r: r["seed"])
            if not rows:
                continue
            mmer = np.array([r["mmer"] for r in rows])
            final = np.array([r["final_mean_return"] for r in rows])
            speed = np.mean([r["steps_per_second"] for r in rows])
            reached = " / ".join(
                "never" if (n := steps_to_reach(r, level)) is None else f"{n / 1000:.0f}k" for r in rows
            )
            lines.append(
                f"| {task} | {agent} | {rows[0]['parameters']:,} | {mmer.mean():.3f} ± {mmer.std():.3f} | "
                f"{' / '.join(f'{m:.2f}' for m in mmer)} | {final.mean():.3f} | {reached} | {speed:,.0f} |"
            )
    return "\n".join(lines)


def plot_curves(runs: list[dict], tasks, agents, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    for axis, task in zip(axes[0], tasks):
        for agent in agents:
            rows = [r for r in runs if r["task"] == task and r["agent"] == agent]
            if not rows:
                continue
            steps = np.array(rows[0]["steps"])
            curves = np.array([[np.nan if v is None else v for v in r["mean_returns"]] for r in rows], dtype=float)
            scored = np.isfinite(curves).all(axis=0)  # updates where every seed's 100-episode window is full
            steps, curves = steps[scored], curves[:, scored]
            color = f"C{list(agents).index(agent)}"  # one colour per agent in every panel
            axis.plot(steps, curves.mean(axis=0), label=f"{agent} ({len(rows)} seeds)", color=color)
            axis.fill_between(steps, curves.min(axis=0), curves.max(axis=0), alpha=0.15, color=color)
        axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        axis.set_title(task)
        axis.set_xlabel("environment steps")
        axis.set_ylim(-1.05, 1.05)
    axes[0][0].set_ylabel("mean return, last 100 episodes")
    for axis in axes[0]:  # each panel names its own agents and seed counts
        axis.legend(loc="lower right", fontsize=7)
    figure.tight_layout()
    from hf_txvariants.txv_files import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    atomic_write_bytes(path, image.getvalue())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, short budgets (a few minutes)")
    parser.add_argument("--tasks", nargs="+", help=f"default: {', '.join(TASKS)}")
    parser.add_argument("--agents", nargs="+", default=AGENTS, choices=AGENTS)
    parser.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 2 3 4 (0 with --quick)")
    parser.add_argument("--steps", type=int, help="environment steps for every task (default: per task, see TASKS)")
    parser.add_argument("--workers", type=int, default=2, help="runs going at once, one thread each")
    parser.add_argument("--output", type=Path, default=HERE / "memory_rl_runs.json")
    parser.add_argument("--plot", type=Path, default=HERE / "memory_rl_curves.png")
    parser.add_argument(
        "--summarise",
        type=Path,
        metavar="RUNS_JSON",
        help="run nothing: print the table and draw the curves of a finished benchmark's --output",
    )
    args = parser.parse_args(argv)
    if args.summarise:
        runs = json.loads(args.summarise.read_text())["runs"]
        tasks = list(dict.fromkeys(r["task"] for r in runs))
        agents = [a for a in AGENTS if any(r["agent"] == a for r in runs)]
        plot_curves(runs, tasks, agents, args.plot)
        print(summary_table(runs, tasks, agents))
        return
    budgets = QUICK_TASKS if args.quick else TASKS
    tasks = args.tasks or list(budgets)
    unknown = [t for t in tasks if t not in TASKS and args.steps is None]
    if unknown:
        parser.error(f"no default budget for {unknown}: pass --steps")
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2, 3, 4])
    jobs = [
        (task, agent, seed, args.steps or budgets[task]) for task in tasks for agent in args.agents for seed in seeds
    ]
    # the slowest (transformer agents, longest budgets) first, so the workers finish together
    jobs.sort(key=lambda job: (job[1] in ("gtrxl", "trxl_i"), job[3]), reverse=True)
    print(f"{len(jobs)} runs on {args.workers} workers", flush=True)
    runs, started = [], time.perf_counter()
    meta = {
        "command": "python benchmarks/bench_memory_rl.py" + (" --quick" if args.quick else ""),
        "num_envs": NUM_ENVS,
        "seeds": seeds,
        "budgets": {t: args.steps or budgets[t] for t in tasks},
        "workers": args.workers,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    }
    from hf_txvariants.rl import DEFAULT_GTRXL_FIELDS, PPOSettings

    meta["ppo"] = asdict(PPOSettings(segment_length=16))
    meta["gtrxl"] = DEFAULT_GTRXL_FIELDS
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_one, *job) for job in jobs]
        for future in as_completed(futures):
            run = future.result()
            runs.append(run)
            print(
                f"[{time.perf_counter() - started:6.0f}s] {run['task']} {run['agent']} seed {run['seed']}: MMER "
                f"{run['mmer']:.3f}, {run['steps_per_second']:.0f} steps/s",
                flush=True,
            )
            meta["seconds"] = round(time.perf_counter() - started)
            write_json_atomically(args.output, {"meta": meta, "runs": runs})
    plot_curves(runs, tasks, args.agents, args.plot)
    print(f"\nwhole benchmark: {time.perf_counter() - started:.0f} s; curves in {args.plot}, runs in {args.output}\n")
    print(summary_table(runs, tasks, args.agents))


if __name__ == "__main__":
    main()
