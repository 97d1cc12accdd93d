"""Transformer-XL: hf_txvariants against transformers 4.46.3's TransfoXL (same config, same weights) on CPU and CUDA,
in float32 and bfloat16 (autocast, or the weights cast), reporting tokens/s, peak memory and the achieved TFLOP/s
(FLOPs counted from the shapes); and evaluation with memory against a model without memory recomputing a sliding
window of the same attention length.

    python benchmarks/bench_transfo_xl.py --legacy-python /tmp/legacy/bin/python [--devices cpu cuda]
        [--config small|enwik8_base|wt103_base] [--dtypes fp32 bf16 bf16-weights]

`--legacy-python` is an interpreter with transformers==4.46.3 and torch (a throwaway venv:
`python -m venv /tmp/legacy && /tmp/legacy/bin/pip install torch==2.13.0 transformers==4.46.3`, a CUDA build of torch
for the GPU rows). Every number is measured in this run; each (implementation, device, dtype) runs in its own
process with the same thread count, the implementations alternating for `--rounds` rounds, best round kept.
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

CONFIGS = {
    # the CPU-sized model of the earlier measurements
    "small": (
        dict(
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
        ),
        8,
        128,
    ),
    # the paper's enwik8 base (12 layers, d 512, tgt 512, mem 512, batch 22)
    "enwik8_base": (
        dict(
            vocab_size=204,
            cutoffs=[],
            div_val=1,
            d_model=512,
            d_embed=512,
            n_head=8,
            d_head=64,
            d_inner=2048,
            n_layer=12,
            mem_len=512,
            clamp_len=-1,
            same_length=False,
            dropout=0.1,
            dropatt=0.0,
        ),
        22,
        512,
    ),
    # the paper's wt103 base (adaptive softmax, div_val 1, tgt 150, mem 150, batch 60)
    "wt103_base": (
        dict(
            vocab_size=267735,
            cutoffs=[20000, 40000, 200000],
            div_val=1,
            d_model=410,
            d_embed=410,
            n_head=10,
            d_head=41,
            d_inner=2100,
            n_layer=16,
            mem_len=150,
            clamp_len=-1,
            same_length=False,
            dropout=0.1,
            dropatt=0.0,
        ),
        60,
        150,
    ),
}
# name: (dtype, whether the model weights are cast to it; otherwise autocast of the float32 model)
DTYPES = {"fp32": ("float32", False), "bf16": ("bfloat16", False), "bf16-weights": ("bfloat16", True)}

MAKE_LEGACY_CHECKPOINT = """
import sys, torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel
torch.manual_seed(0)
model = TransfoXLLMHeadModel(TransfoXLConfig(**{config}))
model.save_pretrained(sys.argv[1])
"""


def timed(fn, repeats, synchronize=lambda: None):
    fn()  # warm-up
    synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize()
    return (time.perf_counter() - start) / repeats


def forward_flops(config: dict, batch: int, segment: int, targets) -> float:
    """Multiply-adds x 2 of one forward pass with memory and labels, from the shapes (the work the model needs:
    queries of the segment only, keys/values of memory + segment, one position row per distance; adaptive input
    counted as head-cluster tokens; the adaptive softmax's tails for the targets that fall in them)."""
    d, heads, head_dim, inner = config["d_model"], config["n_head"], config["d_head"], config["d_inner"]
    keys = config["mem_len"] + segment
    tokens = batch * segment
    attention_width = heads * head_dim
    per_layer = (
        tokens * d * attention_width  # queries
        + 2 * batch * keys * d * attention_width  # keys, values
        + (keys + 1) * d * attention_width  # position keys
        + 3 * batch * heads * segment * keys * head_dim  # content scores, position scores, weighted values
        + tokens * attention_width * d  # output projection
        + 2 * tokens * d * inner  # feed-forward
    )
    multiply_adds = config["n_layer"] * per_layer
    d_embed = config["d_embed"]
    if d_embed != d:
        multiply_adds += 2 * tokens * d_embed * d  # input and output projections of the head cluster
    edges = [0, *config["cutoffs"], config["vocab_size"]]
    multiply_adds += len(targets) * d_embed * (edges[1] + len(config["cutoffs"]))  # softmax head
    for cluster, (start, end) in enumerate(zip(edges[1:-1], edges[2:]), start=1):
        rows = int(((targets >= start) & (targets < end)).sum())
        cluster_dim = d_embed // config["div_val"] ** cluster
        projection = d * cluster_dim if (config["div_val"] > 1 or d_embed != d) else 0
        multiply_adds += rows * (projection + cluster_dim * (end - start))
    return 2.0 * multiply_adds


def worker(
    implementation: str, folder: str, config_name: str, device: str, dtype_name: str, repeats: int, compile_ours=False
) -> dict:
    import resource

    import torch

    config, batch, segment = CONFIGS[config_name]
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
        from transformers import AutoModelForCausalLM

        import hf_txvariants  # noqa: F401

        model = AutoModelForCausalLM.from_pretrained(folder)
    dtype_attribute, cast_weights = DTYPES[dtype_name]
    dtype = getattr(torch, dtype_attribute)
    model.to(device, dtype if cast_weights else torch.float32)
    use_autocast = dtype != torch.float32 and not cast_weights
    autocast = lambda: torch.autocast(device, dtype=dtype, enabled=use_autocast)  # noqa: E731
    cuda = device == "cuda"
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    ids = torch.randint(0, config["vocab_size"], (batch, segment), device=device)

    # With labels the legacy model returns only the losses; ours would also compute the log-probabilities unless told.
    labels_only = {} if implementation == "legacy" else {"return_logits": False}
    module = model
    if compile_ours and implementation == "ours":
        model = torch.compile(module)  # the switch a user turns on (warm-up calls below include the compilation)

    def memory_of(output):
        return {"mems": output.mems} if implementation == "legacy" else {"cache": output.cache}

    def peak_memory_mib(reset=False):
        if cuda:
            if reset:
                torch.cuda.reset_peak_memory_stats()
            return torch.cuda.max_memory_allocated() / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # process peak resident set, KiB -> MiB

    module.eval()
    with torch.no_grad(), autocast():
        state = memory_of(model(ids, labels=ids, **labels_only))
        peak_memory_mib(reset=True)

        def evaluate():
            model(ids, labels=ids, **labels_only, **state)

        eval_seconds = timed(evaluate, repeats, synchronize)
        eval_peak = peak_memory_mib()

    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-4)
    with autocast():
        train_state = memory_of(model(ids, labels=ids, **labels_only))
    peak_memory_mib(reset=True)

    def train_step():
        with autocast():
            output = model(ids, labels=ids, **labels_only, **train_state)
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    train_seconds = timed(train_step, repeats, synchronize)
    flops = forward_flops(config, batch, segment, ids[:, 1:].reshape(-1).cpu())
    return {
        "eval_tokens_per_s": batch * segment / eval_seconds,
        "train_tokens_per_s": batch * segment / train_seconds,
        "eval_tflops": flops / eval_seconds / 1e12,
        "train_tflops": 3 * flops / train_seconds / 1e12,  # backward = 2 forward
        "eval_peak_mib": eval_peak,
        "train_peak_mib": peak_memory_mib(),
    }


