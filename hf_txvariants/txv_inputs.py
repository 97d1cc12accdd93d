"""Checks and preparation of the inputs every variant's forward takes, so that bad input is one clear error."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.utils.import_utils import is_tracing


def check_token_ids(token_ids: torch.Tensor, vocab_size: int, name: str = "input_ids", field: str = "vocab_size"):
    """`token_ids` must be `[batch, length]` with values in `[0, vocab_size)`; the error names both."""
    if token_ids.dim() != 2:
        raise ValueError(f"{name} must be [batch, length], got shape {tuple(token_ids.shape)}")
    check_not_empty(token_ids.shape, name)
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {token_ids.dtype}")
    if token_ids.numel() and not torch.compiler.is_compiling():
        low, high = int(token_ids.min()), int(token_ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} must be in [0, {vocab_size}) (config.{field}), found values from {low} to {high}")


def check_not_empty(shape, name: str = "input_ids"):
    """A batch of sequences needs at least one row and one position: `(2, 0)` input is refused, naming it."""
    if len(shape) >= 2 and (shape[0] == 0 or shape[1] == 0):
        raise ValueError(f"{name} is empty (shape {tuple(shape)}): every batch needs at least one row and one token")


def check_right_padding(key_padding_mask: torch.Tensor, model_name: str) -> None:
    """Refuses a `[batch, positions]` mask (True = real) with padding before a real token, for a model that counts
    positions (and its attention pattern) from the first column (skipped while tracing: a check on tensor values)."""
    if is_tracing(key_padding_mask):
        return
    if not torch.equal(key_padding_mask, key_padding_mask.cummin(dim=1).values):
        raise ValueError(
            f"attention_mask: the {model_name} counts positions (and its pattern) from the first column, so "
            "padding must come at the end of a row; a left-padded row, or one continuing after padding (batched "
            "generate of prompts of different lengths), would silently differ from the row alone. Pad on the right, "
            "or generate rows of different lengths one at a time."
        )


def embed_inputs(
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    embed: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
    hidden_size: int,
) -> torch.Tensor:
    """Exactly one of `input_ids` (checked, then embedded with `embed`) or `inputs_embeds` (checked against
    `hidden_size`); returns the `[batch, length, hidden_size]` embeddings."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids or inputs_embeds")
    if input_ids is not None:
        check_token_ids(input_ids, vocab_size)
        return embed(input_ids)
    if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden_size:
        raise ValueError(
            f"inputs_embeds must be [batch, length, {hidden_size}] (config.hidden_size), "
            f"got shape {tuple(inputs_embeds.shape)}"
        )
    check_not_empty(inputs_embeds.shape, "inputs_embeds")
    return inputs_embeds


def segment_padding_mask(attention_mask, batch: int, query_length: int, device, unit: str = "token"):
    """The `[batch, query_length]` bool mask (True = real) of the current segment from a 2D `attention_mask` that may
    also cover earlier positions (as `generate()` passes it); None when no mask is given."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < query_length:
        raise ValueError(
            f"attention_mask must be [batch={batch}, >= {query_length}] (1 = {unit}, 0 = padding), "
            f"got shape {tuple(attention_mask.shape)}"
        )
    return attention_mask[:, -query_length:].to(device=device, dtype=torch.bool)
