"""Transformer-XL training at the hardware's speed (issue 45): tokens/s and model FLOP/s of a training step (forward,
backward, SGD, memory carried), bf16 autocast, eager and compiled, for the papers' base configurations and NVIDIA's
DeepLearningExamples base, each beside a transformers GPT-2 of the same width and depth on SDPA (no memory, the same
tokens per step) and transformers 4.46.3's TransfoXL where its interpreter is given. Writes one JSON record per
configuration (`--output`, default benchmarks/gpu_training.json).

    python benchmarks/bench_gpu_training.py [--legacy-python /tmp/legacy_python] [--configs ...] [--step-limit-s 75]

TFLOP/s are counted from the shapes (`bench_transfo_xl.forward_flops` for Transformer-XL, `gpt2_forward_flops` for
GPT-2; a training step = 3 forward passes of work) and given as a fraction of `--peak-tflops` (989: NVIDIA's datasheet
figure for the H100 SXM, dense bf16; not measured here). Every (configuration, implementation) runs in its own process
under a time limit (`--step-limit-s`, the compiled run `--compile-limit-s`), so a slow compilation or a hang costs
only its share; with the defaults the whole script stays under 8 minutes (3 configurations x (3 x 25 s + 80 s) =
465 s at most, plus the legacy checkpoints). The `tiny` configuration is a CPU smoke run (`--device cpu --configs
tiny`).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfo_xl import CONFIGS, MAKE_LEGACY_CHECKPOINT, forward_flops  # noqa: E402

# NVIDIA DeepLearningExamples' Transformer-XL base (PyTorch, wt103): 16 layers, d_model 512, 8 heads of 64, d_inner
# 2048, tgt_len = mem_len = 192, batch 32, the wt103 vocabulary with its adaptive softmax (div_val 1)
NVIDIA_BASE = (
    dict(  # the paper's wt103 base (adaptive softmax, div_val 1, dropout, no clamp_len or same_length), resized
        CONFIGS["wt103_base"][0],
        cutoffs=[19997, 39997, 199997],
        d_model=512,
        d_embed=512,
        n_head=8,
        d_head=64,
        d_inner=2048,
        n_layer=16,
        mem_len=192,
    ),
    32,
    192,
)
TINY = (  # a smoke run on CPU: every code path of the script in seconds
    dict(
        vocab_size=50,
        cutoffs=[20],
        div_val=1,
        d_model=32,
        d_embed=32,
        n_head=2,
        d_head=16,
        d_inner=64,
        n_layer=2,
        mem_len=8,
        clamp_len=-1,
        same_length=False,
        dropout=0.1,
        dropatt=0.0,
    ),
    2,
    8,
)
TRAINING_CONFIGS = {
    "enwik8_base": CONFIGS["enwik8_base"],
    "wt103_base": CONFIGS["wt103_base"],
    "nvidia_base": NVIDIA_BASE,
    "tiny": TINY,
}
IMPLEMENTATIONS = ("ours_eager", "ours_compiled", "gpt2_sdpa", "legacy")
H100_DENSE_BF16_TFLOPS = 989.0


def gpt2_forward_flops(config: dict, batch: int, segment: int) -> float:
    """Multiply-adds x 2 of one forward pass of a GPT-2 of the Transformer-XL config's width and depth (d_model,
    n_head x d_head, d_inner, n_layer) over `batch x segment` tokens with a full softmax over the vocabulary: the
    projections, every query against every key (the causal half included, as `forward_flops` counts the future keys
    of a segment) and the LM head."""
    d, width, inner = config["d_model"], config["n_head"] * config["d_head"], config["d_inner"]
    tokens = batch * segment
    per_layer = (
        tokens * d * 3 * width  # queries, keys, values
        + 2 * batch * config["n_head"] * segment * segment * config["d_head"]  # scores, weighted values
        + tokens * width * d  # output projection
        + 2 * tokens * d * inner  # feed-forward
    )
    return 2.0 * (config["n_layer"] * per_layer + tokens * d * config["vocab_size"])


def gpt2_config(config: dict, segment: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=config["vocab_size"],
        n_positions=segment,
        n_embd=config["d_model"],
        n_layer=config["n_layer"],
        n_head=config["n_head"],
        n_inner=config["d_inner"],
        resid_pdrop=config["dropout"],
        embd_pdrop=config["dropout"],
        attn_pdrop=config["dropatt"],
    )


def worker(implementation: str, config_name: str, device: str, time_limit: float, folder: str | None) -> dict:
    """Trains `implementation` on random tokens for about `time_limit` seconds after its warm-up (compilation
    included); returns the measured record."""
    import torch

    config, batch, segment = TRAINING_CONFIGS[config_name]
    torch.manual_seed(0)
    if implementation == "legacy":
        from transformers import TransfoXLLMHeadModel

        original_type_as = torch.Tensor.type_as  # transformers#29650: type_as(dtype=...) crashes

        def type_as(self, other=None, dtype=None):
            return self.to(dtype) if dtype is not None else original_type_as(self, other)

        torch.Tensor.type_as = type_as
        model = TransfoXLLMHeadModel.from_pretrained(folder)
    elif implementation == "gpt2_sdpa":
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel._from_config(gpt2_config(config, segment), attn_implementation="sdpa")
    else:
        from transformers import AutoModelForCausalLM

        import hf_txvariants  # noqa: F401

        txv_config = hf_txvariants.TransfoXLConfig(**config)
        model = AutoModelForCausalLM.from_config(txv_config)
    model.to(device).train()
    call = torch.compile(model) if implementation == "ours_compiled" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config["vocab_size"], (batch, segment), device=device)
    memory = {}
    extra = {"return_logits": False} if implementation.startswith("ours") else {}
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            output = call(ids, labels=ids, **extra, **memory)
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if implementation == "legacy":
            memory["mems"] = output.mems
        elif implementation.startswith("ours"):
            memory["cache"] = output.cache

    started = time.perf_counter()
    for _ in range(2):  # warm-up: the memory fills, the compiled graphs are made
        step()
    synchronize()
    warm_up = time.perf_counter() - started
    steps, started = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - started < time_limit:
        step()
        steps += 1
        if steps % 5 == 0:
            synchronize()
        if steps >= 200:
            break
    synchronize()
    seconds = (time.perf_counter() - started) / steps
    if implementation == "gpt2_sdpa":
        flops = 3 * gpt2_forward_flops(config, batch, segment)
    else:
        flops = 3 * forward_flops(config, batch, segment, ids[:, 1:].reshape(-1).cpu())
    return {
        "tokens_per_s": batch * segment / seconds,
        "step_ms": 1e3 * seconds,
        "tflops": flops / seconds / 1e12,
        "steps": steps,
        "warm_up_s": warm_up,
    }


def record(config_name: str, results: dict, peak_tflops: float) -> dict:
    config, batch, segment = TRAINING_CONFIGS[config_name]
    entry = {"config": config_name, "batch": batch, "segment": segment, "model": config, "peak_tflops": peak_tflops}
    for name, result in results.items():
        if "tflops" in result:
            result = {**result, "fraction_of_peak": result["tflops"] / peak_tflops}
        entry[name] = result
    return entry


def run(args) -> list[dict]:
    """Every (configuration, implementation) in its own process under `--step-limit-s`; the records."""
    records = []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for config_name in args.configs:
        config = TRAINING_CONFIGS[config_name][0]
        results = {}
        with tempfile.TemporaryDirectory() as folder:
            legacy_ready = False
            if args.legacy_python and "legacy" in args.implementations:
                made = subprocess.run(
                    [args.legacy_python, "-c", MAKE_LEGACY_CHECKPOINT.format(config=config), folder],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                legacy_ready = made.returncode == 0
            for implementation in args.implementations:
                if implementation == "legacy" and not legacy_ready:
                    results[implementation] = {"error": "no legacy interpreter (--legacy-python) or its checkpoint"}
                    continue
                python = args.legacy_python if implementation == "legacy" else sys.executable
                command = [python, __file__, "--worker", implementation, "--configs", config_name]
                command += ["--device", args.device, "--measure-s", str(args.measure_s), "--folder", folder]
                limit = args.compile_limit_s if implementation == "ours_compiled" else args.step_limit_s
                try:
                    completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=limit)
                except subprocess.TimeoutExpired:
                    results[implementation] = {"error": f"over the {limit} s limit"}
                    continue
                if completed.returncode != 0:
                    errors = [line for line in completed.stderr.splitlines() if "Error" in line]
                    results[implementation] = {"error": (errors or [f"exit {completed.returncode}"])[-1][:300]}
                else:
                    results[implementation] = json.loads(completed.stdout.strip().splitlines()[-1])
        records.append(record(config_name, results, args.peak_tflops))
        print(json.dumps(records[-1]), flush=True)
    return records


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--configs", nargs="+", choices=sorted(TRAINING_CONFIGS), default=["enwik8_base", "wt103_base", "nvidia_base"]
    )
    parser.add_argument("--implementations", nargs="+", choices=IMPLEMENTATIONS, default=list(IMPLEMENTATIONS))
    parser.add_argument("--legacy-python", help="interpreter with transformers==4.46.3 (the legacy rows fail without)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--peak-tflops", type=float, default=H100_DENSE_BF16_TFLOPS)
    parser.add_argument("--measure-s", type=float, default=4.0, help="timed training after the warm-up, per run")
    parser.add_argument(
        "--step-limit-s", type=float, default=25.0, help="each uncompiled run's limit, start-up included"
    )
    parser.add_argument("--compile-limit-s", type=float, default=80.0, help="the compiled run's limit (compilation)")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "gpu_training.json"))
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("peak_tflops", "measure_s", "step_limit_s", "compile_limit_s"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.measure_s >= min(args.step_limit_s, args.compile_limit_s):
        parser.error(
            f"--measure-s {args.measure_s} leaves no time to start within --step-limit-s {args.step_limit_s} "
            f"and --compile-limit-s {args.compile_limit_s}"
        )
    return args


def main(argv=None):
    args = parse_arguments(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.configs[0], args.device, args.measure_s, args.folder)))
        return
    records = run(args)
    output = Path(args.output)
    staging = output.with_name(output.name + ".partial")  # a failure leaves the previous file whole
    staging.write_text(json.dumps(records, indent=1) + "\n")
    staging.replace(output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