def compare_with_legacy(args, devices) -> list[str]:
    config, batch, segment = CONFIGS[args.config]
    ours = "hf_txvariants + torch.compile" if args.compile else "hf_txvariants"
    lines = [
        f"config {args.config}: {config}, batch {batch} x segment {segment}, {args.threads} threads",
        "",
        f"| device | dtype | measure | transformers 4.46.3 | {ours} | ratio |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [args.legacy_python, "-c", MAKE_LEGACY_CHECKPOINT.format(config=config), folder],
            check=True,
            capture_output=True,
        )
        for device in devices:
            for dtype_name in args.dtypes:
                # The two implementations alternate, so that a change of machine load hits both; best run kept.
                results = {"legacy": [], "ours": []}
                for _ in range(args.rounds):
                    for name, python in (("legacy", args.legacy_python), ("ours", sys.executable)):
                        command = [python, __file__, "--worker", name, "--folder", folder, "--config", args.config]
                        command += ["--devices", device, "--dtypes", dtype_name, "--repeats", str(args.repeats)]
                        command += ["--threads", str(args.threads)] + (["--compile"] if args.compile else [])
                        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                        completed = subprocess.run(command, capture_output=True, text=True, env=env)
                        if completed.returncode != 0:  # e.g. the legacy model's index_copy_ under autocast
                            error = [line for line in completed.stderr.splitlines() if "Error" in line]
                            results[name].append({"error": (error or [f"exit {completed.returncode}"])[-1]})
                        else:
                            results[name].append(json.loads(completed.stdout.strip().splitlines()[-1]))
                failed = {name: runs[0]["error"] for name, runs in results.items() if "error" in runs[0]}
                for name, error in failed.items():
                    lines.append(f"| {device} | {dtype_name} | {name} fails: {error[:150]} | | | |")
                best = {}
                for name, runs in results.items():
                    if name in failed:
                        continue
                    best[name] = {key: max(run[key] for run in runs) for key in runs[0]}
                    for key in ("eval_peak_mib", "train_peak_mib"):  # memory: the smallest peak of the rounds
                        best[name][key] = min(run[key] for run in runs)
                legacy, ours = best.get("legacy"), best.get("ours")
                memory_kind = "peak allocated MiB" if device == "cuda" else "peak process RSS MiB"
                for label, key, digits in (
                    ("evaluation with memory, tokens/s", "eval_tokens_per_s", 0),
                    ("evaluation, achieved TFLOP/s", "eval_tflops", 3),
                    (f"evaluation, {memory_kind}", "eval_peak_mib", 0),
                    ("training step (fwd+bwd+SGD), tokens/s", "train_tokens_per_s", 0),
                    ("training, achieved TFLOP/s", "train_tflops", 3),
                    (f"training, {memory_kind}", "train_peak_mib", 0),
                ):
                    cells = [f"{result[key]:.{digits}f}" if result else "fails" for result in (legacy, ours)]
                    ratio = f"{ours[key] / legacy[key]:.2f}x" if legacy and ours else "-"
                    lines.append(f"| {device} | {dtype_name} | {label} | {cells[0]} | {cells[1]} | {ratio} |")
    return lines


