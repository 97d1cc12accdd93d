"""The training loop's loss with an adaptive softmax: `lm_forward` (the targets as `shift_labels`, each target's
cluster only) against the formula it replaced (cross-entropy of the model's full `[tokens, vocabulary]`
log-probabilities), one training step (forward + backward) each, interleaved in one process, best of 8.

    HF_HUB_OFFLINE=1 python benchmarks/bench_loop_loss.py [--threads 1]

Config `small` of bench_transfo_xl.py (vocabulary 10,000, cutoffs [2000, 5000], div_val 2), batch 8 x 128, no memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfo_xl import CONFIGS  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from hf_txvariants import TransfoXLConfig
    from hf_txvariants.training.models import lm_forward

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config, batch, segment = CONFIGS["small"]
    model = AutoModelForCausalLM.from_config(TransfoXLConfig(**config)).train()
    inputs = torch.randint(0, config["vocab_size"], (batch, segment))
    targets = torch.randint(0, config["vocab_size"], (batch, segment))

    def full_log_probs():
        logits = model(input_ids=inputs, use_cache=False).logits
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()

    def targets_clusters_only():
        lm_forward(model, inputs, targets, None)[0].backward()

    steps = {
        "full log-probabilities + cross-entropy (before)": full_log_probs,
        "lm_forward, targets' clusters only (now)": targets_clusters_only,
    }
    times = {name: [] for name in steps}
    for step in steps.values():
        step(), step()  # warm-up
    for _ in range(args.rounds):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
    before, now = (min(t) for t in times.values())
    for name, seconds in times.items():
        print(f"{name}: best {min(seconds) * 1e3:.0f} ms per training step")
    print(f"speed-up: {before / now:.2f}x")


if __name__ == "__main__":
    main()
