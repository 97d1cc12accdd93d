"""Generating one token at a time (issue 26): greedy `generate()` of our XL-family models against transformers' GPT-2
of the same size with its key/value cache and against transformers 4.46.3's TransfoXL (the same weights as our
Transformer-XL), and GTrXL acting one step per call against a GRU policy of matched size.

Same size for every model: vocabulary 10,000, d_model 256, 8 heads of 32, d_inner 1024, 4 layers; Transformer-XL with
the adaptive softmax (cutoffs [2000, 5000], div_val 2). Equal context: every XL model remembers prompt + new tokens
(mem_len = 256 for the 128-token prompt, as in the issue), so its last step attends to as many positions as GPT-2's.

One worker process per implementation (ours and GPT-2 in this interpreter, the legacy model in `--legacy-python`)
loads its model once, warms up, then waits; the controller asks the workers in turn (random order each round) for one
`generate()` of `--new-tokens` tokens per case, so every implementation sees the same load. Reported per case: new
tokens/s from the fastest call by wall clock and by the process CPU time of the call (with one thread the CPU time
hardly depends on the other jobs of a shared machine), the ratios to GPT-2, the machine's load (`uptime`) before and
after, and whether our Transformer-XL generated exactly the legacy model's tokens.

    python benchmarks/bench_generation.py --legacy-python /tmp/legacy/bin/python            # a few minutes
    python benchmarks/bench_generation.py --legacy-python /tmp/legacy/bin/python --full     # the whole grid
        [--prompts 128 1024] [--batches 1 8] [--models transfo-xl gtrxl adaptive-span] [--rounds 3] [--threads 1]
        [--device cpu|cuda] [--acting-only | --no-acting] [--code-roots /tmp/older_checkout ...]

The legacy interpreter needs torch and transformers==4.46.3 (`python -m venv /tmp/legacy && /tmp/legacy/bin/pip
install torch==2.13.0 transformers==4.46.3 sacremoses`); its TransfoXL needs the run-time patch of transformers#29650
(applied here, in the worker, as the repository's fixture scripts do). Without `--legacy-python` the legacy rows are
left out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZE = dict(vocab_size=10000, d_model=256, n_head=8, d_head=32, d_inner=1024, n_layer=4)
TRANSFO_XL = dict(**SIZE, cutoffs=[2000, 5000], div_val=2, d_embed=256, clamp_len=1000, dropout=0.0, dropatt=0.0)
GPT2 = "gpt2 (KV cache)"
LEGACY = "transfo-xl 4.46.3"
ROOT = Path(__file__).resolve().parents[1]
OURS = {"transfo-xl": "our transfo-xl", "gtrxl": "our gtrxl", "adaptive-span": "our adaptive-span"}

MAKE_LEGACY_CHECKPOINT = """
import sys, torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel
torch.manual_seed(0)
TransfoXLLMHeadModel(TransfoXLConfig(**{config}, mem_len=256)).save_pretrained(sys.argv[1])
"""


def patch_legacy_type_as(torch):
    """transformers#29650: the legacy forward calls `type_as(dtype=...)`, which torch refuses; `.to(dtype)` meant."""
    if not getattr(torch.Tensor, "_type_as_patched", False):
        original_type_as = torch.Tensor.type_as
        torch.Tensor.type_as = lambda self, other=None, dtype=None: (
            self.to(dtype) if dtype is not None else original_type_as(self, other)
        )
        torch.Tensor._type_as_patched = True


