"""Sequence classification on the last real token, shared by the causal variants."""

from __future__ import annotations

import torch
from torch import nn


def last_token_indices(input_ids, attention_mask, pad_token_id, hidden_states) -> torch.Tensor:
    """Index of the last real token of each row: from `attention_mask` (its last `length` columns) when given,
    else from `pad_token_id` in `input_ids`, else the last position. Works for left and right padding."""
    batch, length = hidden_states.shape[:2]
    if attention_mask is not None:
        real = attention_mask[:, -length:].to(hidden_states.device).bool()
    elif input_ids is not None and pad_token_id is not None:
        real = input_ids.to(hidden_states.device) != pad_token_id
    else:
        return torch.full((batch,), length - 1, dtype=torch.long, device=hidden_states.device)
    positions = torch.arange(length, device=hidden_states.device)
    return (positions * real).argmax(-1)


def last_token_states(hidden_states, input_ids, attention_mask, pad_token_id) -> torch.Tensor:
    """`[batch, hidden]`: the hidden state of the last real token of each row (see `last_token_indices`)."""
    rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
    return hidden_states[rows, last_token_indices(input_ids, attention_mask, pad_token_id, hidden_states)]


def sequence_classification_loss(config, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Regression (num_labels == 1), single-label or multi-label classification, as transformers decides it."""
    labels = labels.to(logits.device)
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        return nn.functional.mse_loss(logits.squeeze(-1), labels.to(logits.dtype).view(-1))
    if config.problem_type == "single_label_classification":
        return nn.functional.cross_entropy(logits.view(-1, config.num_labels), labels.view(-1))
    return nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
