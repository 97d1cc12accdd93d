"""The language-modelling losses the HF way, one of each for every head: labels shifted inside (or `shift_labels`
given, as transformers' loss kwargs allow for context parallelism), `ignore_index` ignored, one float32 scalar.

Both honour `num_items_in_batch` (gradient accumulation: the sum is divided by the tokens of the whole batch). When
every target is ignored the loss is 0.0 (defined and finite, the same in every variant), never NaN."""

from __future__ import annotations

import torch
from torch import nn

from .txv_precision import at_least_float32


def check_labels(labels: torch.Tensor, shape: tuple[int, ...], vocab_size: int, ignore_index: int = -100):
    """`labels` must have the inputs' shape and hold `ignore_index` or token ids below `vocab_size`."""
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"labels must have shape {tuple(shape)}, got {tuple(labels.shape)}")
    if torch.compiler.is_compiling():
        return  # a check on tensor values would break the graph (torch.compile(fullgraph=True), torch.export)
    invalid = (labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))
    if bool(invalid.any()):
        raise ValueError(f"labels must be {ignore_index} or in [0, {vocab_size}) (config.vocab_size)")


def check_causal_lm_targets(labels, shift_labels, shape: tuple[int, ...], vocab_size: int, ignore_index: int = -100):
    """`check_labels` on whichever of `labels` / `shift_labels` a causal-LM head was given."""
    for targets in (labels, shift_labels):
        if targets is not None:
            check_labels(targets, shape, vocab_size, ignore_index)


def token_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, num_items_in_batch=None, ignore_index: int = -100
) -> torch.Tensor:
    """Sum of the per-token cross-entropies of `logits [..., vocab]` against `targets [...]` in float32 (float64 for
    float64 logits), divided by
    `num_items_in_batch` when given, else by the number of counted targets (at least 1)."""
    targets = targets.to(logits.device).reshape(-1)
    total = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).to(at_least_float32(logits.dtype)),
        targets,
        ignore_index=ignore_index,
        reduction="sum",
    )
    if num_items_in_batch is None:
        num_items_in_batch = (targets != ignore_index).sum().clamp(min=1)
    elif torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def next_token_targets(
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None = None,
    offset: int = 1,
    ignore_index: int = -100,
) -> torch.Tensor:
    """`[batch, length]` targets of position t: `labels[:, t + offset]`, or `shift_labels[:, t + offset - 1]` when
    `shift_labels` is given (already shifted by one, e.g. by a context-parallel data collator; `labels` is then
    ignored). Positions past the end get `ignore_index`. `offset` > 1 is a future token (auxiliary targets)."""
    if shift_labels is not None:
        labels, offset = shift_labels, offset - 1
    elif labels is None:
        raise ValueError("a causal LM loss needs labels or shift_labels")
    return nn.functional.pad(labels[:, offset:], (0, min(offset, labels.shape[1])), value=ignore_index)


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    num_items_in_batch=None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """Mean negative log-likelihood of the next token: position t predicts `labels[:, t + 1]`, or `shift_labels[:, t]`
    when given (already shifted, e.g. by a context-parallel data collator; `labels` is then ignored)."""
    if shift_labels is not None and tuple(shift_labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"shift_labels must have shape {tuple(logits.shape[:-1])}, got {tuple(shift_labels.shape)}")
    targets = next_token_targets(labels, shift_labels, 1, ignore_index)
    return token_cross_entropy(logits, targets, num_items_in_batch, ignore_index)


def masked_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None, ignore_index: int = -100, **kwargs
) -> torch.Tensor:
    """Mean negative log-likelihood of `labels[:, t]` at position t (no shift; `ignore_index` where nothing is
    masked)."""
    return token_cross_entropy(logits, labels, num_items_in_batch, ignore_index)


def causal_lm_head(
    lm_head, hidden_states: torch.Tensor, vocab_size: int, labels=None, logits_to_keep: int = 0, **loss_kwargs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(logits, loss)` of a causal-LM head: with `labels` (or `shift_labels` in `loss_kwargs`) the targets are checked
    and the loss is taken over every position, then the logits are cut to the last `logits_to_keep` (0: all); without
    them only the kept positions are projected and the loss is None."""
    shift_labels = loss_kwargs.get("shift_labels")
    if labels is None and shift_labels is None:
        return lm_head(hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states), None
    check_causal_lm_targets(labels, shift_labels, hidden_states.shape[:2], vocab_size)
    logits = lm_head(hidden_states)
    loss = causal_lm_loss(logits, labels, **loss_kwargs)
    return (logits[:, -logits_to_keep:] if logits_to_keep else logits), loss