def load_generator(name: str, folder: str, device: str):
    """The model of implementation `name` and how to set its memory length (None: no memory)."""
    import torch

    torch.manual_seed(0)
    if name == LEGACY:
        patch_legacy_type_as(torch)
        from transformers import TransfoXLLMHeadModel

        model = TransfoXLLMHeadModel.from_pretrained(folder)
        return model.to(device).eval(), model.reset_memory_length
    if name == GPT2:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=SIZE["vocab_size"],
            n_embd=SIZE["d_model"],
            n_head=SIZE["n_head"],
            n_layer=SIZE["n_layer"],
            n_inner=SIZE["d_inner"],
            n_positions=4096,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
        return GPT2LMHeadModel(config).to(device).eval(), None
    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_txvariants  # noqa: F401

    if name.startswith(OURS["transfo-xl"]):  # this checkout's, or that of another `--code-roots` checkout
        model = AutoModelForCausalLM.from_pretrained(folder)  # the legacy checkpoint: the same weights
    else:
        model_type = {OURS["gtrxl"]: "txv_gtrxl", OURS["adaptive-span"]: "txv_adaptive_span"}[name]
        extra = {"attn_span": 4096, "adapt_span_enabled": True} if model_type == "txv_adaptive_span" else {}
        config = AutoConfig.for_model(
            model_type,
            vocab_size=SIZE["vocab_size"],
            hidden_size=SIZE["d_model"],
            num_attention_heads=SIZE["n_head"],
            head_dim=SIZE["d_head"],
            intermediate_size=SIZE["d_inner"],
            num_hidden_layers=SIZE["n_layer"],
            dropout=0.0,
            **extra,
        )
        model = AutoModelForCausalLM.from_config(config)

    def set_memory_length(length: int):
        model.config.mem_len = length

    return model.to(device).eval(), set_memory_length


def prompt_ids(prompt: int, batch: int):
    import torch

    generator = torch.Generator().manual_seed(1000 * prompt + batch)
    return torch.randint(0, SIZE["vocab_size"], (batch, prompt), generator=generator)


def generation_worker(name: str, folder: str, threads: int, device: str, new_tokens: int):
    import torch

    torch.set_num_threads(threads)
    model, set_memory_length = load_generator(name, folder, device)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def generate(prompt: int, batch: int):
        if set_memory_length is not None:
            set_memory_length(prompt + new_tokens)  # equal context: the last step sees every position
        ids = prompt_ids(prompt, batch).to(device)
        with torch.no_grad():
            return model.generate(
                ids,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )

    generate(16, 1)  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        prompt, batch = map(int, line.split())
        synchronize()
        wall, cpu = time.perf_counter(), time.process_time()
        output = generate(prompt, batch)
        synchronize()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps([wall, cpu, output[:, prompt:].tolist()]), flush=True)


