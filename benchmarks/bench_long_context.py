"""Long-context models against a dense peer: every attention pattern of the Sparse Transformer and our own plain
causal models, against transformers' GPT-2 of the same size on fused SDPA (`is_causal`), whole model, forward and
training step, time and peak memory, in one process and one run.

    python benchmarks/bench_long_context.py                   # CPU: L = 4k, 8k, 16k; 2 layers, d 128, 4 heads, fp32
    python benchmarks/bench_long_context.py --device cuda     # GPU: L = 4k, 16k, 64k; 4 layers, d 512, 8 heads, bf16
    python benchmarks/bench_long_context.py --lengths 4096 --only gpt2 strided   # a subset

Batch 1, vocabulary 256, intermediate 4d, dropout 0 everywhere (GPT-2's default dropout would send its SDPA call to
the unfused math kernel). Sparse patterns use stride l = 128 (window / block 128 for sliding_window / local1d) and
c = 8 summary positions; `pattern_implementation="auto"` (what a user gets by setting `attention_pattern` alone).
"forward" is a no-grad forward; "train" is forward + loss + backward (no optimizer step). Time: best of `--repeats`
after one warm-up call (the warm-up also builds the cached pattern masks / BlockMasks; its time is printed as
"first call"). Peak memory: CPU, growth of the process's peak resident set (VmHWM, reset through
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

from hf_txvariants import SparseTransformerConfig, SparseTransformerForCausalLM, VanillaConfig, VanillaForCausalLM

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
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(function, device, repeats):
    """(first-call seconds, best seconds, peak MiB): a warm-up call, then `repeats` timed calls, the first of which
    also measures the peak memory."""
    first = timed(function, device)
    with PeakMemory(device) as memory:
        best = timed(function, device)
    for _ in range(repeats - 1):
        best = min(best, timed(function, device))
    return first, best, memory.mib


def build_model(name, args, length):
    size = dict(vocab_size=256, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads)
    if name == "gpt2":
        config = GPT2Config(
            vocab_size=256, n_positions=length, n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
            n_inner=4 * args.hidden, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
        return GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    if name == "vanilla causal":
        config = VanillaConfig(
            **size, intermediate_size=4 * args.hidden, max_position_embeddings=length, dropout=0.0,
        )
        return VanillaForCausalLM._from_config(config, attn_implementation="sdpa")
    config = SparseTransformerConfig(
        **size, intermediate_size=4 * args.hidden, max_position_embeddings=length, stride=128, summary_size=8,
        gradient_checkpointing_min_layers=0, **SPARSE[name],
    )
    return SparseTransformerForCausalLM._from_config(config, attn_implementation="sdpa")


def attention_core_rows(args, device, dtype):
    """SDPA with `is_causal=True` vs the same attention with an explicit additive mask, forward and training."""
    from hf_txvariants.txv_attention import CausalMask

    head_dim = args.hidden // args.heads
    for length in [length for length in args.lengths if length <= args.core_max_length]:
        query, key, value = (
            torch.randn(1, args.heads, length, head_dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
        )
        mask = CausalMask().dense(length, dtype, device)
        cases = {
            "is_causal": lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True),
            "explicit mask": lambda: torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask),
        }
        results = {}
        for name, function in cases.items():
            with torch.no_grad():
                _, forward, _ = measure(function, device, args.repeats)
            _, train, _ = measure(lambda: function().sum().backward(), device, args.repeats)
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
    parser.add_argument("--only", nargs="+", help="model names (gpt2 is always run: it is the peer)")
    parser.add_argument("--core-max-length", type=int, default=8192, help="longest L of the attention-core rows "
                        "(the explicit mask's backward holds heads x L^2 floats: 4 GiB at 16k, 4 heads)")
    args = parser.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    args.lengths = args.lengths or ([4096, 16384, 65536] if on_gpu else [4096, 8192, 16384])
    args.layers = args.layers or (4 if on_gpu else 2)
    args.hidden = args.hidden or (512 if on_gpu else 128)
    args.heads = args.heads or (8 if on_gpu else 4)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    names = ["gpt2", "vanilla causal", *SPARSE]
    if args.only:
        names = ["gpt2"] + [name for name in names[1:] if any(part in name for part in args.only)]
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, device {device}, dtype {dtype}, threads {torch.get_num_threads()}, "
          f"{args.layers} layers, d {args.hidden}, {args.heads} heads, batch 1")
    print("\nAttention core alone (ms): | L | is_causal forward | explicit mask forward | is_causal train | explicit mask train |")
    print("|---|---|---|---|---|")
    attention_core_rows(args, device, dtype)
    print("\n| L | model | pass | first call ms | time ms | ratio vs GPT-2 | peak MiB | ratio vs GPT-2 |")
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        ids = torch.randint(0, 256, (1, length), device=device)
        peer = {}
        for name in names:
            model = build_model(name, args, length).to(device=device, dtype=dtype)
            for mode in ("forward", "train"):
                model.train(mode == "train")
                if mode == "forward":
                    def step():
                        with torch.no_grad():
                            model(ids, use_cache=False)
                else:
                    def step():
                        model(ids, labels=ids, use_cache=False).loss.backward()
                        model.zero_grad(set_to_none=True)
                try:
                    first, best, mib = measure(step, device, args.repeats)
                except torch.OutOfMemoryError:
                    print(f"| {length} | {name} | {mode} | out of memory | | | | |", flush=True)
                    continue
                if name == "gpt2":
                    peer[mode] = (best, mib)
                time_ratio = best / peer[mode][0]
                memory_ratio = mib / max(peer[mode][1], 1e-9)
                print(
                    f"| {length} | {name} | {mode} | {first * 1e3:.0f} | {best * 1e3:.0f} | {time_ratio:.2f} | "
                    f"{mib:.0f} | {memory_ratio:.2f} |",
                    flush=True,
                )
            del model
            gc.collect()


if __name__ == "__main__":
    main()