def memory_vs_sliding_window(attention_lengths, tokens_measured: int) -> list[dict]:
    """Per-token evaluation cost at the same attention length A, character-level (256 symbols) as in the paper's
    comparison: Transformer-XL processing segments of A/2 tokens with A/2 tokens of memory, against a vanilla
    Transformer of the same size (sinusoidal positions) recomputing a window of A tokens for every predicted token
    (Al-Rfou et al.'s evaluation, `sliding_window_log_probs`, 8 windows per forward pass)."""
    import torch

    import hf_txvariants
    from hf_txvariants.training.sliding_window import sliding_window_log_probs

    config = CONFIGS["small"][0]
    size = dict(d_model=config["d_model"], n_head=config["n_head"], d_head=config["d_head"])
    size.update(d_inner=config["d_inner"], n_layer=config["n_layer"], dropout=0.0)
    rows = []
    for attention_length in attention_lengths:
        segment = attention_length // 2
        torch.manual_seed(0)
        xl_config = hf_txvariants.TransfoXLConfig(
            vocab_size=256,
            cutoffs=[],
            div_val=1,
            mem_len=attention_length - segment,
            clamp_len=0,
            same_length=False,
            memory_init="empty",
            **size,
        )
        xl = hf_txvariants.TransfoXLLMHeadModel(xl_config).eval()
        vanilla = hf_txvariants.VanillaForCausalLM(
            hf_txvariants.VanillaConfig(
                vocab_size=256, position_embedding_type="sinusoidal", max_position_embeddings=attention_length, **size
            )
        ).eval()
        ids = torch.randint(0, 256, (1, attention_length + tokens_measured))
        with torch.no_grad():
            cache = xl(ids[:, :segment]).cache
            xl_seconds = timed(lambda: xl(ids[:, segment : 2 * segment], cache=cache.clone()), 3) / segment
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
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument(
        "--devices",
        nargs="+",
        choices=["cpu", "cuda"],
        default=["cpu", "cuda"],
        help="cuda is skipped (and said so) where it is not available",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=list(DTYPES),
        default=["fp32", "bf16", "bf16-weights"],
        help="bf16: autocast of the float32 model (mixed precision); bf16-weights: the model cast",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each implementation; best kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="our model wrapped in torch.compile (default backend)")
    parser.add_argument(
        "--attention-lengths",
        type=int,
        nargs="*",
        default=[128, 512],
        help="memory vs sliding window comparison (none: skip it)",
    )
    parser.add_argument("--worker", choices=["legacy", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.worker:
        result = worker(
            args.worker, args.folder, args.config, args.devices[0], args.dtypes[0], args.repeats, args.compile
        )
        print(json.dumps(result))
        return

    devices = [device for device in args.devices if device != "cuda" or torch.cuda.is_available()]
    if "cuda" in args.devices and "cuda" not in devices:
        print("CUDA is not available: GPU rows not measured")
    gpu = f", GPU {torch.cuda.get_device_name()}" if "cuda" in devices else ""
    print(f"torch {torch.__version__}{gpu}")
    if args.legacy_python:
        print("\n".join(compare_with_legacy(args, devices)))
    if args.attention_lengths:
        print("| attention length | XL with memory, ms/token | sliding window, ms/token | speed-up |")
        print("|---|---|---|---|")
        for row in memory_vs_sliding_window(args.attention_lengths, tokens_measured=16):
            print(
                f"| {row['attention_length']} | {row['xl_ms_per_token']:.3f} |"
                f" {row['sliding_window_ms_per_token']:.2f} | {row['speedup']:.0f}x |"
            )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
