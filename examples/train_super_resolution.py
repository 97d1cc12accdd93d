"""Train a small Image Transformer for super-resolution (Parmar et al. 2018, section 3.4) on synthetic images made
here (offline, deterministic): 8x8 grey images are encoded, 16x16 ones decoded with local 1D attention and
cross-attention to the encoder (each decoder position attends to the low-resolution pixels within `--radius` of the
one covering it; -1: all of them). Prints the training loss and the held-out bits per dimension of the conditional
model(s) next to the same decoder trained without the low-resolution image (the conditioning's worth), same budget,
and saves upscaled samples as PNG.

    python examples/train_super_resolution.py --steps 200 --output-dir runs/super_resolution

The images (`hf_txvariants.training.images.synthetic_shapes`): a soft gradient with a filled rectangle and a
filled disc of random places and intensities; the low-resolution input averages 2x2 pixel blocks.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from hf_txvariants import ImageTransformerConfig, ImageTransformerForCausalLM, ImageTransformerForSuperResolution
from hf_txvariants.modeling_image_transformer import images_to_conditioning_ids, images_to_input_ids
from hf_txvariants.training.images import downsample, save_png, synthetic_shapes


def build_config(args, conditional: bool, radius: int = 0) -> ImageTransformerConfig:
    return ImageTransformerConfig(
        image_size=[args.size, args.size],
        num_channels=1,
        conditioning_image_size=[args.size // 2, args.size // 2] if conditional else None,
        num_encoder_layers=2,
        conditioning_attention_radius=None if radius < 0 else radius,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        intermediate_size=2 * args.hidden_size,
        attention_type="local_1d",
        block_length=32,
    )


def batch_inputs(images, config, conditional):
    inputs = {"input_ids": images_to_input_ids(images, config)}
    if conditional:
        inputs["conditioning_ids"] = images_to_conditioning_ids(downsample(images, 2), config)
    return inputs


def train(args, conditional: bool, train_images, test_images, radius: int = 0):
    torch.manual_seed(args.seed)
    config = build_config(args, conditional, radius)
    model_class = ImageTransformerForSuperResolution if conditional else ImageTransformerForCausalLM
    model = model_class(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    losses = []
    for step in range(args.steps):
        index = torch.randint(0, len(train_images), (args.batch_size,), generator=generator)
        inputs = batch_inputs(train_images[index], config, conditional)
        loss = model(**inputs, labels=inputs["input_ids"]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            name = f"conditional (radius {radius})" if conditional else "unconditional"
            print(f"{name:13s} step {step:4d}  train loss {loss.item():.3f} bits/dim", flush=True)
    model.eval()
    with torch.no_grad():
        inputs = batch_inputs(test_images, config, conditional)
        held_out = model(**inputs, labels=inputs["input_ids"]).loss.item()
        if conditional:  # the same images given another image's low-resolution input: what the input is worth
            inputs["conditioning_ids"] = inputs["conditioning_ids"].roll(1, 0)
            shuffled = model(**inputs, labels=inputs["input_ids"]).loss.item()
            print(
                f"held-out bits/dim with the true / another image's low-resolution input: {held_out:.3f} / "
                f"{shuffled:.3f}",
                flush=True,
            )
    return model, losses, held_out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=16, help="high-resolution side (the input is half of it)")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--radius",
        type=int,
        nargs="+",
        default=[0],
        help="conditioning_attention_radius of the conditional model(s), one trained per value (low-resolution "
        "pixels around the covering one; -1: full cross-attention)",
    )
    parser.add_argument("--output-dir", default="runs/super_resolution")
    args = parser.parse_args(argv)
    if args.size % 2 or args.size < 4:
        parser.error(f"--size must be even and >= 4, got {args.size}")
    if args.steps <= 0:
        parser.error(f"--steps must be > 0, got {args.steps}")
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    train_images = synthetic_shapes(2000, args.size, 1, seed=args.seed)
    test_images = synthetic_shapes(64, args.size, 1, seed=args.seed + 1)

    start = time.time()
    results = {}
    for radius in args.radius:
        trained, losses, held_out = train(args, True, train_images, test_images, radius)
        if not results:
            model = trained  # the first radius's model upscales the samples
        results[f"conditional, radius {radius if radius >= 0 else 'full'}"] = (losses, held_out)
    results["unconditional (same decoder)"] = train(args, False, train_images, test_images)[1:]
    print("| model | training loss, first 10 steps | last 10 steps | held-out bits/dim |")
    print("|---|---|---|---|")
    for name, (losses, held_out) in results.items():
        first, last = sum(losses[:10]) / min(10, len(losses)), sum(losses[-10:]) / min(10, len(losses))
        print(f"| {name} | {first:.3f} | {last:.3f} | {held_out:.3f} |")
    low = downsample(test_images[:4], 2)
    upscaled = model.upscale(low)
    save_png(low.repeat_interleave(2, 1).repeat_interleave(2, 2), output / "low_resolution.png")
    save_png(upscaled, output / "upscaled.png")
    save_png(test_images[:4], output / "ground_truth.png")
    print(f"wrote {output}/low_resolution.png, upscaled.png, ground_truth.png in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
