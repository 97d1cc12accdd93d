"""Relation-aware self-attention (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with Relative Position
Representations").

    e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z)        z_i = sum_j alpha_ij (x_j W^V + a^V_ij)
    a^K_ij = w^K_{clip(j - i, k)},  a^V_ij = w^V_{clip(j - i, k)},  2k + 1 learned vectors of size d_z shared by heads

Computed the efficient way (no `[q, k, d]` tensor of per-pair vectors is ever built):
  key term   q_i . w^K_r for the 2k + 1 distances r at once (`[b, h, q, 2k+1]`), then gathered to `[b, h, q, k_len]`
             by the distance index and passed to the attention function as an additive bias;
  value term the weights alpha_ij summed per distance bucket (`scatter_add` to `[b, h, q, 2k+1]`), times w^V.
With a cache the queries are the last positions: query i sits at absolute position past_length + i.
The value term needs the attention weights, so it runs the eager function; without relative values
(`relative_values=False`) any attention function (sdpa) works.
"""

from __future__ import annotations

import torch
from torch import nn

from .txv_mha import MultiHeadAttention


def relative_distance_index(query_length: int, key_length: int, max_distance: int, device) -> torch.Tensor:
    """`[q_len, k_len]` long: clip(j - i, k) + k for query i at absolute position key_length - query_length + i."""
    query_positions = torch.arange(key_length - query_length, key_length, device=device)
    key_positions = torch.arange(key_length, device=device)
    distance = key_positions[None, :] - query_positions[:, None]
    return distance.clamp(-max_distance, max_distance) + max_distance


class RelationAwareSelfAttention(MultiHeadAttention):
    """Self-attention with `relative_key_embeddings` (and `relative_value_embeddings`), each `[2k + 1, head_dim]`."""

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.max_relative_position = config.max_relative_position
        self.use_relative_values = config.relative_values
        self.relative_key_embeddings = nn.Embedding(2 * self.max_relative_position + 1, self.head_dim)
        self.relative_value_embeddings = (
            nn.Embedding(2 * self.max_relative_position + 1, self.head_dim) if config.relative_values else None
        )

    def forward(self, hidden_states, attention_mask, key_value_states=None, cache=None, output_attentions=False):
        batch, query_length = hidden_states.shape[:2]
        query = self._heads(self.q_proj(hidden_states))
        key, value = self.keys_values(hidden_states, None, cache)
        key_length = key.shape[-2]
        index = relative_distance_index(query_length, key_length, self.max_relative_position, query.device)
        index = index.expand(batch, self.num_heads, query_length, key_length)

        # Key term: q_i . w^K_{clip(j-i,k)} = (q W_rel^T)[i, index_ij]; scaled like q.k.
        distance_scores = torch.matmul(query, self.relative_key_embeddings.weight.to(query.dtype).t())
        bias = distance_scores.gather(-1, index) * self.scaling
        mask = bias if attention_mask is None else bias + attention_mask.to(bias.dtype)

        need_weights = self.use_relative_values
        output, weights = self.attend(query, key, value, mask, output_attentions, need_weights=need_weights)
        if self.use_relative_values:
            # Value term: sum_j alpha_ij w^V_{clip(j-i,k)} = sum_r (sum_{j: bucket(i,j)=r} alpha_ij) w^V_r.
            buckets = torch.zeros(
                batch,
                self.num_heads,
                query_length,
                2 * self.max_relative_position + 1,
                dtype=weights.dtype,
                device=weights.device,
            ).scatter_add_(-1, index, weights)
            value_term = torch.matmul(buckets, self.relative_value_embeddings.weight.to(weights.dtype))
            output = output + value_term.transpose(1, 2).to(output.dtype)
        output = self.o_proj(output.reshape(batch, query_length, -1))
        return output, (weights if output_attentions else None)
