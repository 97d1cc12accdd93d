"""Attention patterns (txv_patterns, blocked path) against dense causal SDPA: time and peak memory, CPU.

    python benchmarks/bench_patterns.py                 # forward at L = 1k, 4k, 16k; training step at 1k, 4k
    python benchmarks/bench_patterns.py --lengths 1024 --train-lengths 1024

Each number is a ratio against dense causal SDPA (torch's fused CPU kernel, `is_causal=True`) measured in the same
run on the same inputs: batch 1, 4 heads of 64. Peak memory is the growth of the process's peak resident set
(VmHWM, reset through /proc/self/clear_refs) during the call. The blocked path's gather index (like a FlexAttention
BlockMask) is built once per shape before timing; its build time is reported separately.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
    # A fixed mmap threshold makes glibc return every large tensor to the OS when freed, so that the peak resident
    # set measures each call's own peak (with the default dynamic threshold freed memory stays in the heap).
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch
from torch import nn

from hf_txvariants.txv_patterns import Fixed, Local1D, Local2D, SlidingWindow, Strided, StridedColumn, StridedLocal
from hf_txvariants.txv_patterns import gather_index, pattern_attention


def _rss_kib(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def measure(function, repeats):
    """(best seconds, peak extra MiB) of `function()`."""
    gc.collect()
    function()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    base = _rss_kib("VmRSS")
    function()
    peak = _rss_kib("VmHWM")
    return best, max(0, peak - base) / 1024


def patterns_for(length):
    stride = int(round(length**0.5))
    width = 64
    return {
        "strided (merged)": Strided(stride),  # block 16: a block's union of columns grows with its size
        "strided row (A1)": StridedLocal(stride),
        "strided column (A2)": StridedColumn(stride),
        "fixed (c=8)": Fixed(stride, 8),
        "local 1D (block 128)": Local1D(128),
        "local 2D (8x16, flange 8x16)": Local2D(width, (8, 16), (8, 16)) if length % width == 0 else None,
        "sliding window 256": SlidingWindow(256),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--train-lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--block-size", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    module = nn.Module()
    heads, dim = 4, 64
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| L | pattern | mode | keys/query block | time ms (ratio vs SDPA) | peak MiB (ratio vs SDPA) | index build ms |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        train_too = length in args.train_lengths
        for mode in ("forward", "train") if train_too else ("forward",):
            module.train(mode == "train")
            q, k, v = (torch.randn(1, heads, length, dim, requires_grad=mode == "train") for _ in range(3))
            repeats = 2 if length <= 1024 else 1

            def run(fn):
                if mode == "forward":
                    with torch.no_grad():
                        fn()
                else:
                    out = fn()
                    out.sum().backward()

            dense = lambda: nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
            dense_time, dense_mem = measure(lambda: run(dense), repeats)
            print(f"| {length} | dense causal SDPA | {mode} | {length} | {dense_time * 1e3:.1f} (1.00) | {dense_mem:.0f} (1.00) | - |")
            for name, pattern in patterns_for(length).items():
                if pattern is None:
                    continue
                started = time.perf_counter()
                block = 16 if name.startswith("strided (merged)") else args.block_size
                _, index, _ = gather_index(pattern, length, length, block, q.device)
                build = time.perf_counter() - started
                fn = lambda: pattern_attention(module, q, k, v, pattern, "blocked", block_size=block)[0]  # noqa: E731
                t, m = measure(lambda: run(fn), repeats)
                print(
                    f"| {length} | {name} | {mode} | {index.shape[1]} | {t * 1e3:.1f} ({t / dense_time:.2f}) | "
                    f"{m:.0f} ({m / max(dense_mem, 1e-9):.2f}) | {build * 1e3:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
