"""Our Reformer (txv_reformer) against transformers' ReformerModelWithLMHead on the same config and weights: time
and peak memory of a training step (forward + backward) and of a forward pass, on CPU or CUDA; and the peak training
memory of a 12-layer reversible model against a 1-layer one (and against 12 layers with stored activations).

    python benchmarks/bench_reformer.py
    python benchmarks/bench_reformer.py --length 1024 --repeats 1
    python benchmarks/bench_reformer.py --device cuda --length 16384

Peak memory, CPU: the growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) during
the call, with glibc's mmap threshold fixed so that freed tensors go back to the OS; CUDA: `max_memory_allocated`
above the memory held before the call. fp32 on both.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.execv(sys.executable, [sys.executable, *sys.argv])

import torch  # noqa: E402
from transformers import ReformerConfig, ReformerModelWithLMHead  # noqa: E402
from transformers.utils import logging  # noqa: E402

from hf_txvariants import TxvReformerConfig, TxvReformerForCausalLM  # noqa: E402

logging.set_verbosity_error()


def _kib(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def measure(function, repeats, device):
    """Best time of `repeats` calls after a warm-up, and the peak memory (MiB) one call adds."""
    on_gpu = device.type == "cuda"
    gc.collect()
    function()
    best = float("inf")
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if on_gpu:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        function()
        torch.cuda.synchronize()
        return best, (torch.cuda.max_memory_allocated() - base) / 2**20
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    base = _kib("VmRSS")
    function()
    return best, max(0, _kib("VmHWM") - base) / 1024


def config_kwargs(length, layers):
    side = 2 ** (length.bit_length() // 2)  # axial factors: a power of 2 near sqrt(L); L a power of 2
    return dict(
        vocab_size=256,
        hidden_size=128,
        num_attention_heads=2,
        attention_head_size=64,
        feed_forward_size=256,
        attn_layers=layers,
        axial_pos_shape=[length // side, side],
        axial_pos_embds_dim=[64, 64],
        max_position_embeddings=length,
        lsh_attn_chunk_length=64,
        local_attn_chunk_length=64,
        num_buckets=max(2, 2 * length // 64 // 2),
        num_hashes=2,
        hash_seed=0,
        is_decoder=True,
        hidden_dropout_prob=0.0,
        local_attention_probs_dropout_prob=0.0,
        lsh_attention_probs_dropout_prob=0.0,
        use_cache=False,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    length = args.length
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {device} ({name}), L = {length}, batch 1, fp32")
    layers = ["local", "lsh"] * 3
    torch.manual_seed(0)
    theirs = ReformerModelWithLMHead(ReformerConfig(**config_kwargs(length, layers)))
    ours = TxvReformerForCausalLM(TxvReformerConfig(**config_kwargs(length, layers)))
    missing = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert not missing.missing_keys, missing.missing_keys
    theirs.to(device)
    ours.to(device)
    ids = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(0)).to(device)

    def step(model):
        def run():
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()

        return run

    def forward(model):
        def run():
            with torch.no_grad():
                model(input_ids=ids)

        return run

    for model in (theirs, ours):
        model.train()
    loss_theirs = theirs(input_ids=ids, labels=ids).loss.item()
    loss_ours = ours(input_ids=ids, labels=ids).loss.item()
    print(f"same weights, hash seed fixed: training loss transformers {loss_theirs:.6f}, ours {loss_ours:.6f}")
    print("| measurement | transformers ReformerModelWithLMHead | txv_reformer | ratio (ours / theirs) |")
    print("|---|---|---|---|")
    t_theirs, m_theirs = measure(step(theirs), args.repeats, device)
    t_ours, m_ours = measure(step(ours), args.repeats, device)
    print(f"| training step time (s), 6 layers | {t_theirs:.2f} | {t_ours:.2f} | {t_ours / t_theirs:.2f} |")
    print(f"| training step peak MiB, 6 layers | {m_theirs:.0f} | {m_ours:.0f} | {m_ours / max(m_theirs, 1e-9):.2f} |")
    for model in (theirs, ours):
        model.eval()
    t_theirs, m_theirs = measure(forward(theirs), args.repeats, device)
    t_ours, m_ours = measure(forward(ours), args.repeats, device)
    print(f"| forward time (s), 6 layers | {t_theirs:.2f} | {t_ours:.2f} | {t_ours / t_theirs:.2f} |")
    print(f"| forward peak MiB, 6 layers | {m_theirs:.0f} | {m_ours:.0f} | {m_ours / max(m_theirs, 1e-9):.2f} |")
    del theirs, ours
    gc.collect()

    print()
    print("| txv_reformer training step | layers | peak MiB | ratio vs 1 layer |")
    print("|---|---|---|---|")
    results = {}
    for name, depth, reversible in (
        ("reversible", 1, True),
        ("reversible", 12, True),
        ("stored activations", 12, False),
    ):
        kwargs = config_kwargs(length, (["local", "lsh"] * 6)[:depth] if depth > 1 else ["lsh"])
        torch.manual_seed(0)
        model = TxvReformerForCausalLM(TxvReformerConfig(**kwargs, reversible=reversible)).train().to(device)
        _, peak = measure(step(model), 1, device)
        results[(name, depth)] = peak
        base = results[("reversible", 1)]
        print(f"| {name} | {depth} | {peak:.0f} | {peak / max(base, 1e-9):.2f} |", flush=True)
        del model
        gc.collect()


if __name__ == "__main__":
    main()
