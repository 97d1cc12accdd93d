"""Attention restricted to a pattern (`txv_patterns`): `pattern_attention` chooses the implementation ("auto": the
fastest exact path for the device) among tiles of dense attention (`txv_pattern_tiled`), FlexAttention
(`txv_pattern_flex`), gathering (`txv_pattern_gathered`) and the dense mask (the eager or SDPA reference). A query that
may see no key at all (possible only in the paper's fixed summary set, or for padding) gets a zero output on every
path.

`PatternSelfAttention` is the multi-head self-attention layer of the pattern models (Sparse and Image Transformer).
"""

from __future__ import annotations

from .txv_attention import additive_mask, attention_function, eager_attention_forward
from .txv_mha import MultiHeadAttention, cache_past_length
from .txv_pattern_flex import flex_pattern_attention
from .txv_pattern_gathered import gathered_attention
from .txv_pattern_tiled import tiled_attention
from .txv_patterns import AttentionPattern, dense_allowed

IMPLEMENTATIONS = ("auto", "blocked", "flex", "dense", "eager", "sdpa")


def choose_implementation(pattern, implementation, dense_implementation, device, full_sequence, training_dropout):
    """The implementation that runs: "dense" is the dense mask through `dense_implementation` (eager or sdpa); "auto"
    is the fastest exact path for the device: tiles on CPU (FlexAttention has no CPU backward and its CPU kernels are
    slower), and on CUDA tiles where every tile is plainly causal (fused flash kernels), FlexAttention with its
    cached BlockMask otherwise. Decoding with a cache (queries after the first position) uses the dense mask."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "auto":
        # FlexAttention only for whole sequences: a decoding step would build a BlockMask and compile a kernel for
        # every new key length.
        if device.type == "cuda" and full_sequence and not training_dropout and not pattern.causal_in_tiles:
            implementation = "flex"
        else:
            implementation = "blocked"
    if implementation == "blocked" and not full_sequence:
        implementation = "dense"
    if implementation == "dense":
        implementation = "sdpa" if dense_implementation == "sdpa" else "eager"
    return implementation


def pattern_attention(
    module,
    query,
    key,
    value,
    pattern,
    implementation="auto",
    scaling=None,
    key_padding_mask=None,
    dropout=0.0,
    block_size=64,
    q_offset=0,
    output_attentions=False,
    dense_implementation="eager",
):
    """Attention restricted to `pattern`. `implementation`: "auto" (the fastest exact path for the device), "blocked"
    (tiles of dense attention: trains on CPU), "flex" (FlexAttention), "dense" (a dense mask through
    `dense_implementation`), "eager" or "sdpa" (dense masks: the reference). Returns `([B, Lq, H, D], weights or
    None)`; weights (dense, `[B, H, Lq, Lk]`) only come from the eager path, which `output_attentions` selects.
    `block_size`: query block of the gathered path (patterns without tilings)."""
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    full_sequence = q_offset == 0 and query.shape[2] == key.shape[2]
    implementation = choose_implementation(
        pattern, implementation, dense_implementation, query.device, full_sequence, module.training and dropout > 0
    )
    if output_attentions:
        implementation = "eager"
    if implementation == "blocked":
        if pattern.tilings() is not None or (pattern.per_head and all(p.tilings() for p in pattern.parts)):
            return tiled_attention(
                query, key, value, pattern, scaling, key_padding_mask, dropout, module.training
            ), None
        output = gathered_attention(
            query, key, value, pattern, scaling, block_size, key_padding_mask, dropout, module.training, q_offset
        )
        return output, None
    if implementation == "flex":
        if module.training and dropout > 0:
            raise ValueError("attention dropout is not supported on the FlexAttention path; use 'blocked'")
        return flex_pattern_attention(query, key, value, pattern, scaling, key_padding_mask, q_offset), None
    allowed = dense_allowed(pattern, query.shape[2], key.shape[2], query.device, q_offset, query.shape[1])[None]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    function = eager_attention_forward if implementation == "eager" else attention_function(implementation)
    output, weights = function(
        module,
        query,
        key,
        value,
        additive_mask(allowed, query.dtype),
        scaling=scaling,
        dropout=dropout if module.training else 0.0,
    )
    sees_a_key = allowed.any(-1).transpose(1, 2)[..., None]  # [B or 1, Lq, H or 1, 1]: rows with no key give zeros
    return output * sees_a_key.to(output.dtype), weights


class PatternSelfAttention(MultiHeadAttention):
    """Multi-head self-attention restricted to `pattern` (q/k/v/o projections and the cache of `txv_mha`), run by
    `config.pattern_implementation` (its dense path by `config._attn_implementation`, gathered queries in blocks of
    `config.block_size`). With `cache`, the new positions' keys/values join the cached ones and the queries
    (at positions past_length + i) attend to the keys their pattern allows among all of them."""

    def __init__(self, config, layer_idx: int, pattern: AttentionPattern):
        super().__init__(config, layer_idx)
        self.pattern = pattern

    def forward(self, hidden_states, key_padding_mask=None, cache=None, output_attentions=False):
        batch, length = hidden_states.shape[:2]
        past_length = cache_past_length(cache, self.layer_idx)
        query = self._heads(self.q_proj(hidden_states))
        key, value = self.keys_values(hidden_states, cache=cache)
        output, weights = pattern_attention(
            self,
            query,
            key,
            value,
            self.pattern,
            self.config.pattern_implementation,
            scaling=self.scaling,
            key_padding_mask=key_padding_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            block_size=self.config.block_size,
            q_offset=past_length,
            output_attentions=output_attentions,
            dense_implementation=self.config._attn_implementation,
        )
        return self.o_proj(output.reshape(batch, length, -1)), weights
