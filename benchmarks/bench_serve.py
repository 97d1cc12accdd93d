"""`txv serve` (transformers' own server with the plugin's models and its own batching) against `generate()` called
directly: the latency of one request, the throughput of 8 concurrent ones against the same 8 served one at a time and
one batched `generate()`; and, with `--load`, a bounded load test.

The model: a Transformer-XL of bench_generation.py's size (d_model 256, 8 heads of 32, d_inner 1024, 4 layers) with a
character tokenizer of the embedded corpus (its vocabulary: every character of the corpus), memory 128, random weights
(speed does not depend on them), saved to a temporary folder. `txv serve FOLDER` runs in a subprocess on 127.0.0.1
with the same number of torch threads as this process, which calls `generate()` on the same folder. Every call is
greedy, `--prompt-tokens` characters of the corpus in, exactly `--new-tokens` out (no end-of-sequence token).

Cases, each timed in every round, in a random order per round (the machine's other jobs hit every case alike):
- served, one request: `completions.create` with the `openai` client, non-streamed; and streamed, to the first text
  and to the last;
- direct, one call: `model.generate()` of one row;
- served, 8 concurrent: 8 requests sent at once from 8 threads (the server batches them);
- served, 8 one at a time: the same 8 requests, each sent when the one before is answered;
- direct, 8 in a row: 8 one-row `generate()` calls;
- direct, batch of 8: one `generate()` of 8 rows, the best `generate()` does for 8 prompts.
Reported: the median over rounds of each case's wall time, new tokens per second, and the ratios; also the CPU time
each case took (served: the server process's, all its threads, from /proc; direct: this process's), which depends far
less on the machine's other jobs than the wall time does; every served greedy text against the direct one (they must
be equal); the machine's load (`uptime`) before and after.

`--load`: `--clients` threads for `--seconds` seconds against one server with small limits, each sending, at random:
a good greedy request (one of 16 prompts, its answer checked against `generate()` of that prompt alone), a good
streamed request read to its end (checked too), a stream dropped after its first pieces, a sampled request with a
seed (checked against the same request served before the load), a bad request (a refused field or value, a body that
is not JSON), a request over a limit (new tokens, prompt length, body size) and, rarely, one that runs past its time
limit. Reported: the count of each kind and of each status, the 5xx (must be none), the wrong answers (must be none),
the server's resident memory (VmRSS) after a warm-up, at the end and 10 s after, and whether it still answers.

    python benchmarks/bench_serve.py [--rounds 5] [--prompt-tokens 128] [--new-tokens 64] [--threads 1]
        [--baseline-root CHECKOUT]  (also the `txv serve` of an earlier checkout: one request, 8 concurrent)
    python benchmarks/bench_serve.py --load [--clients 64] [--seconds 60]
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


def start_server(folder: Path, threads: int, log: Path, flags: tuple = (), root: Path = ROOT):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hf_txvariants.cli", "serve", str(folder), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--device", "cpu", *flags]
    with open(log, "w") as output:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT)
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


LOAD_LIMITS = {"--max-new-tokens": 100000, "--max-prompt-tokens": 256, "--max-body-bytes": 65536}
LOAD_TIMEOUT = 20  # --request-timeout of the load test's server
LOAD_BATCH = 32  # its --max-batch-size
LOAD_NEW_TOKENS = 16
LOAD_MIX = [  # (kind, weight)
    ("good", 40),
    ("good stream", 10),
    ("dropped stream", 10),
    ("seeded sample", 8),
    ("bad", 15),
    ("over a limit", 16),
    ("past the time limit", 1),
]
BAD_BODIES = [
    '{"prompt": "the", "max_tokens": 4, "n": 1000}',
    '{"prompt": "the", "max_tokens": 4, "top_p": 5}',
    '{"prompt": "the", "max_tokens": 4, "temperature": NaN}',
    '{"prompt": "the", "max_tokens": -3}',
    '{"prompt": "the", "max_tokens": 4, "logprobs": 2}',
    '{"prompt": "", "max_tokens": 4}',
    '{"prompt": "the", "max_tokens": 4',
    '{"max_tokens": 4}',
]


def http_post(url: str, body: str, timeout: float = 120):
    """(status, parsed JSON or None) of a POST to /v1/completions, on a connection of its own."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", body=body.encode(), headers={"content-type": "application/json"})
        answer = connection.getresponse()
        data = answer.read()
        try:
            return answer.status, json.loads(data)
        except ValueError:
            return answer.status, None
    finally:
        connection.close()


