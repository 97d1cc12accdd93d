"""Where a Transformer-XL training step's CPU time goes (config `small` of bench_transfo_xl, batch 8 x 128, memory
carried, one thread): torch.profiler's self CPU time by operator, the share of the matrix products (mm, bmm, addmm,
baddbmm, matmul kernels and the fused attention), for the eager model and the torch.compile'd one.

    python benchmarks/profile_transfo_xl_step.py [--steps 5] [--threads 1] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfo_xl import CONFIGS  # noqa: E402

PRODUCTS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_scaled_dot_product", "mkldnn", "mkl_")


def profile(compiled: bool, steps: int) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from transformers import AutoModelForCausalLM

    import hf_txvariants

    config, batch, segment = CONFIGS["small"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_txvariants.TransfoXLConfig(**config)).train()
    call = torch.compile(model) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config["vocab_size"], (batch, segment))
    memory = {}

    def step():
        output = call(ids, labels=ids, return_logits=False, **memory)
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        memory["cache"] = output.cache

    for _ in range(3):  # warm-up (and compilation)
        step()
    started = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step()
    step_ms = 1e3 * (time.perf_counter() - started) / steps
    events = [event for event in profiler.key_averages() if event.self_cpu_time_total > 0]
    total = sum(event.self_cpu_time_total for event in events)
    products = sum(event.self_cpu_time_total for event in events if event.key.startswith(PRODUCTS))
    lines = [
        f"{'compiled' if compiled else 'eager'}: {step_ms:.1f} ms a step (profiled), matrix products "
        f"{100 * products / total:.0f}% of the self CPU time; the largest operators:"
    ]
    for event in sorted(events, key=lambda event: -event.self_cpu_time_total)[:8]:
        share = 100 * event.self_cpu_time_total / total
        lines.append(f"  {event.key[:60]:60s} {share:5.1f}%  {event.self_cpu_time_total / 1e3 / steps:8.1f} ms/step")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-compile", action="store_true", help="profile the eager model only")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    for compiled in (False,) if args.no_compile else (False, True):
        print("\n".join(profile(compiled, args.steps)), flush=True)


if __name__ == "__main__":
    main()
