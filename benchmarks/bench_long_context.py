"""Long-context models against a dense peer: every attention pattern of the Sparse Transformer and our own plain
causal models, against transformers' GPT-2 of the same size on fused SDPA (`is_causal`), whole model, forward and
training step, time and peak memory, in one process and one run.

    python benchmarks/bench_long_context.py                   # CPU: L = 4k, 8k, 16k; 2 layers, d 128, 4 heads, fp32
    python benchmarks/bench_long_context.py --device cuda     # GPU: L = 4k, 16k, 64k; 4 layers, d 512, 8 heads, bf16
    python benchmarks/bench_long_context.py --lengths 4096 --only gpt2 strided   # a subset

Batch 1, vocabulary 256, intermediate 4d, dropout 0 everywhere (GPT-2's default dropout would send its SDPA call to
the unfused math kernel). Sparse patterns use stride l = 128 (window / block 128 for sliding_window / local1d) and
c = 8 summary positions; the Image Transformer runs on a grey image 128 intensities wide (L a multiple of 1024),
local 1D with blocks of 128, local 2D with query blocks 8 x 16 and memory flanges 8 x 16 (its defaults);
`pattern_implementation="auto"` (what a user gets by setting `attention_pattern` alone).
"forward" is a no-grad forward; "train" is forward + loss + backward (no optimizer step). Time: best of `--repeats`
after one warm-up call (the warm-up also builds the cached pattern masks / BlockMasks; its time is printed as
"first call"), as wall time and as the CPU time of the process (all threads; on a CPU shared with other jobs the
CPU time depends less on the load). Peak memory: CPU, growth of the process's peak resident set (VmHWM, reset through
/proc/self/clear_refs) during one call, glibc's mmap threshold fixed so freed tensors go back to the OS; CUDA,
`max_memory_allocated` above the memory held before the call. Ratios are against GPT-2 at the same length and pass.
Also printed: the attention core alone (SDPA `is_causal=True` vs the same attention with an explicit mask), which is
the measurement behind the fused-path choice in `txv_attention.attention_forward`.
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
from transformers import GPT2Config, GPT2LMHeadModel

from hf_txvariants import (
    ImageTransformerConfig,
    ImageTransformerForCausalLM,
    SparseTransformerConfig,
    SparseTransformerForCausalLM,
    VanillaConfig,
    VanillaForCausalLM,
)

SPARSE = {
    "sparse causal": dict(attention_pattern="causal"),
    "strided interleaved": dict(attention_pattern="strided", pattern_mode="interleaved"),
    "strided merged": dict(attention_pattern="strided", pattern_mode="merged"),
    "strided per_head": dict(attention_pattern="strided", pattern_mode="per_head"),
    "fixed interleaved": dict(attention_pattern="fixed", pattern_mode="interleaved"),
    "fixed merged": dict(attention_pattern="fixed", pattern_mode="merged"),
    "fixed per_head": dict(attention_pattern="fixed", pattern_mode="per_head"),
    "sliding_window": dict(attention_pattern="sliding_window"),
    "local1d": dict(attention_pattern="local1d"),
}
# The Image Transformer on a grey image IMAGE_WIDTH wide and L / IMAGE_WIDTH high (L a multiple of 8 * IMAGE_WIDTH).
IMAGE_WIDTH = 128
IMAGE = {
    "image local_1d": dict(attention_type="local_1d", block_length=128),
    "image local_2d": dict(attention_type="local_2d", query_shape=(8, 16), memory_flange=(8, 16)),
}


def _status_kib(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


class PeakMemory:
    """Peak extra memory (MiB) of one call: CUDA allocator statistics, or the CPU process's peak resident set."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            self.base = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = _status_kib("VmHWM") * 1024
        self.mib = max(0, peak - self.base) / 2**20


