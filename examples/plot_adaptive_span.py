"""Trains a small adaptive-span language model on characters and plots the learned span of every head and layer.

    python examples/plot_adaptive_span.py --steps 300 --out adaptive_span.png [--text my.txt] [--save-dir span-lm]

The text defaults to the corpus embedded in hf_txvariants. Training follows the original recipe in miniature: ordered
segments with the memory carried over, the span penalty in the loss (`adapt_span_loss`), and the spans clamped into
[0, attn_span] after every optimiser step (`clamp_spans_`). Needs matplotlib (`pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from hf_txvariants import AdaptiveSpanConfig, AdaptiveSpanForCausalLM
from hf_txvariants.training.data import build_char_tokenizer, encode, load_text, segment_stream


def train_adaptive_span(
    steps: int = 300,
    attn_span: int = 128,
    seg_len: int = 32,
    batch_size: int = 8,
    span_loss: float = 2e-4,
    lr: float = 3e-3,
    text: str | None = None,
    seed: int = 0,
    log_every: int = 50,
    config_overrides: dict | None = None,
):
    """Returns (model, tokenizer, log) after `steps` steps; `log` lists (step, bits per character, mean span)."""
    torch.manual_seed(seed)
    corpus = load_text(text)
    tokenizer = build_char_tokenizer(corpus)
    tokens = encode(tokenizer, corpus)
    stream = segment_stream(tokens, batch_size, seg_len)
    config = AdaptiveSpanConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=256,
        num_hidden_layers=3,
        attn_span=attn_span,
        adapt_span_ramp=32,
        adapt_span_init=0.5,
        adapt_span_loss=span_loss,
        **(config_overrides or {}),
    )
    model = AdaptiveSpanForCausalLM(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    memory, log = None, []
    for step in range(1, steps + 1):
        inputs, _ = stream.segment(step - 1)
        # the model shifts the labels itself (position t predicts inputs[t + 1])
        output = model(inputs, cache=memory, labels=inputs)
        memory = output.cache
        optimizer.zero_grad()
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.clamp_spans_()
        if step % log_every == 0 or step == steps:
            bits = float(output.lm_loss.detach()) / math.log(2)
            log.append((step, bits, float(model.get_spans().mean())))
            print(f"step {step}: {bits:.3f} bits/char, mean span {log[-1][2]:.1f}", flush=True)
    return model.eval(), tokenizer, log


def plot_spans(spans: torch.Tensor, max_span: int, path: str | Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, heads = spans.shape
    figure, axis = plt.subplots(figsize=(1.2 + 0.9 * layers, 3.5))
    width = 0.8 / heads
    for head in range(heads):
        positions = [layer + (head - (heads - 1) / 2) * width for layer in range(layers)]
        axis.bar(positions, spans[:, head].tolist(), width=width, label=f"head {head}")
    axis.axhline(max_span, color="gray", linestyle="--", linewidth=1, label="max span S")
    axis.set_xticks(range(layers), [f"layer {i}" for i in range(layers)])
    axis.set_ylabel("learned span z (tokens)")
    axis.set_title("Adaptive attention span after training")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--attn-span", type=int, default=128)
    parser.add_argument("--seg-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--span-loss", type=float, default=2e-4, help="adapt_span_loss, the span penalty weight")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--text", default=None, help="a text file (default: the embedded corpus)")
    parser.add_argument("--out", default="adaptive_span.png")
    parser.add_argument("--save-dir", default=None, help="also save the trained model and tokenizer here")
    args = parser.parse_args()
    start = time.time()
    model, tokenizer, _ = train_adaptive_span(
        args.steps, args.attn_span, args.seg_len, args.batch_size, args.span_loss, args.lr, args.text
    )
    spans = model.get_spans()
    print("learned spans (tokens), one row per layer:")
    for layer, row in enumerate(spans.tolist()):
        print(f"  layer {layer}: " + ", ".join(f"{z:.1f}" for z in row))
    plot_spans(spans, args.attn_span, args.out)
    print(f"wrote {args.out} ({time.time() - start:.0f} s)")
    if args.save_dir:
        model.save_pretrained(args.save_dir)
        tokenizer.save_pretrained(args.save_dir)


if __name__ == "__main__":
    main()
