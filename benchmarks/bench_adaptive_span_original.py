"""The original adaptive-span code against `txv_adaptive_span_original` on the same weights, in the same run: the
paper's evaluation (`full_eval`: batch 8, blocks carried through the cache from zeros) on CPU.

    git clone https://github.com/facebookresearch/adaptive-span /tmp/adaptive-span
    python benchmarks/bench_adaptive_span_original.py --original /tmp/adaptive-span

A random model of the enwik8 shape scaled down (default: 4 layers, 256 wide, 4 heads of 64, feed-forward 1024,
attn_span 1024, blocks of 128, adaptive span with the cache trimmed; --pers-mem-size N gives the all-attention
network) is built by the ORIGINAL code (`models.TransformerSeq`, imported from --original, never copied here), its
spans set to a spread of lengths (so layers trim differently), saved by the original's `save_checkpoint` and converted
by conversion/adaptive_span.py. Both then evaluate the same random text (`--chars` symbols): the original's
`trainer.full_eval` and conversion/evaluate_adaptive_span.py's `full_eval`, alternating, `--repeats` times each; the
median seconds and their ratio are printed with both losses (which must agree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--original", required=True, help="a checkout of facebookresearch/adaptive-span")
    ap.add_argument("--chars", type=int, default=8 * 5 * 128 + 8, help="symbols of text evaluated")
    ap.add_argument("--nlayers", type=int, default=4)
    ap.add_argument("--hid-sz", type=int, default=256)
    ap.add_argument("--inner-hid-sz", type=int, default=1024)
    ap.add_argument("--nheads", type=int, default=4)
    ap.add_argument("--attn-span", type=int, default=1024)
    ap.add_argument("--block-sz", type=int, default=128)
    ap.add_argument("--pers-mem-size", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=206, help="enwik8's symbols in the original's numbering")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, args.original)
    import utils  # noqa: E402  (the original's)
    from config import PARAMS_CONFIG  # noqa: E402
    from models import TransformerSeq  # noqa: E402
    from trainer import full_eval as original_full_eval  # noqa: E402
    from transformers import AutoModelForCausalLM

    from conversion.adaptive_span import main as convert
    from conversion.evaluate_adaptive_span import full_eval

    flags = (
        f"--nlayers {args.nlayers} --hid-sz {args.hid_sz} --inner-hid-sz {args.inner_hid_sz} --nheads {args.nheads} "
        f"--attn-span {args.attn_span} --block-sz {args.block_sz} --dropout 0.3 --adapt-span "
        f"--adapt-span-loss 0.0000005 --adapt-span-cache --pers-mem-size {args.pers_mem_size}"
    ).split()
    params = utils.get_params(PARAMS_CONFIG, args=flags)
    torch.manual_seed(0)
    original = TransformerSeq(
        vocab_size=args.vocab,
        **params["model_params"],
        adapt_io_params=params["adapt_io_params"],
        adapt_span_params=params["adapt_span_params"],
        pers_mem_params=params["pers_mem_params"],
    )
    with torch.no_grad():  # spans from 5% to 60% of S across layers and heads
        fractions = torch.linspace(0.05, 0.6, args.nlayers * args.nheads).view(args.nlayers, args.nheads)
        for layer, values in zip(original.layers, fractions):
            layer.attn.attn.adaptive_span._mask.current_val.copy_(values.view(-1, 1, 1))
    original = torch.nn.DataParallel(original).eval()
    optimizer = torch.optim.SGD(original.parameters(), lr=0.1)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = Path(folder) / "model.pt"
        utils.save_checkpoint(str(checkpoint), 0, original, optimizer, None, utils.Logger("bpc"))
        if convert(["--checkpoint", str(checkpoint), "--output", f"{folder}/converted", "--", *flags]) != 0:
            raise SystemExit("conversion failed")
        ours = AutoModelForCausalLM.from_pretrained(f"{folder}/converted").eval()
    text = torch.randint(0, args.vocab, (args.chars,), generator=torch.Generator().manual_seed(1))
    batch = 8
    rows = text.numel() // batch
    stream = text[: rows * batch].view(batch, rows)
    times = {"original": [], "hf_txvariants": []}
    losses = {}
    with torch.no_grad():
        for _ in range(args.repeats):
            start = time.perf_counter()
            losses["original"] = float(
                original_full_eval(original, optimizer, None, stream, args.block_sz, args.hid_sz)
            )
            times["original"].append(time.perf_counter() - start)
            start = time.perf_counter()
            losses["hf_txvariants"], blocks = full_eval(ours, text, batch, args.block_sz)
            times["hf_txvariants"].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    cache_lengths = ours.model.cache_lengths()
    result = dict(
        shape=dict(
            layers=args.nlayers,
            hidden=args.hid_sz,
            heads=args.nheads,
            inner=args.inner_hid_sz,
            attn_span=args.attn_span,
            block=args.block_sz,
            pers_mem_size=args.pers_mem_size,
        ),
        chars=args.chars,
        batch=batch,
        blocks=blocks,
        threads=args.threads,
        cache_lengths=cache_lengths,
        seconds=median,
        ratio_original_over_ours=median["original"] / median["hf_txvariants"],
        loss=losses,
        loss_difference=abs(losses["original"] - losses["hf_txvariants"]),
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