def http_stream(url: str, body: str, drop_after: int | None = None, timeout: float = 120):
    """(status, the text streamed) of a streamed completion, read to its end or dropped after `drop_after` events."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("POST", "/v1/completions", body=body.encode(), headers={"content-type": "application/json"})
        answer = connection.getresponse()
        if answer.status != 200:
            answer.read()
            return answer.status, None
        text, events = [], 0
        for line in answer:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = json.loads(line[6:])
            if "error" in payload:
                return "stream error", payload["error"]
            text.append(payload["choices"][0].get("text", ""))
            events += 1
            if drop_after is not None and events >= drop_after:
                return "dropped", None
        return answer.status, "".join(text)
    finally:
        connection.close()


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_test(args):
    import collections
    import threading

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    load_before = uptime()
    with tempfile.TemporaryDirectory(prefix="bench-serve-load-") as tmp:
        folder = Path(tmp) / "transfo-xl"
        corpus = save_model(folder, args.mem_len)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        prompts = [corpus[i * 997 : i * 997 + 16 + 2 * i] for i in range(16)]
        solo = {}
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=LOAD_NEW_TOKENS
                )
            solo[prompt] = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        flags = [str(part) for pair in LOAD_LIMITS.items() for part in pair]
        flags += ["--request-timeout", str(LOAD_TIMEOUT), "--max-batch-size", str(LOAD_BATCH)]
        process, url = start_server(folder, args.threads, Path(tmp) / "server.log", tuple(flags))
        try:

            def body(prompt, **fields):
                return json.dumps({"prompt": prompt, "max_tokens": LOAD_NEW_TOKENS, "temperature": 0, **fields})

            seeded = [body(prompt, temperature=1.0, top_p=0.9, seed=i) for i, prompt in enumerate(prompts[:4])]
            reference = {}
            for request in seeded:  # served alone, before the load
                status, answer = http_post(url, request)
                assert status == 200, answer
                reference[request] = answer["choices"][0]["text"]
            for prompt in prompts[:8]:  # warm-up; its answers checked too
                status, answer = http_post(url, body(prompt))
                assert status == 200 and answer["choices"][0]["text"] == solo[prompt], answer
            rss_start = resident_mib(process.pid)

            over = [
                body(prompts[0], max_tokens=LOAD_LIMITS["--max-new-tokens"] + 1),
                body(corpus[: LOAD_LIMITS["--max-prompt-tokens"] + 1]),
                body(prompts[0], user="x" * LOAD_LIMITS["--max-body-bytes"]),
            ]
            counts = collections.Counter()
            statuses = collections.Counter()
            wrong, server_errors = [], []
            lock = threading.Lock()
            stop_at = 0.0
            kinds, weights = zip(*LOAD_MIX)

            def client(index):
                chooser = random.Random(index)
                while time.monotonic() < stop_at:
                    kind = chooser.choices(kinds, weights)[0]
                    prompt = chooser.choice(prompts)
                    answer = text = None
                    try:
                        if kind == "good":
                            status, answer = http_post(url, body(prompt))
                            ok = status == 200 and answer["choices"][0]["text"] == solo[prompt]
                        elif kind == "good stream":
                            status, text = http_stream(url, body(prompt, stream=True))
                            ok = status == 200 and text == solo[prompt]
                        elif kind == "dropped stream":
                            long_body = body(prompt, stream=True, max_tokens=1024)
                            status, _ = http_stream(url, long_body, drop_after=chooser.randint(1, 4))
                            ok = status == "dropped"
                        elif kind == "seeded sample":
                            request = chooser.choice(seeded)
                            status, answer = http_post(url, request)
                            ok = status == 200 and answer["choices"][0]["text"] == reference[request]
                        elif kind == "bad":
                            status, answer = http_post(url, chooser.choice(BAD_BODIES))
                            ok = status in (400, 422)
                        elif kind == "over a limit":
                            status, answer = http_post(url, chooser.choice(over))
                            ok = status == 400 and "over the limit" in answer["error"]["message"]
                        else:
                            status, answer = http_post(url, body(prompt, max_tokens=LOAD_LIMITS["--max-new-tokens"]))
                            ok = status == 408
                    except OSError as error:
                        status, ok = f"connection error {type(error).__name__}", False
                    with lock:
                        counts[kind] += 1
                        statuses[(kind, status)] += 1
                        if isinstance(status, int) and status >= 500:
                            server_errors.append((kind, status))
                        elif not ok:
                            detail = answer if kind == "good" else (text if kind == "good stream" else None)
                            wrong.append((kind, status, str(detail)[:160]))

            started = time.monotonic()
            rss_halves = []
            for half in range(2):  # two halves: a leak grows in both, an allocator's high-water mark in the first
                stop_at = started + args.seconds * (half + 1) / 2
                threads = [threading.Thread(target=client, args=(2 * i + half,)) for i in range(args.clients)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                rss_halves.append(resident_mib(process.pid))
            took = time.monotonic() - started
            rss_end = rss_halves[-1]
            time.sleep(10)
            rss_settled = resident_mib(process.pid)
            status, answer = http_post(url, body(prompts[0]))
            still_answers = status == 200 and answer["choices"][0]["text"] == solo[prompts[0]]
        finally:
            stop_server(process)
    load_after = uptime()
    print(
        f"load test: {args.clients} clients for {args.seconds} s (all ended after {took:.1f} s), Transformer-XL "
        f"{SIZE}, mem_len {args.mem_len}; limits {LOAD_LIMITS}, --request-timeout {LOAD_TIMEOUT}, "
        f"--max-batch-size {LOAD_BATCH}; good requests: "
        f"16 prompts of 16-46 tokens, {LOAD_NEW_TOKENS} new tokens, greedy; {args.threads} torch thread(s); "
        f"torch {torch.__version__}, transformers {transformers.__version__}"
    )
    print(f"load before: {load_before}")
    print(f"load after:  {load_after}")
    print(f"{'kind':22} {'requests':>9}  statuses")
    for kind in kinds:
        seen = {str(status): n for (k, status), n in sorted(statuses.items(), key=str) if k == kind}
        print(f"{kind:22} {counts[kind]:9d}  {seen}")
    print(f"all requests: {sum(counts.values())}; 5xx: {len(server_errors)}; wrong answers: {len(wrong)} {wrong[:10]}")
    print(
        f"server VmRSS: {rss_start:.0f} MiB after the warm-up, {rss_halves[0]:.0f} MiB after the first half, "
        f"{rss_end:.0f} MiB at the end, {rss_settled:.0f} MiB 10 s later ({rss_settled - rss_start:+.0f} MiB)"
    )
    print(f"the server still answers (a good request, checked): {still_answers}")
    if server_errors or wrong or not still_answers:
        raise SystemExit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--mem-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, here and in the server")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument(
        "--baseline-root",
        type=Path,
        help="a checkout of an earlier hf-txvariants (e.g. `git archive 684dded`): its `txv serve` is timed too, one "
        "request and 8 concurrent, in the same rounds",
    )
    parser.add_argument("--load", action="store_true", help="run the load test instead")
    parser.add_argument("--clients", type=int, default=64, help="--load: concurrent clients")
    parser.add_argument("--seconds", type=float, default=60, help="--load: how long the clients send requests")
    args = parser.parse_args()
    if args.load:
        return load_test(args)

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
        baseline = None
        if args.baseline_root is not None:
            baseline = start_server(folder, args.threads, Path(tmp) / "baseline.log", root=args.baseline_root.resolve())
        try:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600, max_retries=0)
            name = str(folder)

            served_texts = {}

            def complete(prompt):
                answer = client.completions.create(model=name, prompt=prompt, max_tokens=new, temperature=0)
                assert answer.usage.completion_tokens == new, answer.usage
                served_texts.setdefault(prompt, set()).add(answer.choices[0].text)
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
            complete(prompts[0])
            direct_texts = {
                prompt: tokenizer.decode(generate(row)[0, args.prompt_tokens :], skip_special_tokens=True)
                for prompt, row in zip(prompts, rows)
            }

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
                f"served, {CONCURRENT} one at a time": lambda: [complete(prompt) for prompt in prompts],
                f"direct, {CONCURRENT} in a row": lambda: [generate(row) for row in rows],
                f"direct, batch of {CONCURRENT}": lambda: generate(batch),
                "streamed": stream_case,
            }
            if baseline is not None:
                old_client = openai.OpenAI(base_url=f"{baseline[1]}/v1", api_key="unused", timeout=600, max_retries=0)

                def old_complete(prompt):
                    answer = old_client.completions.create(model=name, prompt=prompt, max_tokens=new, temperature=0)
                    assert answer.choices[0].text == direct_texts[prompt]
                    return answer

                old_complete(prompts[0])
                cases["previous server, one request"] = lambda: old_complete(prompts[0])
                cases[f"previous server, {CONCURRENT} concurrent"] = lambda: list(pool.map(old_complete, prompts))
            times = {case: [] for case in cases if case != "streamed"}
            cpu = {case: [] for case in cases}
            for _ in range(args.rounds):
                order = list(cases)
                random.shuffle(order)
                for case in order:
                    pid = baseline[0].pid if case.startswith("previous") else process.pid
                    elapsed, cpu_time = timed(cases[case], None if case.startswith("direct") else pid)
                    cpu[case].append(cpu_time)
                    if case != "streamed":
                        times[case].append(elapsed)
            same_text = all(served_texts[prompt] == {direct_texts[prompt]} for prompt in prompts)
            times.update(streamed)
            cpu["served, streamed, last text"] = cpu.pop("streamed")
            pool.shutdown()
            client.close()
        finally:
            stop_server(process)
            if baseline is not None:
                stop_server(baseline[0])
    load_after = uptime()

    median = {case: statistics.median(values) for case, values in times.items()}
    eight = {f"served, {CONCURRENT} concurrent", f"served, {CONCURRENT} one at a time"}
    eight |= {f"previous server, {CONCURRENT} concurrent"}
    eight |= {f"direct, {CONCURRENT} in a row", f"direct, batch of {CONCURRENT}"}
    tokens = {case: (CONCURRENT if case in eight else 1) * new for case in median}
    print(
        f"Transformer-XL {SIZE}, mem_len {args.mem_len}, vocabulary {len(tokenizer)} (characters); prompt "
        f"{args.prompt_tokens} tokens, {new} new tokens, greedy; {args.threads} torch thread(s) in each process; "
        f"{args.rounds} rounds; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"openai {openai.__version__}"
    )
    print(f"load before: {load_before}")
    print(f"load after:  {load_after}")
    print(f"every served text (every round, every case) equals the direct generate() text of its prompt: {same_text}")
    median_cpu = {case: statistics.median(values) for case, values in cpu.items()}
    print(f"{'case':34} {'median s':>9} {'new tokens/s':>13} {'CPU s':>7}")
    for case in median:
        rate = "-" if "first text" in case else f"{tokens[case] / median[case]:.1f}"
        cpu_time = f"{median_cpu[case]:.3f}" if case in median_cpu else "-"
        print(f"{case:34} {median[case]:9.3f} {rate:>13} {cpu_time:>7}")
    ratios = {
        "one request: served / direct time": median["served, one request"] / median["direct, one call"],
        f"{CONCURRENT} served one at a time / {CONCURRENT} served concurrent, time (the batching speed-up)": median[
            f"served, {CONCURRENT} one at a time"
        ]
        / median[f"served, {CONCURRENT} concurrent"],
        f"{CONCURRENT} concurrent: served / direct in a row, time": median[f"served, {CONCURRENT} concurrent"]
        / median[f"direct, {CONCURRENT} in a row"],
        f"{CONCURRENT} concurrent: served / direct batch, time": median[f"served, {CONCURRENT} concurrent"]
        / median[f"direct, batch of {CONCURRENT}"],
    }
    ratios["one request: served / direct CPU time"] = median_cpu["served, one request"] / median_cpu["direct, one call"]
    if "previous server, one request" in median:
        ratios["one request: served / previous server, time"] = (
            median["served, one request"] / median["previous server, one request"]
        )
        ratios["one request: served / previous server, CPU time"] = (
            median_cpu["served, one request"] / median_cpu["previous server, one request"]
        )
        ratios[f"{CONCURRENT} concurrent: previous server / served, time"] = (
            median[f"previous server, {CONCURRENT} concurrent"] / median[f"served, {CONCURRENT} concurrent"]
        )
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
