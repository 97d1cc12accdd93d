"""Transformer-XL: hf_txvariants against transformers 4.46.3's TransfoXL (same config, same weights), and evaluation
with memory against a model without memory recomputing a sliding window of the same attention length.

    python benchmarks/bench_transfo_xl.py --legacy-python /tmp/legacy/bin/python

`--legacy-python` is an interpreter with transformers==4.46.3 and torch (a throwaway venv:
`python -m venv /tmp/legacy && /tmp/legacy/bin/pip install torch==2.13.0 transformers==4.46.3`). Every number
is measured in this run; each implementation runs in its own process with the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = dict(
    vocab_size=10000,
    cutoffs=[2000, 5000],
    div_val=2,
    d_model=256,
    d_embed=256,
    n_head=8,
    d_head=32,
    d_inner=1024,
    n_layer=4,
    mem_len=128,
    clamp_len=1000,
    same_length=True,
    dropout=0.1,
    dropatt=0.0,
)
BATCH, SEGMENT = 8, 128

MAKE_LEGACY_CHECKPOINT = """
import sys, torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel
torch.manual_seed(0)
model = TransfoXLLMHeadModel(TransfoXLConfig(**{config}))
model.save_pretrained(sys.argv[1])
"""


def timed(fn, repeats):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def worker(implementation: str, folder: str, repeats: int) -> dict:
    import torch

    torch.manual_seed(0)
    if implementation == "legacy":
        from transformers import TransfoXLLMHeadModel

        original_type_as = torch.Tensor.type_as

        def type_as(self, other=None, dtype=None):  # transformers#29650: type_as(dtype=...) crashes
            return self.to(dtype) if dtype is not None else original_type_as(self, other)

        torch.Tensor.type_as = type_as
        model = TransfoXLLMHeadModel.from_pretrained(folder)
        model.crit.keep_order = True
    else:
        import hf_txvariants  # noqa: F401
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEGMENT))

    def memory_of(output):
        return {"mems": output.mems} if implementation == "legacy" else {"past_key_values": output.past_key_values}

    model.eval()
    with torch.no_grad():
        state = memory_of(model(ids, labels=ids))

        def evaluate():
            model(ids, labels=ids, **state)

        eval_seconds = timed(evaluate, repeats)

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    train_state = memory_of(model(ids, labels=ids))

    def train_step():
        output = model(ids, labels=ids, **train_state)
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    train_seconds = timed(train_step, repeats)
    return {
        "eval_tokens_per_s": BATCH * SEGMENT / eval_seconds,
        "train_tokens_per_s": BATCH * SEGMENT / train_seconds,
    }


def memory_vs_sliding_window(attention_lengths, tokens_measured: int) -> list[dict]:
    """Per-token evaluation cost at the same attention length A, character-level (256 symbols) as in the paper's
    comparison: Transformer-XL processing segments of A/2 tokens with A/2 tokens of memory, against a vanilla
    Transformer of the same size (sinusoidal positions) recomputing a window of A tokens for every predicted token
    (Al-Rfou et al.'s evaluation, `sliding_window_log_probs`, 8 windows per forward pass)."""
    import torch

    import hf_txvariants
    from hf_txvariants.training.sliding_window import sliding_window_log_probs

    size = dict(d_model=CONFIG["d_model"], n_head=CONFIG["n_head"], d_head=CONFIG["d_head"])
    size.update(d_inner=CONFIG["d_inner"], n_layer=CONFIG["n_layer"], dropout=0.0)
    rows = []
    for attention_length in attention_lengths:
        segment = attention_length // 2
        torch.manual_seed(0)
        xl_config = hf_txvariants.TransfoXLConfig(
            vocab_size=256, cutoffs=[], div_val=1, mem_len=attention_length - segment, clamp_len=0, same_length=False,
            memory_init="empty", **size,
        )
        xl = hf_txvariants.TransfoXLLMHeadModel(xl_config).eval()
        vanilla = hf_txvariants.VanillaForCausalLM(
            hf_txvariants.VanillaConfig(
                vocab_size=256, position_embedding_type="sinusoidal", max_position_embeddings=attention_length, **size
            )
        ).eval()
        ids = torch.randint(0, 256, (1, attention_length + tokens_measured))
        with torch.no_grad():
            cache = xl(ids[:, :segment]).past_key_values
            xl_seconds = timed(lambda: xl(ids[:, segment : 2 * segment], past_key_values=cache.clone()), 3) / segment
            window_seconds = timed(
                lambda: sliding_window_log_probs(vanilla, ids[:, 1:], attention_length, windows_per_batch=8), 1
            )
            # tokens_measured forward passes of A tokens: the first scores A tokens at once, each later one scores
            # one token; the per-token cost of a long evaluation is the cost of one window
            window_seconds /= tokens_measured
        rows.append(
            {
                "attention_length": attention_length,
                "xl_ms_per_token": 1000 * xl_seconds,
                "sliding_window_ms_per_token": 1000 * window_seconds,
                "speedup": window_seconds / xl_seconds,
            }
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", help="interpreter with transformers==4.46.3 (skip the comparison if unset)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each implementation; best kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention-lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--worker", choices=["legacy", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, args.repeats)))
        return

    print(f"config: {CONFIG}, batch {BATCH} x segment {SEGMENT}, {args.threads} threads, torch {torch.__version__}")
    if args.legacy_python:
        with tempfile.TemporaryDirectory() as folder:
            subprocess.run(
                [args.legacy_python, "-c", MAKE_LEGACY_CHECKPOINT.format(config=CONFIG), folder],
                check=True,
                capture_output=True,
            )
            # The two implementations alternate, so that a change of machine load hits both; best run kept.
            results = {"legacy": [], "ours": []}
            for _ in range(args.rounds):
                for name, python in (("legacy", args.legacy_python), ("ours", sys.executable)):
                    command = [python, __file__, "--worker", name, "--folder", folder, "--repeats", str(args.repeats)]
                    command += ["--threads", str(args.threads)]
                    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                    completed = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
                    results[name].append(json.loads(completed.stdout.strip().splitlines()[-1]))
        legacy, ours = ({key: max(run[key] for run in runs) for key in runs[0]} for runs in results.values())
        print("| measure | transformers 4.46.3 | hf_txvariants | ratio |")
        print("|---|---|---|---|")
        print(
            f"| evaluation with memory, tokens/s | {legacy['eval_tokens_per_s']:.0f} | {ours['eval_tokens_per_s']:.0f}"
            f" | {ours['eval_tokens_per_s'] / legacy['eval_tokens_per_s']:.2f}x |"
        )
        print(
            f"| training step (fwd+bwd+SGD), tokens/s | {legacy['train_tokens_per_s']:.0f} |"
            f" {ours['train_tokens_per_s']:.0f} | {ours['train_tokens_per_s'] / legacy['train_tokens_per_s']:.2f}x |"
        )
    print("| attention length | XL with memory, ms/token | sliding window, ms/token | speed-up |")
    print("|---|---|---|---|")
    for row in memory_vs_sliding_window(args.attention_lengths, tokens_measured=16):
        print(
            f"| {row['attention_length']} | {row['xl_ms_per_token']:.3f} | {row['sliding_window_ms_per_token']:.2f} |"
            f" {row['speedup']:.0f}x |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
