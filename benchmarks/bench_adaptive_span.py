"""Adaptive attention span: inference time and memory with the learned (short) spans against the same model at full
span, measured in one run.

    python examples/plot_adaptive_span.py --steps 300 --save-dir /tmp/span-lm     # learn the spans (or skip:
    python benchmarks/bench_adaptive_span.py --model-dir /tmp/span-lm               #  without --model-dir the
                                                                                    #  benchmark trains 150 steps)

The trained weights are evaluated with a maximum span S = `--attn-span` (default 1024, memory S - 1): "learned" keeps
every head's learned span in tokens, "full" sets every span to S (the same weights, nothing trimmed). Each mode runs in
its own process (same thread count) over the same random segments: the memory is first filled, then `--segments`
segments are timed. Reported per mode: seconds per segment, the bytes of the memory cache, the keys each layer attends
to, and the growth of the peak resident memory during the timed loop.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from hf_txvariants import AdaptiveSpanConfig, AdaptiveSpanForCausalLM


def worker(args):
    torch.set_num_threads(args.threads)
    trained = AdaptiveSpanForCausalLM.from_pretrained(args.model_dir)
    spans = trained.get_spans()  # [layers, heads], tokens
    config = AdaptiveSpanConfig.from_dict(
        {**trained.config.to_dict(), "attn_span": args.attn_span, "mem_len": args.attn_span - 1}
    )
    model = AdaptiveSpanForCausalLM(config).eval()
    model.load_state_dict(trained.state_dict())
    with torch.no_grad():
        for layer, layer_spans in zip(model.transformer.layers, spans):
            span = layer.attn.adaptive_span
            span.current_val.copy_(
                layer_spans / args.attn_span if args.mode == "learned" else torch.ones_like(layer_spans)
            )
    generator = torch.Generator().manual_seed(0)
    fill = math.ceil(args.attn_span / args.seg_len)
    segments = [
        torch.randint(0, config.vocab_size, (args.batch_size, args.seg_len), generator=generator)
        for _ in range(fill + args.segments)
    ]
    memory = None
    with torch.no_grad():
        for ids in segments[:fill]:
            memory = model(ids, cache=memory).cache
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        for ids in segments[fill:]:
            output = model.transformer(ids, cache=memory)
            logits = model.lm_head(output.last_hidden_state)
            memory = output.cache
        seconds = (time.perf_counter() - start) / args.segments
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cache_bytes = sum(m.numel() * m.element_size() for m in memory.memories)
    print(
        json.dumps(
            {
                "mode": args.mode,
                "seconds_per_segment": seconds,
                "memory_cache_bytes": cache_bytes,
                "memory_length": memory.memory_length,
                "attended_keys_per_layer": list(output.attended_keys),
                "peak_rss_growth_kib": rss_after - rss_before,
                "spans_mean_tokens": float(model.get_spans().mean()),
                "logits_finite": bool(torch.isfinite(logits).all()),
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--attn-span", type=int, default=1024)
    parser.add_argument("--seg-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--mode", choices=["learned", "full"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        return worker(args)
    if args.model_dir is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from plot_adaptive_span import train_adaptive_span

        args.model_dir = "/tmp/bench-adaptive-span-model"
        model, _, _ = train_adaptive_span(steps=args.train_steps)
        model.save_pretrained(args.model_dir)
    results = {}
    for mode in ("learned", "full"):
        command = [sys.executable, __file__, "--mode", mode] + [
            f"--{name.replace('_', '-')}={value}"
            for name, value in vars(args).items()
            if name not in ("mode",) and value is not None
        ]
        output = subprocess.run(command, capture_output=True, text=True, env=os.environ, check=True).stdout
        results[mode] = json.loads(output.strip().splitlines()[-1])
    learned, full = results["learned"], results["full"]
    results["full_over_learned_time"] = full["seconds_per_segment"] / learned["seconds_per_segment"]
    results["full_over_learned_cache_bytes"] = full["memory_cache_bytes"] / learned["memory_cache_bytes"]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
