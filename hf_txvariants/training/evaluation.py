"""Evaluation of causal language models in nats, bits per character/token and perplexity: Transformer-XL with its
memory carried across segments, and the memory-less baseline recomputing a sliding window (Dai et al. 2019, sec. 3.2
and the evaluation-speed table)."""

from __future__ import annotations

import math
import time

import torch

from .data import SegmentStream, segment_stream
from .models import init_memory, lm_forward


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True)


def summarize(nll_sum: float, count: int, seconds: float | None = None) -> dict:
    nats = nll_sum / max(count, 1)
    result = {"nats": nats, "bpc": nats / math.log(2), "perplexity": math.exp(min(nats, 50.0)), "tokens": int(count)}
    if seconds is not None:
        result["seconds"] = seconds
        result["tokens_per_second"] = count / seconds if seconds > 0 else float("inf")
    return result


@torch.no_grad()
def evaluate_stream(
    model, stream: SegmentStream, max_segments: int | None = None, progress: bool = False
) -> tuple[float, int]:
    """Sum of next-token nats and number of predicted tokens over the segments of `stream`, in order, with the memory
    (if the model has one) carried from each segment to the next and starting empty."""
    was_training = model.training
    model.eval()
    memory = init_memory(model, stream.num_rows)
    nll, count = 0.0, 0
    total = stream.num_segments if max_segments is None else min(max_segments, stream.num_segments)
    for index, (inputs, targets) in enumerate(_progress(stream, total, progress, "evaluating")):
        if index >= total:
            break
        device = next(model.parameters()).device
        loss, memory = lm_forward(model, inputs.to(device), targets.to(device), memory, reduction="sum")
        nll += float(loss)
        count += targets.numel()
    model.train(was_training)
    return nll, count


def evaluate_text(
    model, tokens: torch.Tensor, batch_size: int, seg_len: int, max_segments: int | None = None, progress: bool = False
) -> dict:
    """Single-process evaluation of a token tensor cut into `batch_size` ordered rows (memory carried)."""
    stream = segment_stream(tokens, batch_size, seg_len, name="evaluation text")
    start = time.perf_counter()
    nll, count = evaluate_stream(model, stream, max_segments, progress)
    return summarize(nll, count, time.perf_counter() - start)


@torch.no_grad()
def evaluate_sliding_window(
    model, tokens: torch.Tensor, window: int, batch_size: int = 8, progress: bool = False
) -> dict:
    """The memory-less evaluation: every token `t >= window` is predicted by a fresh forward pass over the `window`
    tokens before it (the first window predicts its own tokens 1..window-1 and the next one)."""
    if window < 1 or batch_size < 1:
        raise ValueError(f"window ({window}) and batch_size ({batch_size}) must be positive")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if len(tokens) <= window:
        raise ValueError(f"the evaluation text ({len(tokens)} tokens) must be longer than the window ({window})")
    start = time.perf_counter()
    first_inputs, first_targets = tokens[None, :window], tokens[None, 1 : window + 1]
    nll, _ = lm_forward(model, first_inputs.to(device), first_targets.to(device), None, reduction="sum")
    nll, count = float(nll), window
    positions = list(range(window + 1, len(tokens)))
    starts = range(0, len(positions), batch_size)
    for i in _progress(starts, len(starts), progress, "evaluating (sliding window)"):
        chunk = positions[i : i + batch_size]
        inputs = torch.stack([tokens[t - window : t] for t in chunk]).to(device)
        targets = torch.tensor([int(tokens[t]) for t in chunk], device=device)
        output = model(input_ids=inputs, use_cache=False, logits_to_keep=1)
        logits = output.logits[:, -1].float()
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(chunk)
    model.train(was_training)
    return summarize(nll, count, time.perf_counter() - start)
