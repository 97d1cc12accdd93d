"""GTrXL's residual forms and gate bias on the RL memory task of examples/rl_gtrxl.py (Parisotto et al. 2020,
section 3.2 and the b_g ablation), plus GTrXL composed with adaptive span against its parents (GTrXL, and the
memory-less baseline). Every run: PPO from scratch, then the greedy success rate over held-out episodes.

    python benchmarks/bench_gtrxl_gates.py --seeds 0 1 2

Small scale (2 layers, hidden 16, a cue 5 steps before the decision, segments of 4, mem_len 8): it ranks the forms
on one task; it is not the paper's DMLab benchmark."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rl_gtrxl.py"


def load_example():
    spec = importlib.util.spec_from_file_location("rl_gtrxl", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_gtrxl"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--gates", nargs="+", default=["trxl", "trxl_i", "input", "output", "highway", "sigmoid_tanh", "gtrxl"]
    )
    parser.add_argument("--gate-biases", nargs="+", type=float, default=[0.0, 2.0])
    parser.add_argument(
        "--composed", nargs="+", default=["gtrxl_span", "baseline"], help="variants run at the default gate bias only"
    )
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    example = load_example()
    base = dict(
        corridor_length=5,
        segment_length=4,
        mem_len=8,
        num_envs=16,
        iterations=args.iterations,
        hidden_size=16,
        eval_episodes=128,
    )
    runs = [(gate, bias) for gate in args.gates for bias in args.gate_biases] + [(v, 2.0) for v in args.composed]
    table = []
    for variant, bias in runs:
        settings = example.Settings(**base, gate_bias=bias)
        results = [example.train(variant, seed, settings) for seed in args.seeds]
        row = {
            "variant": variant,
            "gate_bias": bias,
            "success": [r["success"] for r in results],
            "parameters": results[0]["parameters"],
            "seconds": sum(r["seconds"] for r in results),
        }
        print(json.dumps(row), flush=True)
        table.append(row)
    print(
        f"\nRememberCue (corridor 5, segments 4, mem_len 8, {args.iterations} PPO iterations x 16 envs), greedy "
        f"success over 128 episodes, seeds {args.seeds}:"
    )
    print("| residual form | b_g | parameters | success per seed | mean |")
    print("|---|---|---|---|---|")
    for row in table:
        rates = " / ".join(f"{s:.2f}" for s in row["success"])
        print(
            f"| {row['variant']} | {row['gate_bias']:g} | {row['parameters']} | {rates} | "
            f"{np.mean(row['success']):.2f} |"
        )


if __name__ == "__main__":
    main()
