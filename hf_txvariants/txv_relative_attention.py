"""Transformer-XL relative positional attention (Dai et al. 2019, section 3.3), shared by every XL-family variant.

For query position i and key position j the score is

    A_ij = (W_q x_i + u) . W_k x_j   +   (W_q x_i + v) . W_r R_{i-j}
           `------ content (a)+(c) --'    `------- position (b)+(d) ---'

with R the sinusoid table and u, v learned per-head biases (`r_w_bias`, `r_r_bias`). The content term is an ordinary
q.k product (u is folded into the query), so it goes through the shared attention functions (eager, SDPA); the
position term is computed once for all relative distances and shifted into place, then passed as an additive mask.
"""

from __future__ import annotations

import torch
from torch import nn

from .txv_attention import additive_mask, get_attention_function
from .txv_positions import sinusoid_table


def relative_distances(key_length: int, clamp_len: int, device) -> torch.Tensor:
    """Distances `key_length - 1, ..., 1, 0, -1` (clamped at `clamp_len` when it is > 0), the rows of the sinusoid
    table that `relative_shift` expects. The extra distance -1 only ever lands on future keys, which are masked; it
    makes the shifted view non-overlapping, so its backward pass is a plain strided copy."""
    distances = torch.arange(key_length - 1, -2, -1.0, device=device)
    return distances.clamp(max=clamp_len) if clamp_len > 0 else distances


def relative_position_embeddings(key_length: int, hidden_size: int, clamp_len: int, dtype, device) -> torch.Tensor:
    """`[key_length + 1, hidden_size]` sinusoids for `relative_distances` (Dai et al.'s R matrix)."""
    return sinusoid_table(relative_distances(key_length, clamp_len, device), hidden_size).to(dtype)


def relative_shift(position_scores: torch.Tensor, key_length: int) -> torch.Tensor:
    """Moves the position scores from "by distance" to "by key" layout without a copy (the paper's appendix B trick).

    `position_scores[..., i, m]` is the score of query i for distance `key_length - 1 - m` (the table of
    `relative_distances`: key_length - 1 down to 0, then one more row for -1; R = key_length + 1 rows). Query i sits
    at absolute position `M + i` (M = memory length, Q = query length, key_length = K = M + Q), so key j needs
    distance `M + i - j`, i.e. m = j + (Q - 1 - i): element `i * (R - 1) + j + (Q - 1) = (Q - 1) + i * K + j` of the
    row-major `[Q, R]` block. So the shifted scores are the flattened block from element Q - 1 on, read as `[Q, K]`:
    a slice and two views (no as_strided, so torch.compile traces and fuses it). Entries for future keys (j > M + i)
    read neighbouring values and must be masked by the caller. A table without the row for -1 (R = K) gets a zero
    column appended first (a copy)."""
    *batch, query_length, rows = position_scores.shape
    if rows not in (key_length, key_length + 1):
        raise ValueError(f"position scores have {rows} distances, expected {key_length} or {key_length + 1}")
    if rows == key_length:
        position_scores = nn.functional.pad(position_scores, (0, 1))
        rows += 1
    flat = position_scores.reshape(*batch, query_length * rows)
    shifted = flat[..., query_length - 1 : query_length - 1 + query_length * key_length]
    return shifted.view(*batch, query_length, key_length)


