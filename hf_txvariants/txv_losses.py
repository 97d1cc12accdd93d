"""The causal language-modelling loss the HF way: labels shifted inside, -100 ignored, one scalar."""

from __future__ import annotations

import torch
from torch import nn


def check_labels(labels: torch.Tensor, shape: tuple[int, ...], vocab_size: int):
    """`labels` must have the inputs' shape and hold -100 or token ids below `vocab_size`."""
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"labels must have shape {tuple(shape)}, got {tuple(labels.shape)}")
    invalid = (labels != -100) & ((labels < 0) | (labels >= vocab_size))
    if bool(invalid.any()):
        raise ValueError(f"labels must be -100 or in [0, {vocab_size}) (config.vocab_size)")


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """Mean negative log-likelihood of `labels[:, t + 1]` given position t (`logits` `[batch, length, vocab]`),
    in float32; divided by `num_items_in_batch` when given (gradient accumulation), else by the counted targets."""
    targets = labels[:, 1:].to(logits.device)
    total = nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    denominator = num_items_in_batch if num_items_in_batch is not None else (targets != -100).sum().clamp(min=1)
    return total / denominator
