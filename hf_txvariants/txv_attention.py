"""The one attention function family every variant goes through.

All functions take `query [batch, heads, q_len, head_dim]`, `key`/`value [batch, heads, k_len, head_dim]` and an
additive float `attention_mask` broadcastable to `[batch, heads, q_len, k_len]` that already carries every extra term
of the variant (relative-position scores, masks as `finfo.min`), and return `([batch, q_len, heads, head_dim],
weights or None)`. `eager` is the reference; every other implementation comes from transformers'
`ALL_ATTENTION_FUNCTIONS` (e.g. `sdpa`), which we always call with an explicit mask: its causal shortcut would drop
memory keys when k_len > q_len.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def get_attention_function(config, output_attentions: bool = False) -> Callable:
    """The attention function for `config._attn_implementation` (eager when attention weights are requested)."""
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation == "eager" or output_attentions:
        return eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Turns a boolean `allowed` mask (True = may attend) and an optional additive `bias` into one float mask.

    Masked entries get `finfo(dtype).min` rather than -inf so that a fully masked row (a padding query) stays finite."""
    minimum = torch.finfo(dtype).min
    if bias is None:
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, minimum)
    return bias.to(dtype).masked_fill(~allowed, minimum)


def causal_allowed(query_length: int, memory_length: int, device, window: int | None = None) -> torch.Tensor:
    """`[q_len, memory_length + q_len]` bool: query i (absolute position memory_length + i) may see key j when
    j <= memory_length + i and, if `window` is given, when the distance memory_length + i - j < window."""
    query_positions = torch.arange(query_length, device=device)[:, None] + memory_length
    key_positions = torch.arange(memory_length + query_length, device=device)[None, :]
    distance = query_positions - key_positions
    allowed = distance >= 0
    if window is not None:
        allowed = allowed & (distance < window)
    return allowed
