"""Train a small class-conditional Image Transformer on a synthetic image set made here (offline, deterministic),
report bits per dimension on held-out images, and save sampled images as PNG.

    python examples/train_image_transformer.py --steps 300 --output-dir runs/image_transformer

The image set: 8x8 grey images of 4 classes (horizontal bar, vertical bar, filled square, diagonal line) at random
positions and intensities on a dark noisy background, drawn from a seeded generator.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from hf_txvariants import ImageTransformerConfig, ImageTransformerForCausalLM
from hf_txvariants.modeling_image_transformer import images_to_input_ids
from hf_txvariants.training.images import save_png

CLASSES = ("horizontal bar", "vertical bar", "square", "diagonal")


def make_shapes(count: int, seed: int, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` uint8 images [count, size, size, 1] and their class labels, deterministic for a seed."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, len(CLASSES), (count,), generator=generator)
    images = torch.randint(0, 24, (count, size, size), generator=generator)
    for i, label in enumerate(labels.tolist()):
        value = int(torch.randint(160, 256, (1,), generator=generator))
        a, b = (int(x) for x in torch.randint(0, size - 3, (2,), generator=generator))
        if label == 0:
            images[i, a + 1, b : b + 4] = value
        elif label == 1:
            images[i, a : a + 4, b + 1] = value
        elif label == 2:
            images[i, a : a + 3, b : b + 3] = value
        else:
            for k in range(4):
                images[i, a + k, b + k] = value
    return images[..., None].to(torch.uint8), labels


@torch.no_grad()
def bits_per_dim(model, ids, labels, batch_size=64):
    model.eval()
    total = 0.0
    for start in range(0, ids.shape[0], batch_size):
        chunk = ids[start : start + batch_size]
        total += (
            model(chunk, labels=chunk, class_labels=labels[start : start + batch_size]).loss.item() * chunk.shape[0]
        )
    return total / ids.shape[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--attention-type", choices=["local_1d", "local_2d"], default="local_2d")
    parser.add_argument("--output-dir", default="runs/image_transformer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)

    config = ImageTransformerConfig(
        image_size=[8, 8],
        num_channels=1,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=128,
        attention_type=args.attention_type,
        block_length=16,
        query_shape=[4, 4],
        memory_flange=[2, 4],
        num_classes=len(CLASSES),
    )
    model = ImageTransformerForCausalLM(config)
    train_images, train_labels = make_shapes(2048, seed=1)
    test_images, test_labels = make_shapes(256, seed=2)
    train_ids, test_ids = images_to_input_ids(train_images, config), images_to_input_ids(test_images, config)
    save_png(test_images[:8], output / "data_examples.png")

    print(f"held-out bits/dim before training: {bits_per_dim(model, test_ids, test_labels):.3f}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.learning_rate, total_steps=args.steps)
    started = time.time()
    for step in range(1, args.steps + 1):
        model.train()
        index = torch.randint(0, train_ids.shape[0], (args.batch_size,))
        loss = model(train_ids[index], labels=train_ids[index], class_labels=train_labels[index]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step}: train bits/dim {loss.item():.3f} ({time.time() - started:.0f} s)")
    held_out = bits_per_dim(model, test_ids, test_labels)
    print(f"held-out bits/dim after {args.steps} steps: {held_out:.3f} (uniform: {math.log2(256):.1f})")

    model.eval()
    samples = model.generate_images(class_labels=torch.arange(len(CLASSES)).repeat_interleave(4))
    save_png(samples, output / "samples.png")
    model.save_pretrained(output / "model")
    print(f"wrote {output / 'samples.png'} (4 per class: {', '.join(CLASSES)}) and {output / 'model'}")


if __name__ == "__main__":
    main()
