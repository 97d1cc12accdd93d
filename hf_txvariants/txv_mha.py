"""Plain multi-head attention (Vaswani et al. 2017), for self- and cross-attention, with transformers' key/value caches.

Self-attention keys/values go into a `DynamicCache` (or the `self_attention_cache` of an `EncoderDecoderCache`);
cross-attention keys/values are computed once from the encoder output and kept in the `cross_attention_cache` of an
`EncoderDecoderCache` (what `generate()` builds for `EncoderDecoderModel`). The mask is the additive float mask of
`txv_attention`; subclasses add their own terms to it (see `txv_shaw_attention`). Where the only masking is causal,
`self_attention_mask(..., fused=True)` returns a `CausalMask` instead, which reaches SDPA's fused causal kernels.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache

from .txv_attention import CausalMask, additive_mask, all_tokens_real, attention_forward, causal_allowed


def cache_past_length(cache: Cache | None, layer_idx: int = 0) -> int:
    """Number of cached self-attention positions (0 without a cache)."""
    if cache is None:
        return 0
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.self_attention_cache
    return cache.get_seq_length(layer_idx)


class MultiHeadAttention(nn.Module):
    """`q_proj`, `k_proj`, `v_proj`, `o_proj` (with biases), `num_heads` heads of size `head_dim`.

    `key_value_size`: width of the cross-attention source (the encoder output); defaults to `hidden_size`."""

    is_causal = False  # causality comes from the mask (a `CausalMask` asks for SDPA's is_causal explicitly)

    def __init__(
        self,
        config,
        layer_idx: int,
        is_cross_attention: bool = False,
        key_value_size: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        inner = self.num_heads * self.head_dim
        key_value_size = key_value_size or config.hidden_size
        self.q_proj = nn.Linear(config.hidden_size, inner)
        self.k_proj = nn.Linear(key_value_size, inner)
        self.v_proj = nn.Linear(key_value_size, inner)
        self.o_proj = nn.Linear(inner, config.hidden_size)

    def _heads(self, states: torch.Tensor) -> torch.Tensor:
        batch, length = states.shape[:2]
        return states.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def keys_values(self, hidden_states, key_value_states=None, cache: Cache | None = None):
        """`[batch, heads, k_len, head_dim]` keys and values, read from / written to the cache."""
        if not self.is_cross_attention:
            key, value = self._heads(self.k_proj(hidden_states)), self._heads(self.v_proj(hidden_states))
            if cache is not None:
                if isinstance(cache, EncoderDecoderCache):
                    cache = cache.self_attention_cache
                key, value = cache.update(key, value, self.layer_idx)
            return key, value
        if key_value_states is None:
            raise ValueError("encoder_hidden_states is required for cross-attention (config.add_cross_attention=True)")
        if isinstance(cache, EncoderDecoderCache) and cache.is_updated.get(self.layer_idx):
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            return layer.keys, layer.values
        key, value = self._heads(self.k_proj(key_value_states)), self._heads(self.v_proj(key_value_states))
        if isinstance(cache, EncoderDecoderCache):
            key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return key, value

    def attend(self, query, key, value, attention_mask, output_attentions=False, need_weights=False):
        """Runs the configured attention function (eager when the weights are needed). `attention_mask`: an additive
        mask, None, or a `CausalMask` (SDPA's fused causal kernel where exact)."""
        return attention_forward(
            self,
            getattr(self.config, "_attn_implementation", None),
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
            output_attentions=output_attentions or need_weights,
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attention_mask`: additive float mask broadcastable to `[batch, heads, q_len, k_len]`, None, or a
        `CausalMask` (from `self_attention_mask(..., fused=True)`)."""
        batch, query_length = hidden_states.shape[:2]
        query = self._heads(self.q_proj(hidden_states))
        key, value = self.keys_values(hidden_states, key_value_states, cache)
        output, weights = self.attend(query, key, value, attention_mask, output_attentions)
        output = self.o_proj(output.reshape(batch, query_length, -1))
        return output, (weights if output_attentions else None)


def key_padding_mask(attention_mask: torch.Tensor, batch: int, query_length: int, past_length: int) -> torch.Tensor:
    """`attention_mask` checked and extended to `[batch, past_length + q_len]` (a `[batch, q_len]` mask: the past
    counts as real)."""
    key_length = past_length + query_length
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch:
        raise ValueError(
            f"attention_mask must be [batch={batch}, length] (1 = token, 0 = padding), "
            f"got shape {tuple(attention_mask.shape)}"
        )
    if attention_mask.shape[1] == query_length and past_length > 0:
        attention_mask = torch.cat([attention_mask.new_ones(batch, past_length), attention_mask], dim=1)
    if attention_mask.shape[1] != key_length:
        raise ValueError(
            f"attention_mask must cover the cached and the new positions ({key_length}), "
            f"got shape {tuple(attention_mask.shape)}"
        )
    return attention_mask


def self_attention_mask(
    attention_mask: torch.Tensor | None,
    batch: int,
    query_length: int,
    past_length: int,
    causal: bool,
    dtype: torch.dtype,
    device,
    fused: bool = False,
) -> torch.Tensor | CausalMask | None:
    """Additive `[batch or 1, 1, q_len, past_length + q_len]` mask: causal (query i at position past_length + i)
    and padding. `attention_mask` is `[batch, past_length + q_len]` (or `[batch, q_len]`, the past then counts as
    real) with 1 = token, 0 = padding. None when nothing is masked.
    fused: the form that reaches the fused kernels, for `MultiHeadAttention` as it is: a `CausalMask` when the masking
    is causal and nothing is padded (else the same dense mask). Code that adds terms to the mask (a relative bias)
    keeps the default."""
    if fused and all_tokens_real(attention_mask):
        if attention_mask is not None:
            key_padding_mask(attention_mask, batch, query_length, past_length)  # checks the shape
        return CausalMask(past_length) if causal else None
    allowed = None
    if causal:
        allowed = causal_allowed(query_length, past_length, device)[None, None]
    if attention_mask is not None:
        key_valid = key_padding_mask(attention_mask, batch, query_length, past_length).to(
            device=device, dtype=torch.bool
        )
        allowed = key_valid[:, None, None, :] if allowed is None else allowed & key_valid[:, None, None, :]
    if allowed is None:
        return None
    return additive_mask(allowed, dtype)


def cross_attention_mask(encoder_attention_mask, batch: int, encoder_length: int, dtype, device):
    """Additive `[batch, 1, 1, enc_len]` mask over the encoder positions (None when nothing is masked)."""
    if encoder_attention_mask is None:
        return None
    if encoder_attention_mask.shape != (batch, encoder_length):
        raise ValueError(
            f"encoder_attention_mask must be [batch={batch}, {encoder_length}], "
            f"got shape {tuple(encoder_attention_mask.shape)}"
        )
    return additive_mask(encoder_attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :], dtype)
