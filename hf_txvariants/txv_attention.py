"""The one attention function family every variant goes through.

All functions take `query [batch, heads, q_len, head_dim]`, `key`/`value [batch, heads, k_len, head_dim]` and an
additive float `attention_mask` broadcastable to `[batch, heads, q_len, k_len]` that already carries every extra term
of the variant (relative-position scores, masks as `finfo.min`), and return `([batch, q_len, heads, head_dim],
weights or None)`. `eager` is the reference; every other implementation comes from transformers'
`ALL_ATTENTION_FUNCTIONS` (e.g. `sdpa`).

The mask may also be a `CausalMask`: plain causal self-attention said without a dense mask. `attention_forward` then
calls SDPA with `is_causal=True` and no mask (the fused kernels: flash / memory-efficient on GPU, the fused CPU
kernel), and builds the dense mask only where the shortcut would be wrong: transformers' sdpa aligns `is_causal` to the
top left, so it would drop keys when k_len > q_len (a cache, a memory), and eager needs the mask itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.import_utils import is_tracing

from .txv_precision import at_least_float32


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
    weights = nn.functional.softmax(scores, dim=-1, dtype=at_least_float32(scores.dtype)).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


def attention_function(implementation: str | None, output_attentions: bool = False) -> Callable:
    """The attention function named `implementation` ("eager", "sdpa", ...; eager when the weights are requested)."""
    if not implementation or implementation == "eager" or output_attentions:
        return eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def get_attention_function(config, output_attentions: bool = False) -> Callable:
    """The attention function for `config._attn_implementation` (eager when attention weights are requested)."""
    return attention_function(getattr(config, "_attn_implementation", None), output_attentions)


@dataclass(frozen=True)
class CausalMask:
    """Causal self-attention without padding, said without a dense mask: query i sits at position past_length + i
    and sees keys 0 .. past_length + i. Pass it where an additive mask goes, unchanged (no arithmetic on it)."""

    past_length: int = 0

    def dense(self, query_length: int, dtype: torch.dtype, device) -> torch.Tensor:
        """The equivalent additive `[1, 1, q_len, past_length + q_len]` mask."""
        return additive_mask(causal_allowed(query_length, self.past_length, device)[None, None], dtype)


def attention_forward(
    module: nn.Module,
    implementation: str | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | CausalMask | None,
    scaling: float,
    dropout: float = 0.0,
    output_attentions: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Runs the attention function named `implementation`; a `CausalMask` takes SDPA's fused causal path
    (`is_causal=True`, no mask) when that is exact, and is made dense otherwise."""
    function = attention_function(implementation, output_attentions)
    if isinstance(attention_mask, CausalMask):
        query_length, key_length = query.shape[2], key.shape[2]
        if query_length == 1:
            attention_mask = None  # the one new query comes last: it sees every key
        elif implementation == "sdpa" and not output_attentions and key_length == query_length:
            return function(module, query, key, value, None, scaling=scaling, dropout=dropout, is_causal=True)
        else:
            attention_mask = attention_mask.dense(query_length, query.dtype, query.device)
    return function(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)


def all_tokens_real(attention_mask: torch.Tensor | None) -> bool:
    """True when `attention_mask` (1 = token, 0 = padding) masks nothing, so it can be dropped. A check on tensor
    values: while tracing (torch.compile / torch.export) it answers False, and the mask is kept."""
    if attention_mask is None:
        return True
    if is_tracing(attention_mask):
        return False
    return bool(attention_mask.all())


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