def start_worker(command: list[str], env) -> subprocess.Popen:
    worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    while (line := worker.stdout.readline().strip()) != "ready":
        if not line and worker.poll() is not None:
            raise SystemExit(f"a worker failed: {' '.join(command)}")
    return worker


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def run_generation(args) -> list[dict]:
    names = [OURS[model] for model in args.models] + [GPT2] + ([LEGACY] if args.legacy_python else [])
    names += [f"{OURS['transfo-xl']} @ {root}" for root in args.code_roots]
    cases = [(prompt, batch) for prompt in args.prompts for batch in args.batches]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
    times = {(name, case): [] for name in names for case in cases}
    tokens = {}
    with tempfile.TemporaryDirectory() as folder:
        # the Transformer-XL checkpoint both implementations load: saved by the legacy model (ours when there is none)
        maker = (
            MAKE_LEGACY_CHECKPOINT
            if args.legacy_python
            else MAKE_LEGACY_CHECKPOINT.replace(
                "from transformers import", "import hf_txvariants\nfrom hf_txvariants import"
            )
        )
        subprocess.run(
            [args.legacy_python or sys.executable, "-c", maker.format(config=TRANSFO_XL), folder],
            check=True,
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        workers = {}
        for name in names:  # started one at a time: no set-up overlaps another's timing
            python = args.legacy_python if name == LEGACY else sys.executable
            command = [
                python,
                __file__,
                "--worker",
                name,
                "--folder",
                folder,
                "--threads",
                str(args.threads),
                "--device",
                args.device,
                "--new-tokens",
                str(args.new_tokens),
            ]
            workers[name] = start_worker(command, env)
        for _ in range(args.rounds):
            for case in cases:
                order = list(names)
                random.shuffle(order)
                for name in order:
                    workers[name].stdin.write(f"{case[0]} {case[1]}\n")
                    workers[name].stdin.flush()
                    wall, cpu, generated = json.loads(workers[name].stdout.readline())
                    times[name, case].append((wall, cpu))
                    tokens[name, case] = generated
        for worker in workers.values():
            worker.stdin.write("quit\n")
            worker.stdin.flush()
            worker.wait()
    rows = []
    for case in cases:
        prompt, batch = case
        new = batch * args.new_tokens
        reference = min(times[GPT2, case], key=lambda t: t[0]), min(times[GPT2, case], key=lambda t: t[1])
        for name in names:
            best_wall = min(wall for wall, _ in times[name, case])
            best_cpu = min(cpu for _, cpu in times[name, case])
            median_wall = statistics.median(wall for wall, _ in times[name, case])
            row = {
                "prompt": prompt,
                "batch": batch,
                "model": name,
                "tokens_per_s_wall": new / best_wall,
                "tokens_per_s_cpu": new / best_cpu,
                "tokens_per_s_median_wall": new / median_wall,
                "vs_gpt2_wall": reference[0][0] / best_wall,
                "vs_gpt2_cpu": reference[1][1] / best_cpu,
            }
            if name.startswith(OURS["transfo-xl"]) and (LEGACY, case) in tokens:
                row["same_tokens_as_legacy"] = tokens[name, case] == tokens[LEGACY, case]
            rows.append(row)
    return rows


def acting_worker(threads: int, device: str, envs: int, mem_len: int, steps: int, rounds: int):
    """GTrXL (`inputs_embeds`, the memory carried, `episode_starts` where an episode ended) against a GRU of matched
    parameter count, one step per call for `envs` environments, interleaved call batch by call batch."""
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModel

    import hf_txvariants  # noqa: F401
    from hf_txvariants.txv_compat import output_cache

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "txv_gtrxl",
        vocab_size=16,
        hidden_size=SIZE["d_model"],
        num_attention_heads=SIZE["n_head"],
        head_dim=SIZE["d_head"],
        intermediate_size=SIZE["d_inner"],
        num_hidden_layers=SIZE["n_layer"],
        mem_len=mem_len,
    )
    gtrxl = AutoModel.from_config(config).to(device).eval()
    body = sum(p.numel() for name, p in gtrxl.named_parameters() if "embed" not in name)
    # the GRU width whose n_layer layers have as many parameters as the GTrXL body (embedding aside)
    layers = SIZE["n_layer"]

    def gru_size(width: int) -> int:  # per layer: W_ih [3h, input], W_hh [3h, h] and two biases [3h]
        return 3 * width * (SIZE["d_model"] + width + 2) + (layers - 1) * 3 * width * (2 * width + 2)

    width = min(range(16, 4096), key=lambda h: abs(gru_size(h) - body))
    gru = nn.GRU(SIZE["d_model"], width, num_layers=layers, batch_first=True).to(device).eval()
    gru_parameters = sum(p.numel() for p in gru.parameters())
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    observations = torch.randn(steps, envs, 1, SIZE["d_model"], generator=generator).to(device)
    done = (torch.rand(steps, envs, 1, generator=generator) < 0.01).to(device)  # episodes end now and then

    def act_gtrxl(memory):
        for step in range(steps):
            output = gtrxl(inputs_embeds=observations[step], cache=memory, episode_starts=done[step])
            memory = output_cache(output)
        return memory

    def act_gru(state):
        for step in range(steps):
            state = state * ~done[step].view(1, envs, 1)
            _, state = gru(observations[step], state)
        return state

    with torch.no_grad():
        memory = None
        while memory is None or memory.memory_length < mem_len:  # a full memory: the steady state of acting
            memory = act_gtrxl(memory)
        state = act_gru(torch.zeros(layers, envs, width, device=device))
        times = {"gtrxl": [], "gru": []}
        for _ in range(rounds):
            for name in random.sample(list(times), 2):
                synchronize()
                wall, cpu = time.perf_counter(), time.process_time()
                if name == "gtrxl":
                    memory = act_gtrxl(memory)
                else:
                    state = act_gru(state)
                synchronize()
                times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    best = {name: (min(w for w, _ in t), min(c for _, c in t)) for name, t in times.items()}
    print(
        json.dumps(
            {
                "envs": envs,
                "mem_len": mem_len,
                "gtrxl_parameters": body,
                "gru_width": width,
                "gru_parameters": gru_parameters,
                **{f"{name}_steps_per_s_wall": steps / wall for name, (wall, _) in best.items()},
                **{f"{name}_steps_per_s_cpu": steps / cpu for name, (_, cpu) in best.items()},
                "gtrxl_vs_gru_wall": best["gru"][0] / best["gtrxl"][0],
                "gtrxl_vs_gru_cpu": best["gru"][1] / best["gtrxl"][1],
            }
        ),
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", help="interpreter with transformers==4.46.3 and torch")
    parser.add_argument("--full", action="store_true", help="prompts 128 and 1024, batches 1 and 8, every XL model")
    parser.add_argument("--prompts", type=int, nargs="+", default=[128])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--models", nargs="+", choices=sorted(OURS), default=["transfo-xl"])
    parser.add_argument(
        "--code-roots",
        nargs="*",
        default=[],
        help="other checkouts (folders holding hf_txvariants/) whose Transformer-XL is timed as well",
    )
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--acting-envs", type=int, default=16)
    parser.add_argument("--acting-mem-len", type=int, default=256)
    parser.add_argument("--acting-steps", type=int, default=64, help="steps per timed call batch")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--acting-only", action="store_true")
    group.add_argument("--no-acting", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "acting":
        acting_worker(args.threads, args.device, args.acting_envs, args.acting_mem_len, args.acting_steps, args.rounds)
        return
    if args.worker:
        if args.worker != LEGACY:
            root = args.worker.split(" @ ")[1] if " @ " in args.worker else str(ROOT)
            sys.path.insert(0, root)
        generation_worker(args.worker, args.folder, args.threads, args.device, args.new_tokens)
        return
    if args.full:
        args.prompts, args.batches, args.models = [128, 1024], [1, 8], sorted(OURS)
    print(f"load average before: {load_average()}; {args.threads} thread(s), device {args.device}", flush=True)
    if not args.acting_only:
        print(
            "| prompt | batch | model | new tokens/s (best wall) | (best CPU time) | (median wall) | vs GPT-2 wall | "
            "vs GPT-2 CPU | same tokens as 4.46.3 |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for row in run_generation(args):
            same = {True: "yes", False: "NO"}.get(row.get("same_tokens_as_legacy"), "")
            print(
                f"| {row['prompt']} | {row['batch']} | {row['model']} | {row['tokens_per_s_wall']:.1f} | "
                f"{row['tokens_per_s_cpu']:.1f} | {row['tokens_per_s_median_wall']:.1f} | "
                f"{row['vs_gpt2_wall']:.2f}x | {row['vs_gpt2_cpu']:.2f}x | {same} |",
                flush=True,
            )
    if not args.no_acting:
        command = [
            sys.executable,
            __file__,
            "--worker",
            "acting",
            "--threads",
            str(args.threads),
            "--device",
            args.device,
            "--acting-envs",
            str(args.acting_envs),
            "--acting-mem-len",
            str(args.acting_mem_len),
            "--acting-steps",
            str(args.acting_steps),
            "--rounds",
            str(args.rounds),
        ]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout)
        print(
            f"\nGTrXL acting, {result['envs']} environments, one step per call, mem_len {result['mem_len']} "
            f"(body {result['gtrxl_parameters']:,} parameters) vs a {SIZE['n_layer']}-layer GRU of width "
            f"{result['gru_width']} ({result['gru_parameters']:,} parameters):"
        )
        print(
            f"GTrXL {result['gtrxl_steps_per_s_wall']:.1f} steps/s (best wall), {result['gtrxl_steps_per_s_cpu']:.1f}"
            f" (best CPU time); GRU {result['gru_steps_per_s_wall']:.1f} / {result['gru_steps_per_s_cpu']:.1f}; "
            f"GTrXL / GRU {result['gtrxl_vs_gru_wall']:.2f}x wall, {result['gtrxl_vs_gru_cpu']:.2f}x CPU time"
        )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