def timed(function, device):
    """(wall seconds, CPU seconds of this process: all its threads; on a shared CPU the less load-dependent one)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu_start


def measure(function, device, repeats):
    """(first-call wall seconds, best (wall, CPU) seconds, peak MiB): a warm-up call, then `repeats` timed calls, the
    first of which also measures the peak memory."""
    first, _ = timed(function, device)
    with PeakMemory(device) as memory:
        wall, cpu = timed(function, device)
    for _ in range(repeats - 1):
        again = timed(function, device)
        wall, cpu = min(wall, again[0]), min(cpu, again[1])
    return first, (wall, cpu), memory.mib


def build_model(name, args, length):
    size = dict(vocab_size=256, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads)
    if name == "gpt2":
        config = GPT2Config(
            vocab_size=256,
            n_positions=length,
            n_embd=args.hidden,
            n_layer=args.layers,
            n_head=args.heads,
            n_inner=4 * args.hidden,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    if name == "vanilla causal":
        config = VanillaConfig(
            **size,
            intermediate_size=4 * args.hidden,
            max_position_embeddings=length,
            dropout=0.0,
        )
        return VanillaForCausalLM._from_config(config, attn_implementation="sdpa")
    if name in IMAGE:
        config = ImageTransformerConfig(
            **{**size, "vocab_size": 257},
            intermediate_size=4 * args.hidden,
            image_size=(length // IMAGE_WIDTH, IMAGE_WIDTH),
            num_channels=1,
            dropout=0.0,
            attention_dropout=0.0,
            **IMAGE[name],
        )
        return ImageTransformerForCausalLM._from_config(config, attn_implementation="sdpa")
    config = SparseTransformerConfig(
        **size,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=length,
        stride=128,
        summary_size=8,
        gradient_checkpointing_min_layers=0,
        **SPARSE[name],
    )
    return SparseTransformerForCausalLM._from_config(config, attn_implementation="sdpa")


def attention_core_rows(args, device, dtype):
    """SDPA with `is_causal=True` vs the same attention with an explicit additive mask, forward and training."""
    from hf_txvariants.txv_attention import CausalMask

    head_dim = args.hidden // args.heads
    for length in [length for length in args.lengths if length <= args.core_max_length]:
        query, key, value = (
            torch.randn(1, args.heads, length, head_dim, device=device, dtype=dtype, requires_grad=True)
            for _ in range(3)
        )
        mask = CausalMask().dense(length, dtype, device)
        cases = {
            "is_causal": lambda q=query, k=key, v=value: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True
            ),
            "explicit mask": lambda q=query, k=key, v=value, m=mask: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=m
            ),
        }
        results = {}
        for name, function in cases.items():
            with torch.no_grad():
                _, (forward, _), _ = measure(function, device, args.repeats)
            _, (train, _), _ = measure(lambda: function().sum().backward(), device, args.repeats)
            results[name] = (forward, train)
        (causal_forward, causal_train), (mask_forward, mask_train) = results["is_causal"], results["explicit mask"]
        print(
            f"| {length} | {causal_forward * 1e3:.1f} | {mask_forward * 1e3:.1f} | {causal_train * 1e3:.1f} | "
            f"{mask_train * 1e3:.1f} |",
            flush=True,
        )
        del query, key, value, mask


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: torch's; 1 on a CPU shared with other "
        "jobs, where waiting threads inflate the CPU time of many small calls)",
    )
    parser.add_argument("--only", nargs="+", help="model names (gpt2 is always run: it is the peer)")
    parser.add_argument(
        "--core-max-length",
        type=int,
        default=8192,
        help="longest L of the attention-core rows "
        "(the explicit mask's backward holds heads x L^2 floats: 4 GiB at 16k, 4 heads)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    args.lengths = args.lengths or ([4096, 16384, 65536] if on_gpu else [4096, 8192, 16384])
    args.layers = args.layers or (4 if on_gpu else 2)
    args.hidden = args.hidden or (512 if on_gpu else 128)
    args.heads = args.heads or (8 if on_gpu else 4)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    names = ["gpt2", "vanilla causal", *SPARSE, *IMAGE]
    if args.only:
        names = ["gpt2"] + [name for name in names[1:] if any(part in name for part in args.only)]
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, device {device}, dtype {dtype}, threads {torch.get_num_threads()}, "
        f"{args.layers} layers, d {args.hidden}, {args.heads} heads, batch 1"
    )
    print(
        "\nAttention core alone (ms): | L | is_causal forward | explicit mask forward | is_causal train "
        "| explicit mask train |"
    )
    print("|---|---|---|---|---|")
    attention_core_rows(args, device, dtype)
    print("\n| L | model | pass | first call ms | wall ms | ratio | CPU ms | ratio | peak MiB | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        ids = torch.randint(0, 256, (1, length), device=device)
        peer = {}
        for name in names:
            model = build_model(name, args, length).to(device=device, dtype=dtype)
            for mode in ("forward", "train"):
                model.train(mode == "train")
                if mode == "forward":

                    def step(model=model, ids=ids):
                        with torch.no_grad():
                            model(ids, use_cache=False)
                else:

                    def step(model=model, ids=ids):
                        model(ids, labels=ids, use_cache=False).loss.backward()
                        model.zero_grad(set_to_none=True)

                try:
                    first, (wall, cpu), mib = measure(step, device, args.repeats)
                except torch.OutOfMemoryError:
                    print(f"| {length} | {name} | {mode} | out of memory | | | | | | |", flush=True)
                    continue
                if name == "gpt2":
                    peer[mode] = (wall, cpu, mib)
                peer_wall, peer_cpu, peer_mib = peer[mode]
                print(
                    f"| {length} | {name} | {mode} | {first * 1e3:.0f} | {wall * 1e3:.0f} | {wall / peer_wall:.2f} | "
                    f"{cpu * 1e3:.0f} | {cpu / peer_cpu:.2f} | {mib:.0f} | {mib / max(peer_mib, 1e-9):.2f} |",
                    flush=True,
                )
            del model
            gc.collect()


if __name__ == "__main__":
    main()
