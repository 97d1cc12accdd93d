"""Adaptive attention span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers"), a shared block.

Every head h learns a span z_h in [0, S]; the attention weight of a key at distance x from its query (x = 0 for the
query itself) is multiplied by the soft mask

    m_z(x) = clamp((R + z - x) / R, 0, 1)                      R: the ramp length

and the weights are renormalised. Softmax-then-mask-then-renormalise equals a softmax with the additive term log m:

    softmax(s)_j m_j / sum_k softmax(s)_k m_k  =  exp(s_j + log m_j) / sum_k exp(s_k + log m_k)

so the mask is passed to the shared attention functions as an additive bias (log m, and the masked value where
m = 0): the result is exact for eager and SDPA alike (the original code adds 1e-8 to the denominator).

The L1 span penalty is sum over layers of the mean span of the heads (tokens), added to the loss with a weight
(`adapt_span_loss`, as in the original code: coeff * S * mean(current_val)). Spans are kept inside [0, S]: the forward
pass uses the value clamped to [0, 1] (with a straight-through gradient) and `clamp_()` clamps the parameter in place
after an optimiser step, like the original `clamp_param`.

The dynamic variant computes the span from the query's input, z_t = S * sigmoid(v . x_t + b), one per head.

Trimming: a key at distance x >= ceil(z_max) + R has weight exactly 0, so keys farther than `required_keys()` are
dropped before attention (and memory older than that is not kept), which is what makes a short span cheap. The
original code trims in steps of 64 positions (`original_trim_length`, `original_cache_length`), which the
`txv_adaptive_span_original` model reproduces.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .txv_precision import at_least_float32


def soft_span_mask(distances: torch.Tensor, spans: torch.Tensor, ramp: int) -> torch.Tensor:
    """m_z(x) = clamp((R + z - x) / R, 0, 1) broadcast over `distances` (x) and `spans` (z)."""
    return ((ramp + spans - distances) / ramp).clamp(0.0, 1.0)


def span_attention_bias(distances: torch.Tensor, spans: torch.Tensor, ramp: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention term log m_z(x) (finfo.min where m = 0) that renormalises the masked softmax exactly."""
    compute_dtype = at_least_float32(spans.dtype)
    mask = soft_span_mask(distances.to(compute_dtype), spans.to(compute_dtype), ramp)
    minimum = torch.finfo(dtype).min
    log_mask = torch.log(mask.clamp(min=torch.finfo(compute_dtype).tiny))
    return log_mask.masked_fill(mask <= 0, minimum).to(dtype)


# The original code trims keys and memory in steps of this many positions ("too fine granularity might be bad for the
# memory management", adaptive_span.py `get_trim_len`), and keeps one step more memory than the spans need.
ORIGINAL_TRIM_STEP = 64


