"""`txv serve` (transformers' own server with the plugin's models) against `generate()` called directly: the latency of
one request, and the throughput of 8 concurrent ones.

The model: a Transformer-XL of bench_generation.py's size (d_model 256, 8 heads of 32, d_inner 1024, 4 layers) with a
character tokenizer of the embedded corpus (its vocabulary: every character of the corpus), memory 128, random weights
(speed does not depend on them), saved to a temporary folder. `txv serve FOLDER` runs in a subprocess on 127.0.0.1
with the same number of torch threads as this process, which calls `generate()` on the same folder. Every call is
greedy, `--prompt-tokens` characters of the corpus in, exactly `--new-tokens` out (no end-of-sequence token).

Cases, each timed in every round, in a random order per round (the machine's other jobs hit every case alike):
- served, one request: `completions.create` with the `openai` client, non-streamed; and streamed, to the first text
  and to the last;
- direct, one call: `model.generate()` of one row;
- served, 8 concurrent: 8 requests sent at once from 8 threads (transformers' server runs one `generate()` at a time
  per model, on its inference thread: the requests queue);
- direct, 8 in a row: 8 one-row `generate()` calls, which is what the server runs for them;
- direct, batch of 8: one `generate()` of 8 rows, the best `generate()` does for 8 prompts.
Reported: the median over rounds of each case's wall time, new tokens per second, and the served/direct ratios; also
the CPU time each case took (served: the server process's, all its threads, from /proc; direct: this process's), which
depends far less on the machine's other jobs than the wall time does; the served text against the direct one (greedy:
they must be equal); the machine's load (`uptime`) before and after.

    python benchmarks/bench_serve.py [--rounds 5] [--prompt-tokens 128] [--new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(hidden_size=256, num_attention_heads=8, head_dim=32, intermediate_size=1024, num_hidden_layers=4)
CONCURRENT = 8


def save_model(folder: Path, mem_len: int):
    import torch

    from hf_txvariants import TransfoXLConfig, TransfoXLLMHeadModel
    from hf_txvariants.training.data import build_char_tokenizer, default_corpus

    corpus = default_corpus()
    tokenizer = build_char_tokenizer(corpus)
    config = TransfoXLConfig(
        vocab_size=len(tokenizer),
        d_embed=SIZE["hidden_size"],
        cutoffs=[],
        mem_len=mem_len,
        dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
        **SIZE,
    )
    torch.manual_seed(0)
    TransfoXLLMHeadModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return corpus


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(folder: Path, threads: int, log: Path):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hf_txvariants.cli", "serve", str(folder), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--device", "cpu"]
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"txv serve exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.5)
    stop_server(process)
    raise SystemExit(f"txv serve did not answer within 300 s:\n{log.read_text()[-3000:]}")


def stop_server(process):
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=60)


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of process `pid` (all its threads), or of this process when None."""
    if pid is None:
        return time.process_time()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--mem-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, here and in the server")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    import openai
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    load_before = uptime()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        folder = Path(tmp) / "transfo-xl"
        corpus = save_model(folder, args.mem_len)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        prompts = [corpus[i * 1000 : i * 1000 + args.prompt_tokens] for i in range(CONCURRENT)]
        assert all(len(tokenizer(p)["input_ids"]) == args.prompt_tokens for p in prompts)
        rows = [tokenizer(p, return_tensors="pt")["input_ids"] for p in prompts]
        batch = torch.cat(rows)
        new = args.new_tokens

        def generate(ids):
            with torch.no_grad():
                return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)

        process, url = start_server(folder, args.threads, Path(tmp) / "server.log")
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600, max_retries=0)
            name = str(folder)

            def complete(prompt):
                answer = client.completions.create(model=name, prompt=prompt, max_tokens=new, temperature=0)
                assert answer.usage.completion_tokens == new, answer.usage
                return answer.choices[0].text

            def stream_times():
                start = time.perf_counter()
                first = None
                for chunk in client.completions.create(
                    model=name, prompt=prompts[0], max_tokens=new, temperature=0, stream=True
                ):
                    if first is None and chunk.choices and chunk.choices[0].text:
                        first = time.perf_counter() - start
                return first, time.perf_counter() - start

            # equal greedy texts, and warm-up of both sides
            served_text = complete(prompts[0])
            direct_text = tokenizer.decode(generate(rows[0])[0, args.prompt_tokens :], skip_special_tokens=True)
            same_text = served_text == direct_text

            def timed(function, cpu_pid):
                start, start_cpu = time.perf_counter(), cpu_seconds(cpu_pid)
                function()
                return time.perf_counter() - start, cpu_seconds(cpu_pid) - start_cpu

            streamed = {"served, streamed, first text": [], "served, streamed, last text": []}

            def stream_case():
                first, last = stream_times()
                streamed["served, streamed, first text"].append(first)
                streamed["served, streamed, last text"].append(last)

            pool = ThreadPoolExecutor(CONCURRENT)
            cases = {
                "served, one request": lambda: complete(prompts[0]),
                "direct, one call": lambda: generate(rows[0]),
                f"served, {CONCURRENT} concurrent": lambda: list(pool.map(complete, prompts)),
                f"direct, {CONCURRENT} in a row": lambda: [generate(row) for row in rows],
                f"direct, batch of {CONCURRENT}": lambda: generate(batch),
                "streamed": stream_case,
            }
            times = {case: [] for case in cases if case != "streamed"}
            cpu = {case: [] for case in cases}
            for _ in range(args.rounds):
                order = list(cases)
                random.shuffle(order)
                for case in order:
                    elapsed, cpu_time = timed(cases[case], None if case.startswith("direct") else process.pid)
                    cpu[case].append(cpu_time)
                    if case != "streamed":
                        times[case].append(elapsed)
            times.update(streamed)
            cpu["served, streamed, last text"] = cpu.pop("streamed")
            pool.shutdown()
            client.close()
        finally:
            stop_server(process)
    load_after = uptime()

    median = {case: statistics.median(values) for case, values in times.items()}
    eight = {f"served, {CONCURRENT} concurrent", f"direct, {CONCURRENT} in a row", f"direct, batch of {CONCURRENT}"}
    tokens = {case: (CONCURRENT if case in eight else 1) * new for case in median}
    print(
        f"Transformer-XL {SIZE}, mem_len {args.mem_len}, vocabulary {len(tokenizer)} (characters); prompt "
        f"{args.prompt_tokens} tokens, {new} new tokens, greedy; {args.threads} torch thread(s) in each process; "
        f"{args.rounds} rounds; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"openai {openai.__version__}"
    )
    print(f"load before: {load_before}")
    print(f"load after:  {load_after}")
    print(f"served text equals the direct generate() text: {same_text}")
    median_cpu = {case: statistics.median(values) for case, values in cpu.items()}
    print(f"{'case':34} {'median s':>9} {'new tokens/s':>13} {'CPU s':>7}")
    for case in median:
        rate = "-" if "first text" in case else f"{tokens[case] / median[case]:.1f}"
        cpu_time = f"{median_cpu[case]:.3f}" if case in median_cpu else "-"
        print(f"{case:34} {median[case]:9.3f} {rate:>13} {cpu_time:>7}")
    ratios = {
        "one request: served / direct time": median["served, one request"] / median["direct, one call"],
        f"{CONCURRENT} concurrent: served / direct in a row, time": median[f"served, {CONCURRENT} concurrent"]
        / median[f"direct, {CONCURRENT} in a row"],
        f"{CONCURRENT} concurrent: served / direct batch, time": median[f"served, {CONCURRENT} concurrent"]
        / median[f"direct, batch of {CONCURRENT}"],
    }
    ratios["one request: served / direct CPU time"] = median_cpu["served, one request"] / median_cpu["direct, one call"]
    for what, ratio in ratios.items():
        print(f"{what}: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"median_seconds": median, "median_cpu_seconds": median_cpu, "ratios": ratios, "same_text": same_text},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