class RelativePositionAttention(nn.Module):
    """Multi-head attention over `[memory; hidden]` with Transformer-XL relative positions.

    Parameter names follow the original code (`qkv_net`, `r_net`, `o_net`, `r_w_bias`, `r_r_bias`) so that
    checkpoints of the original and of transformers' legacy TransfoXL load unchanged. When `own_biases` is False the
    u/v biases are shared across layers and passed to `forward` by the model."""

    def __init__(self, config, own_biases: bool = True):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        inner = self.num_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.qkv_net = nn.Linear(config.hidden_size, 3 * inner, bias=False)
        self.r_net = nn.Linear(config.hidden_size, inner, bias=False)
        self.o_net = nn.Linear(inner, config.hidden_size, bias=False)
        self.drop = nn.Dropout(config.dropout)
        if own_biases:
            self.r_w_bias = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))
            self.r_r_bias = nn.Parameter(torch.zeros(self.num_heads, self.head_dim))

    def key_value_weights_token(self, context_norm: nn.Module | None, hidden_states: torch.Tensor) -> tuple:
        """What the keys and values of a position depend on besides its memory vector: the projection (and the
        pre-norm) tensors, identified by storage and in-place version (an optimiser step or a reload changes it),
        and the autocast dtype."""
        tensors = [self.qkv_net.weight, *(context_norm.parameters() if context_norm is not None else ())]
        device_type = hidden_states.device.type
        autocast = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        return (autocast, *((t.data_ptr(), t._version, t.dtype) for t in tensors))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: torch.Tensor,
        allowed: torch.Tensor,
        memory: torch.Tensor | None = None,
        context_norm: nn.Module | None = None,
        shared_biases: tuple[torch.Tensor, torch.Tensor] | None = None,
        output_attentions: bool = False,
        attention_bias: torch.Tensor | None = None,
        key_values=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        hidden_states: `[B, Q, hidden]` the current segment; memory: `[B, M, hidden]` or None.
        position_embeddings: `[M + Q + 1, hidden]` from `relative_position_embeddings` (dropped out); the
            `[M + Q, hidden]` table without the row for distance -1 is accepted too.
        allowed: bool, broadcastable to `[B, heads, Q, M + Q]`.
        context_norm: applied to `[memory; hidden]` before the projections (pre-layer-norm models).
        attention_bias: an optional extra additive term, broadcastable to `[B, heads, Q, M + Q]` (e.g. the log of
            adaptive span's soft mask), added to the position scores.
        key_values: in evaluation, the layer's `txv_cache.KeyValueSlot`: the memory's keys and values are taken from
            it when they were cached with these weights (only the segment is projected), and this pass's are kept.
        Returns the attention output after `o_net` and dropout, `[B, Q, hidden]`, and the weights if requested.
        """
        batch, query_length, _ = hidden_states.shape
        memory_length = 0 if memory is None else memory.shape[1]
        heads = (self.num_heads, self.head_dim)
        plain_projection = type(self.qkv_net) is nn.Linear
        weights_token = cached = None
        if key_values is not None and plain_projection:
            weights_token = self.key_value_weights_token(context_norm, hidden_states)
            cached = key_values.lookup(weights_token, memory_length)
        if cached is not None:  # the memory's keys and values as this layer computed them: project the segment only
            context = hidden_states
        else:
            context = hidden_states if memory is None else torch.cat([memory, hidden_states], dim=1)
        if context_norm is not None:
            context = context_norm(context)
        projected_length = context.shape[1]
        if plain_projection:
            # Queries only for the segment (not the memory): the fused weight's three blocks applied separately.
            w_query, w_key, w_value = self.qkv_net.weight.chunk(3, dim=0)
            query = nn.functional.linear(context[:, -query_length:], w_query)
            key, value = nn.functional.linear(context, w_key), nn.functional.linear(context, w_value)
        else:  # a wrapped projection (e.g. a PEFT LoRA layer) must be called for its adapter to take part
            query, key, value = self.qkv_net(context).chunk(3, dim=-1)
            query = query[:, -query_length:]
        query = query.reshape(batch, query_length, *heads)
        key = key.reshape(batch, projected_length, *heads).transpose(1, 2)
        value = value.reshape(batch, projected_length, *heads).transpose(1, 2)
        if cached is not None:
            key, value = torch.cat([cached[0], key], dim=2), torch.cat([cached[1], value], dim=2)
        if weights_token is not None:
            key_values.keep(key, value, weights_token)
        key_length = key.shape[2]
        # the scaling folded into the (small) position keys rather than applied to the [B, H, Q, R] scores
        position_keys = self.r_net(position_embeddings).view(position_embeddings.shape[0], *heads) * self.scaling

        r_w_bias, r_r_bias = shared_biases if shared_biases is not None else (self.r_w_bias, self.r_r_bias)
        # (b) + (d): (q + v) . W_r R for every distance, [B, H, Q, R], then shifted so that column j is key j (a view).
        # One product per (row, head): a row's scores do not depend on the batch it is in (bit for bit)
        position_scores = torch.matmul((query + r_r_bias).transpose(1, 2), position_keys.permute(1, 2, 0))
        position_bias = relative_shift(position_scores, key_length)
        if attention_bias is not None:
            attention_bias = additive_mask(allowed, query.dtype, position_bias + attention_bias)
        else:  # one pass over the scores: the mask's finfo.min absorbs any finite score
            attention_bias = position_bias + additive_mask(allowed, query.dtype)

        attention = get_attention_function(self.config, output_attentions)
        output, weights = attention(
            self,
            (query + r_w_bias).transpose(1, 2),  # (a) + (c): u folded into the query
            key,
            value,
            attention_bias,
            scaling=self.scaling,
            dropout=self.attention_dropout if self.training else 0.0,
        )
        output = self.drop(self.o_net(output.reshape(batch, query_length, -1)))
        return output, weights