def original_trim_length(required_keys: int, max_span: int, step: int = ORIGINAL_TRIM_STEP) -> int:
    """How many of the S farthest positions the original code drops before attention (`get_trim_len`):
    S - required_keys rounded down to a multiple of `step`, and always fewer than S."""
    return (min(max_span - 1, max_span - required_keys) // step) * step


def original_cache_length(trim_length: int, max_span: int, step: int = ORIGINAL_TRIM_STEP) -> int:
    """How many past positions the original code keeps with `adapt_span_cache` (`get_cache_size`): what the attended
    span needs plus one trimming step, since the spans may grow before the next block; at most S."""
    return min(max_span, max_span - trim_length + step)


def check_span_fields(config):
    """Config-time checks of the adaptive-span fields every XL-family config has (each error names the field):
    `attn_span` (None or >= 1; needed by `adapt_span_enabled`), `adapt_span_ramp` >= 1, `adapt_span_init` in [0, 1],
    `adapt_span_loss` >= 0; the other `adapt_span_*` fields only mean something with `adapt_span_enabled`."""
    if config.attn_span is not None and (
        isinstance(config.attn_span, bool) or not isinstance(config.attn_span, int) or config.attn_span < 1
    ):
        raise ValueError(f"attn_span must be None or a positive integer, got {config.attn_span!r}")
    if config.adapt_span_enabled and config.attn_span is None:
        raise ValueError("adapt_span_enabled=True needs attn_span (the largest span S)")
    if (
        isinstance(config.adapt_span_ramp, bool)
        or not isinstance(config.adapt_span_ramp, int)
        or config.adapt_span_ramp < 1
    ):
        raise ValueError(f"adapt_span_ramp must be a positive integer, got {config.adapt_span_ramp!r}")
    if not 0.0 <= config.adapt_span_init <= 1.0:
        raise ValueError(f"adapt_span_init must be in [0, 1] (a fraction of attn_span), got {config.adapt_span_init}")
    if config.adapt_span_loss < 0:
        raise ValueError(f"adapt_span_loss must be >= 0, got {config.adapt_span_loss}")
    if config.adapt_span_dynamic and not config.adapt_span_enabled:
        raise ValueError("adapt_span_dynamic=True needs adapt_span_enabled=True")


class AdaptiveSpan(nn.Module):
    """The learned spans of one attention layer.

    Args:
        num_heads: H. max_span: S. ramp: R. init: initial span as a fraction of S (original `adapt_span_init`).
        dynamic: spans computed from the query's input, z_t = S * sigmoid(v . x_t + b) (needs `hidden_size`).
    Parameter `current_val` (static): `[H]`, the span fraction (z = S * current_val), as in the original code.
    """

    def __init__(
        self,
        num_heads: int,
        max_span: int,
        ramp: int,
        init: float = 0.0,
        dynamic: bool = False,
        hidden_size: int | None = None,
    ):
        super().__init__()
        if max_span < 1:
            raise ValueError(f"max_span must be >= 1, got {max_span}")
        if ramp < 1:
            raise ValueError(f"ramp must be >= 1, got {ramp}")
        self.num_heads = num_heads
        self.max_span = max_span
        self.ramp = ramp
        self.init = init
        self.dynamic = dynamic
        if dynamic:
            if hidden_size is None:
                raise ValueError("hidden_size is needed for dynamic spans")
            self.span_predictor = nn.Linear(hidden_size, num_heads)
        else:
            self.current_val = nn.Parameter(torch.full((num_heads,), float(init)))

    def spans(self, hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        """Static: `[H]` spans in tokens. Dynamic: `[batch, Q, H]` from the queries' inputs `hidden_states`."""
        if self.dynamic:
            logits = self.span_predictor(hidden_states)
            return self.max_span * torch.sigmoid(logits.to(at_least_float32(logits.dtype)))
        value = self.current_val.to(at_least_float32(self.current_val.dtype))
        clamped = value + (value.clamp(0.0, 1.0) - value).detach()  # inside [0, 1], gradient straight through
        return self.max_span * clamped

    def penalty(self, spans: torch.Tensor) -> torch.Tensor:
        """The L1 span penalty of this layer: the mean span over heads (and positions for dynamic spans)."""
        return spans.mean()

    def required_keys(self, spans: torch.Tensor) -> int:
        """Distances 0 .. required_keys() - 1 can have a non-zero weight: ceil(z_max) + R, at most S."""
        largest = float(spans.detach().max()) if spans.numel() else 0.0
        return max(1, min(self.max_span, math.ceil(largest) + self.ramp))

    def attention_bias(self, spans: torch.Tensor, query_length: int, key_length: int, dtype) -> torch.Tensor:
        """The additive bias for queries at the last `query_length` of `key_length` positions:
        `[1, H, Q, K]` for static spans, `[batch, H, Q, K]` for dynamic ones."""
        device = spans.device
        query_positions = torch.arange(key_length - query_length, key_length, device=device)
        distances = (query_positions[:, None] - torch.arange(key_length, device=device)[None, :]).clamp(min=0)
        if self.dynamic:
            z = spans.permute(0, 2, 1)[..., None]  # [batch, H, Q, 1]
        else:
            z = spans[None, :, None, None]
        return span_attention_bias(distances[None, None], z, self.ramp, dtype)

    @torch.no_grad()
    def clamp_(self):
        """Keeps the span parameters inside [0, 1] (call after each optimiser step, as the original code does)."""
        if not self.dynamic:
            self.current_val.clamp_(0.0, 1.0)


def with_span_penalty(lm_loss: torch.Tensor | None, span_penalty: torch.Tensor | None, weight: float):
    """The objective of an adaptive-span model: `lm_loss + weight * span_penalty` (the config's `adapt_span_loss`
    times the summed mean spans); `lm_loss` itself without a penalty (no adaptive span) or without a loss (no
    labels)."""
    if lm_loss is None or span_penalty is None:
        return lm_loss
    return lm_loss + weight * span_penalty


__all__ = [
    "ORIGINAL_TRIM_STEP",
    "AdaptiveSpan",
    "check_span_fields",
    "original_cache_length",
    "original_trim_length",
    "soft_span_mask",
    "span_attention_bias",
    "with_span_penalty",
]
