"""Image Transformer (Parmar et al. 2018) at small scale, two measurements, one run each:

* `--part sampling`: time to sample one 32x32x3 image (3,072 intensities) with the key/value cache (each new
  intensity attends to its local block only) and without (every step reruns the whole prefix). The cached run is
  timed whole. The uncached run of 3,072 steps is too long for a shared 2-core CPU, so its per-step time is measured
  at `--probes` prefix lengths and summed over every step by linear interpolation (an estimate, labelled as such);
  the same estimate is checked against a whole timed uncached run on an 8x8x3 image.
* `--part local`: local 1D vs local 2D attention, bits per dimension on held-out synthetic 16x16 grey images
  (`hf_txvariants.training.images.synthetic_shapes`), same model size, steps and data, the same number of keys per
  query block (128): 1D query blocks of 32 with a memory of 96, 2D query blocks of 4x8 with flanges of 4 rows and
  4 columns.

    python benchmarks/bench_image_transformer.py --part sampling
    python benchmarks/bench_image_transformer.py --part local --steps 300
"""

from __future__ import annotations

import argparse
import time

import numpy
import torch

from hf_txvariants import ImageTransformerConfig, ImageTransformerForCausalLM
from hf_txvariants.modeling_image_transformer import START_TOKEN, images_to_input_ids
from hf_txvariants.training.images import synthetic_shapes


def sampling_model(size: int) -> ImageTransformerForCausalLM:
    torch.manual_seed(0)
    config = ImageTransformerConfig(
        image_size=[size, size],
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        attention_type="local_1d",
        block_length=min(256, 3 * size * size),
    )
    return ImageTransformerForCausalLM(config).eval()


def time_generate(model, steps: int, use_cache: bool) -> float:
    start_token = torch.full((1, 1), START_TOKEN)
    torch.manual_seed(1)
    start = time.perf_counter()
    model.generate(
        start_token,
        max_new_tokens=steps,
        do_sample=True,
        top_k=0,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=use_cache,
    )
    return time.perf_counter() - start


@torch.no_grad()
def uncached_estimate(model, probes: int) -> float:
    """Sum over steps 1..N of the time of one uncached step (a forward over the prefix), interpolated between
    `probes` measured prefix lengths (each the best of 2)."""
    total_steps = model.config.num_positions
    lengths = torch.linspace(1, total_steps, probes).round().long().unique().tolist()
    times = []
    for length in lengths:
        ids = torch.randint(0, 256, (1, length))
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            model(ids, use_cache=False)
            best = min(best, time.perf_counter() - start)
        times.append(best)
    all_lengths = torch.arange(1, total_steps + 1, dtype=torch.float64)
    per_step = torch.from_numpy(numpy.interp(all_lengths.numpy(), lengths, times))
    return float(per_step.sum())


def part_sampling(args):
    print("| image | with cache (s, timed) | without cache (s) | ratio |")
    print("|---|---|---|---|")
    small = sampling_model(8)
    cached, full = (
        time_generate(small, small.config.num_positions, True),
        time_generate(small, small.config.num_positions, False),
    )
    estimate = uncached_estimate(small, args.probes)
    print(
        f"| 8x8x3 (192 steps) | {cached:.2f} | {full:.2f} timed ({estimate:.2f} estimated) | {full / cached:.1f}x |",
        flush=True,
    )
    large = sampling_model(32)
    cached = time_generate(large, large.config.num_positions, True)
    estimate = uncached_estimate(large, args.probes)
    print(f"| 32x32x3 (3,072 steps) | {cached:.1f} | {estimate:.0f} estimated | {estimate / cached:.0f}x |", flush=True)


def part_local(args):
    images = synthetic_shapes(3000, 16, 1, seed=0)
    test = synthetic_shapes(128, 16, 1, seed=1)
    common = dict(
        image_size=[16, 16],
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    variants = {
        "local 1D (blocks of 32, memory 96)": dict(attention_type="local_1d", block_length=32, memory_length=96),
        "local 2D (blocks 4x8, flanges 4 rows / 4 columns)": dict(
            attention_type="local_2d", query_shape=[4, 8], memory_flange=[4, 4]
        ),
    }
    print(f"{args.steps} steps x batch {args.batch_size}, 16x16 grey synthetic images, d 64, 2 layers")
    print("| attention | held-out bits/dim | train time (s) |")
    print("|---|---|---|")
    for name, overrides in variants.items():
        torch.manual_seed(args.seed)
        config = ImageTransformerConfig(**common, **overrides)
        model = ImageTransformerForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        generator = torch.Generator().manual_seed(args.seed)
        start = time.perf_counter()
        for _ in range(args.steps):
            ids = images_to_input_ids(
                images[torch.randint(0, len(images), (args.batch_size,), generator=generator)], config
            )
            loss = model(ids, labels=ids, use_cache=False).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            ids = images_to_input_ids(test, config)
            bits = model(ids, labels=ids, use_cache=False).loss.item()
        print(f"| {name} | {bits:.3f} | {seconds:.0f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["sampling", "local"], required=True)
    parser.add_argument("--probes", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    part_sampling(args) if args.part == "sampling" else part_local(args)


if __name__ == "__main__":
    main()
