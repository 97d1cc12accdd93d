"""Why the GRU-gated GTrXL stayed at chance on POPGym RepeatPreviousMedium where TrXL-I learned (issue 30): a small
sweep over the gate's initialisation (its W/U matrices: N(0, 0.02), the XL family's `initializer_range`, or
Xavier-normal, as RLlib's GRUGate) and its bias b_g, at the settings of the issue's run
(`examples/rl_memory.py --tasks RepeatPreviousMedium --total-steps 400000 --seeds 3`: PPO defaults, 16 envs, 2 layers
of width 64, mem_len 64, segments of 16 steps).

    python benchmarks/bench_gtrxl_rl_gate_sweep.py --arms gtrxl:normal:2 gtrxl:xavier:2 --seeds 3

An arm is AGENT:GATE_INIT:B_G (GATE_INIT "normal" re-draws every gate matrix from N(0, 0.02), "xavier" from
Xavier-normal, "default" leaves the model's own init). Each finished run is stored at once in `--output` (finished
runs are skipped on restart) and the table printed with `--report`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def init_gate_matrices(policy, how: str):
    import torch

    from hf_txvariants.txv_gates import GatingLayer

    if how == "default":
        return
    for module in policy.modules():
        if isinstance(module, GatingLayer):
            for name in module.matrices:
                weight = getattr(module, name).weight
                with torch.no_grad():
                    if how == "normal":
                        weight.normal_(0.0, 0.02)
                    elif how == "xavier":
                        torch.nn.init.xavier_normal_(weight)
                    else:
                        raise ValueError(f"unknown gate init {how!r}")


def run_arm(task: str, arm: str, seed: int, total_steps: int, learning_rate: float) -> dict:
    import torch

    torch.set_num_threads(1)
    from hf_txvariants.rl import PPOSettings, make_policy, make_vector_env, train_ppo

    agent, gate_init, gate_bias = arm.split(":")
    envs = make_vector_env(task, 16, seed=seed)
    torch.manual_seed(seed)
    fields = {} if agent != "gtrxl" else {"gate_bias": float(gate_bias)}
    policy = make_policy(agent, envs.single_observation_space, envs.single_action_space, **fields)
    init_gate_matrices(policy, gate_init)

    def log(history):  # progress, every 20 updates (40,960 steps)
        if len(history.steps) % 20 == 0:
            score = history.mean_returns[-1]
            print(
                f"  {arm} seed {seed}: {history.steps[-1]} steps, mean return "
                f"{'-' if score is None else f'{score:.3f}'}, {history.seconds:.0f} s",
                flush=True,
            )

    # segments of 16: the PPOSettings default when the stored runs were made (64 since)
    settings = PPOSettings(total_steps=total_steps, learning_rate=learning_rate, segment_length=16)
    history = train_ppo(policy, envs, settings, seed=seed, log=log)
    envs.close()
    return {"task": task, "arm": arm, "seed": seed, "parameters": policy.num_parameters, **history.to_dict()}


def report(runs: list[dict]) -> str:
    lines = [
        "| arm (agent:gate init:b_g) | lr | steps | seeds | MMER per seed | final mean return | steps/s |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["arm"], r["settings"]["learning_rate"], r["settings"]["total_steps"]) for r in runs},
        key=lambda k: [r["arm"] for r in runs].index(k[0]),
    )
    for arm, lr, steps in keys:
        rows = sorted(
            (
                r
                for r in runs
                if (r["arm"], r["settings"]["learning_rate"], r["settings"]["total_steps"]) == (arm, lr, steps)
            ),
            key=lambda r: r["seed"],
        )
        seeds = ", ".join(str(r["seed"]) for r in rows)
        mmer = " / ".join(f"{r['mmer']:.3f}" for r in rows)
        final = " / ".join(f"{r['final_mean_return']:.3f}" for r in rows)
        speed = np.mean([r["steps_per_second"] for r in rows])
        lines.append(f"| {arm} | {lr:g} | {steps:,} | {seeds} | {mmer} | {final} | {speed:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="RepeatPreviousMedium")
    parser.add_argument("--arms", nargs="+", default=["gtrxl:normal:2", "gtrxl:xavier:2", "gtrxl:normal:0"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[3])
    parser.add_argument("--total-steps", type=int, default=400_000)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--output", type=Path, default=HERE / "memory_rl_gate_sweep.json")
    parser.add_argument("--report", action="store_true", help="print the table of the stored runs and stop")
    args = parser.parse_args(argv)
    runs = json.loads(args.output.read_text())["runs"] if args.output.exists() else []
    if args.report:
        print(report(runs))
        return
    from hf_txvariants.txv_pretrained import atomic_write_bytes

    for arm in args.arms:
        for seed in args.seeds:
            key = (args.task, arm, seed, args.total_steps, args.learning_rate)
            if any(
                (r["task"], r["arm"], r["seed"], r["settings"]["total_steps"], r["settings"]["learning_rate"]) == key
                for r in runs
            ):
                continue
            started = time.perf_counter()
            run = run_arm(args.task, arm, seed, args.total_steps, args.learning_rate)
            runs.append(run)
            atomic_write_bytes(args.output, json.dumps({"runs": runs}, indent=1).encode())
            print(f"{arm} seed {seed}: MMER {run['mmer']:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    print(report(runs))


if __name__ == "__main__":
    main()
