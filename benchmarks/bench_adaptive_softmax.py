"""The adaptive softmax and the adaptive input alone, this checkout against other checkouts, in one process.

Each code root (a folder holding `hf_txvariants/`, e.g. `mkdir -p DIR && git archive main hf_txvariants | tar -x -C
DIR`) has its `txv_adaptive_softmax.py` loaded under its own name; every implementation gets the same weights and
inputs, and the calls are interleaved (random order each round) so that the load of a shared machine hits all alike.
Reported: the fastest call of each measure in milliseconds and the ratio old / new (> 1: this checkout is faster).

    python benchmarks/bench_adaptive_softmax.py --code-roots /tmp/main_copy [--config small] [--rounds 20]
        [--threads 1]

Measures: the per-token NLL with labels (forward + backward, and forward alone without autograd, as the training
step and the evaluation of `bench_transfo_xl.py` call it with `return_logits=False`), the full log-probabilities
(forward + backward, and without autograd), and the adaptive input embedding (forward + backward, and forward alone).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from pathlib import Path

import torch

REPOSITORY = Path(__file__).resolve().parent.parent
# name: (vocab_size, cutoffs, div_val, d_embed, d_proj, rows of hidden states, label distribution)
CONFIGS = {
    # bench_transfo_xl.py's `small` (batch 8 x 128 tokens, 127 predicted per row, uniform random labels)
    "small": (10000, [2000, 5000], 2, 256, 256, 8 * 127, "uniform"),
    # the wt103 softmax (div_val 1, no projection) on 256 tokens whose labels follow Zipf's law, as words do
    "wt103": (267735, [20000, 40000, 200000], 1, 410, 410, 256, "zipf"),
}


def load_module(code_root: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, code_root / "hf_txvariants" / "txv_adaptive_softmax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def labels(vocab_size: int, count: int, distribution: str, generator: torch.Generator) -> torch.Tensor:
    if distribution == "uniform":
        return torch.randint(0, vocab_size, (count,), generator=generator)
    ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
    return torch.multinomial(1.0 / ranks, count, replacement=True, generator=generator)


def build(module, config, generator):
    vocab_size, cutoffs, div_val, d_embed, d_proj, _, _ = config
    softmax = module.ProjectedAdaptiveLogSoftmax(vocab_size, d_embed, d_proj, cutoffs, div_val)
    embedding = module.AdaptiveEmbedding(vocab_size, d_embed, d_proj, cutoffs, div_val)
    with torch.no_grad():
        for parameter in [*softmax.parameters(), *embedding.parameters()]:
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return softmax, embedding


def measures(softmax, embedding, hidden, targets, input_ids):
    def nll_train():
        softmax.nll(hidden, targets).sum().backward()

    def embedding_train():
        embedding(input_ids).sum().backward()

    def log_probs_train():
        softmax.log_probs(hidden).sum().backward()

    @torch.no_grad()
    def nll_eval():
        softmax.nll(hidden, targets)

    @torch.no_grad()
    def log_probs_eval():
        softmax.log_probs(hidden)

    @torch.no_grad()
    def embedding_eval():
        embedding(input_ids)

    return {
        "nll forward+backward": nll_train,
        "nll forward, no_grad": nll_eval,
        "log_probs forward+backward": log_probs_train,
        "log_probs, no_grad": log_probs_eval,
        "adaptive input forward+backward": embedding_train,
        "adaptive input forward, no_grad": embedding_eval,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code-roots", nargs="*", default=[], help="older checkouts to compare with")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = CONFIGS[args.config]
    vocab_size, _, _, _, d_proj, rows, distribution = config
    data = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, d_proj, generator=data).requires_grad_()
    targets = labels(vocab_size, rows, distribution, data)
    input_ids = labels(vocab_size, rows, distribution, data).view(8, -1) if rows % 8 == 0 else targets[None]

    roots = {"this checkout": REPOSITORY, **{str(root): Path(root) for root in args.code_roots}}
    calls, outputs = {}, {}
    for index, (name, root) in enumerate(roots.items()):
        module = load_module(root, f"adaptive_softmax_{index}")
        softmax, embedding = build(module, config, torch.Generator().manual_seed(1))
        calls[name] = measures(softmax, embedding, hidden, targets, input_ids)
        with torch.no_grad():
            outputs[name] = (softmax.nll(hidden, targets), embedding(input_ids))
    reference = calls["this checkout"]
    for name, (nll, embedded) in outputs.items():  # same weights: the same results up to rounding
        nll_difference = (nll - outputs["this checkout"][0]).abs().max().item()
        embedding_difference = (embedded - outputs["this checkout"][1]).abs().max().item()
        print(
            f"{name}: largest difference to this checkout: nll {nll_difference:.2e}, input {embedding_difference:.2e}"
        )

    best = {name: {measure: float("inf") for measure in reference} for name in calls}
    for _ in range(args.rounds):
        for measure in reference:
            order = list(calls)
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                calls[name][measure]()
                best[name][measure] = min(best[name][measure], time.perf_counter() - start)

    print(f"config {args.config}: {config[:6]}, labels {distribution}, {args.threads} thread(s), best of {args.rounds}")
    header = f"{'measure':34s}" + "".join(f"{name[-24:]:>26s}" for name in calls)
    print(header + "".join(f"{'ratio ' + name[-18:]:>26s}" for name in list(calls)[1:]))
    for measure in reference:
        row = f"{measure:34s}" + "".join(f"{best[name][measure] * 1e3:23.2f} ms" for name in calls)
        row += "".join(f"{best[name][measure] / best['this checkout'][measure]:25.2f}x" for name in list(calls)[1:])
        print(row)


if __name__ == "__main__":
    main()
