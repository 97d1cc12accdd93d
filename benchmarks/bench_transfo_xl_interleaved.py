"""Transformer-XL vs transformers 4.46.3's TransfoXL on a shared CPU: the implementations interleaved call by call.

`bench_transfo_xl.py` runs each implementation in its own process one after the other; when other jobs share the
machine, a burst of load can hit one process and not the other. Here one worker process per implementation loads the
model (same weights, config `small` of bench_transfo_xl), warms up, and then waits; the controller asks the workers in
turn (random order each round) for one evaluation call (with memory, no_grad, labels given) or one training step
(fwd + bwd + SGD, memory carried), so every implementation sees the same load. Reported per implementation: tokens/s
from the fastest call (wall clock), from the median call, and from the smallest process CPU time of a call (with one
thread, the CPU time hardly depends on the other jobs), and the ratios to the legacy model.

    python benchmarks/bench_transfo_xl_interleaved.py --legacy-python /tmp/legacy/bin/python [--threads 1]
        [--code-roots /tmp/old_checkout ...] [--rounds 10] [--compile] [--flex]

`--code-roots` adds other checkouts of this repository (folders holding `hf_txvariants/`, e.g. `git archive` of an
older commit) as further implementations, to compare code versions in the same run. `--compile` adds this checkout's
model wrapped in torch.compile (the default backend, inductor) as one more implementation, beside the uncompiled one;
`--flex` adds it with `attn_implementation="flex_attention"` (and, with `--compile`, compiled too): evaluation only,
torch 2.13 has no FlexAttention backward on CPU.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfo_xl import CONFIGS, MAKE_LEGACY_CHECKPOINT  # noqa: E402

LEGACY = "legacy"


def load(implementation: str, folder: str, attn_implementation: str | None = None):
    """The model, the extra forward arguments and how to pass the memory of an output to the next call."""
    import torch

    if implementation == LEGACY:
        from transformers import TransfoXLLMHeadModel

        if not getattr(torch.Tensor, "_type_as_patched", False):  # transformers#29650: type_as(dtype=...) crashes
            original_type_as = torch.Tensor.type_as
            torch.Tensor.type_as = lambda self, other=None, dtype=None: (
                self.to(dtype) if dtype is not None else original_type_as(self, other)
            )
            torch.Tensor._type_as_patched = True
        model = TransfoXLLMHeadModel.from_pretrained(folder)
        model.crit.keep_order = True
        return model, {}, lambda output: {"mems": output.mems}
    from transformers import AutoModelForCausalLM

    import hf_txvariants  # noqa: F401

    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(folder, **options)
    # with labels the legacy model returns only the losses; ours skips the log-probabilities when told (if it can)
    arguments = (*inspect.signature(model.forward).parameters, *getattr(model, "head_options", ()))
    extra = {"return_logits": False} if "return_logits" in arguments else {}
    return model, extra, lambda output: {"cache": output.cache}


# this checkout's variants (`--compile`, `--flex`): the name's suffix -> (compiled, attn_implementation, phases)
VARIANTS = {
    "": (False, None, ("eval", "train")),
    "+compile": (True, None, ("eval", "train")),
    "+flex": (False, "flex_attention", ("eval",)),
    "+flex+compile": (True, "flex_attention", ("eval",)),
}


def split_variant(name: str) -> tuple[str, str]:
    """(checkout folder, variant suffix) of an implementation's name."""
    for suffix in sorted(VARIANTS, key=len, reverse=True):
        if suffix and name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def worker(implementation: str, folder: str, threads: int):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    compiled, attn_implementation, phases = VARIANTS[split_variant(implementation)[1]]
    # two copies: the training steps change the weights, the evaluation copy keeps its own
    eval_model, extra, memory_of = load(implementation, folder, attn_implementation)
    train_model, _, _ = load(implementation, folder, attn_implementation)
    eval_call, train_call = eval_model, train_model
    if compiled:
        eval_call, train_call = torch.compile(eval_model), torch.compile(train_model)
    config, batch, segment = CONFIGS["small"]
    ids = torch.randint(0, config["vocab_size"], (batch, segment))
    eval_model.eval()
    with torch.no_grad():
        eval_memory = memory_of(eval_call(ids, labels=ids, **extra))
    train_model.train()
    optimizer = torch.optim.SGD(train_model.parameters(), lr=1e-4)
    train_memory = memory_of(train_call(ids, labels=ids, **extra)) if "train" in phases else None

    def evaluate():
        with torch.no_grad():
            eval_call(ids, labels=ids, **extra, **eval_memory)

    def train():
        train_call(ids, labels=ids, **extra, **train_memory).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    calls = {phase: {"eval": evaluate, "train": train}[phase] for phase in phases}
    for call in calls.values():  # warm-up (and compilation)
        call()
        call()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        calls[line.strip()]()
        print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", required=True, help="interpreter with transformers==4.46.3 and torch")
    parser.add_argument("--code-roots", nargs="*", default=[], help="other checkouts to time as well")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--phases", nargs="+", choices=["eval", "train"], default=["eval", "train"])
    parser.add_argument("--compile", action="store_true", help="this checkout compiled too (torch.compile)")
    parser.add_argument("--flex", action="store_true", help="this checkout with flex_attention too (evaluation)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.worker != LEGACY:
            sys.path.insert(0, split_variant(args.worker)[0])
        worker(args.worker, args.folder, args.threads)
        return

    this_checkout = str(Path(__file__).resolve().parents[1])
    implementations = [LEGACY, *args.code_roots, this_checkout]
    implementations += [this_checkout + "+compile"] if args.compile else []
    implementations += [this_checkout + "+flex"] if args.flex else []
    implementations += [this_checkout + "+flex+compile"] if args.flex and args.compile else []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    config, batch, segment = CONFIGS["small"]
    tokens = batch * segment

    def runs(name: str, phase: str) -> bool:
        return name == LEGACY or phase in VARIANTS[split_variant(name)[1]][2]

    times = {name: {phase: [] for phase in args.phases if runs(name, phase)} for name in implementations}
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(
            [args.legacy_python, "-c", MAKE_LEGACY_CHECKPOINT.format(config=config), folder],
            check=True,
            capture_output=True,
        )
        workers = {}
        for name in implementations:  # started one at a time: no set-up overlaps another's timing
            python = args.legacy_python if name == LEGACY else sys.executable
            command = [python, __file__, "--worker", name, "--folder", folder, "--threads", str(args.threads)]
            command += ["--legacy-python", args.legacy_python]
            workers[name] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            while (line := workers[name].stdout.readline().strip()) != "ready":
                if not line and workers[name].poll() is not None:
                    raise SystemExit(f"the worker for {name} failed")
        for _ in range(args.rounds):
            for phase in args.phases:
                order = [name for name in implementations if runs(name, phase)]
                random.shuffle(order)
                for name in order:
                    workers[name].stdin.write(phase + "\n")
                    workers[name].stdin.flush()
                    times[name][phase].append(json.loads(workers[name].stdout.readline()))
        for process in workers.values():
            process.stdin.write("quit\n")
            process.stdin.flush()
            process.wait()

    print(
        f"config small, batch {batch} x segment {segment}, {args.threads} thread(s), {args.rounds} rounds"
        f", load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(
        "| measure | implementation | tokens/s, fastest call | median call | from CPU time | ratio (fastest) |"
        " ratio (CPU time) |"
    )
    print("|---|---|---|---|---|---|---|")
    label = {"eval": "evaluation with memory", "train": "training step"}
    for phase in args.phases:
        legacy_wall = min(wall for wall, _ in times[LEGACY][phase])
        legacy_cpu = min(cpu for _, cpu in times[LEGACY][phase])
        for name in implementations:
            if phase not in times[name]:
                continue
            walls = [wall for wall, _ in times[name][phase]]
            cpus = [cpu for _, cpu in times[name][phase]]
            root, suffix = split_variant(name)
            shown = "transformers 4.46.3" if name == LEGACY else ("this checkout" if root == this_checkout else root)
            shown += suffix.replace("+compile", " + torch.compile").replace("+flex", " + flex_attention")
            print(
                f"| {label[phase]} | {shown} | {tokens / min(walls):.0f} | {tokens / statistics.median(walls):.0f} |"
                f" {tokens / min(cpus):.0f} | {legacy_wall / min(walls):.2f}x | {legacy_cpu / min(cpus):.2f}x |"
            )


if __name__ == "__main__":
    main()
