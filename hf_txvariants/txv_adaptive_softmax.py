"""Adaptive input embeddings (Baevski & Auli 2019) and the projected adaptive softmax (Grave et al. 2017) of
Transformer-XL.

The vocabulary is cut into clusters at `cutoffs`: cluster 0 (the head, most frequent tokens) and tail clusters
1..n. With `div_val > 1` cluster i has embedding size `d_embed // div_val**i`, projected to `d_proj`. The softmax head
scores the shortlist plus one logit per tail cluster; a token in tail cluster i gets

    log p(w) = log p_head(cluster i) + log p_i(w | cluster i)

with the head column of cluster i at `cutoffs[0] + i - 1` (the TF and transformers convention). Parameter names are
the original ones (`emb_layers`, `emb_projs`, `out_layers`, `out_projs`, `cluster_weight`, `cluster_bias`).
"""

from __future__ import annotations

import torch
from torch import nn


def cluster_bounds(vocab_size: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    edges = [0, *cutoffs, vocab_size]
    return list(zip(edges[:-1], edges[1:]))


def cluster_dims(d_embed: int, div_val: int, num_clusters: int) -> list[int]:
    return [d_embed // (div_val**i) for i in range(num_clusters)]


class ProjectionList(nn.ParameterList):
    """The per-cluster projections `[d_proj, d_emb_i]` (its own type so that `_init_weights` can find them)."""


class AdaptiveEmbedding(nn.Module):
    """Token embedding with per-cluster sizes, projected to `d_proj` and scaled by sqrt(d_proj)."""

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int = 1):
        super().__init__()
        self.vocab_size, self.d_embed, self.d_proj, self.div_val = vocab_size, d_embed, d_proj, div_val
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.emb_scale = d_proj**0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = ProjectionList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(vocab_size, d_embed))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.zeros(d_proj, d_embed)))
        else:
            for (start, end), dim in zip(self.bounds, cluster_dims(d_embed, div_val, len(self.bounds))):
                self.emb_layers.append(nn.Embedding(end - start, dim))
                self.emb_projs.append(nn.Parameter(torch.zeros(d_proj, dim)))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:
            embeddings = self.emb_layers[0](input_ids)
            if len(self.emb_projs):
                embeddings = nn.functional.linear(embeddings, self.emb_projs[0])
            return embeddings * self.emb_scale
        flat_ids = input_ids.reshape(-1)
        weight = self.emb_projs[0]
        flat = torch.zeros(flat_ids.shape[0], self.d_proj, dtype=weight.dtype, device=weight.device)
        for (start, end), layer, proj in zip(self.bounds, self.emb_layers, self.emb_projs):
            rows = ((flat_ids >= start) & (flat_ids < end)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            cluster_embeddings = nn.functional.linear(layer(flat_ids[rows] - start), proj)
            flat = flat.index_copy(0, rows, cluster_embeddings)
        return flat.view(*input_ids.shape, self.d_proj) * self.emb_scale


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Log-probabilities over the vocabulary, and per-token negative log-likelihoods that only evaluate the tail
    clusters of the tokens that fall in them. A plain (projected) softmax when there are no cutoffs."""

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int = 1):
        super().__init__()
        self.vocab_size, self.d_embed, self.d_proj, self.div_val = vocab_size, d_embed, d_proj, div_val
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.shortlist_size = self.bounds[0][1]
        self.num_tail_clusters = len(cutoffs)
        if self.num_tail_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.zeros(self.num_tail_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.num_tail_clusters))
        self.out_layers = nn.ModuleList()
        self.out_projs = ProjectionList()
        if div_val == 1:
            if d_proj != d_embed:
                for _ in self.bounds:
                    self.out_projs.append(nn.Parameter(torch.zeros(d_proj, d_embed)))
            self.out_layers.append(nn.Linear(d_embed, vocab_size))
        else:
            for (start, end), dim in zip(self.bounds, cluster_dims(d_embed, div_val, len(self.bounds))):
                self.out_projs.append(nn.Parameter(torch.zeros(d_proj, dim)))
                self.out_layers.append(nn.Linear(dim, end - start))

    def _cluster_logits(self, hidden: torch.Tensor, cluster: int) -> torch.Tensor:
        """Unnormalised scores of cluster `cluster` (for cluster 0 including the tail-cluster columns)."""
        if self.div_val == 1:
            start, end = self.bounds[cluster]
            weight, bias = self.out_layers[0].weight[start:end], self.out_layers[0].bias[start:end]
        else:
            weight, bias = self.out_layers[cluster].weight, self.out_layers[cluster].bias
        if cluster == 0 and self.num_tail_clusters > 0:
            weight = torch.cat([weight, self.cluster_weight], dim=0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        if len(self.out_projs):
            hidden = torch.matmul(hidden, self.out_projs[cluster])  # [N, d_proj] @ [d_proj, d_emb_i]
        return nn.functional.linear(hidden, weight, bias)

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[..., d_proj]` -> `[..., vocab_size]` log-probabilities."""
        head = nn.functional.log_softmax(self._cluster_logits(hidden, 0), dim=-1)
        if self.num_tail_clusters == 0:
            return head
        pieces = [head[..., : self.shortlist_size]]
        for cluster in range(1, self.num_tail_clusters + 1):
            tail = nn.functional.log_softmax(self._cluster_logits(hidden, cluster), dim=-1)
            pieces.append(head[..., self.shortlist_size + cluster - 1, None] + tail)
        return torch.cat(pieces, dim=-1)

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Per-token negative log-likelihood in position order, 0 where `targets == ignore_index`.

        hidden: `[N, d_proj]`, targets: `[N]`."""
        valid = targets != ignore_index
        safe_targets = targets.masked_fill(~valid, 0)
        head = nn.functional.log_softmax(self._cluster_logits(hidden, 0), dim=-1)
        if self.num_tail_clusters == 0:
            token_log_probs = head.gather(1, safe_targets[:, None]).squeeze(1)
            return -token_log_probs.masked_fill(~valid, 0.0)
        in_shortlist = safe_targets < self.shortlist_size
        shortlist_targets = safe_targets.clamp(max=self.shortlist_size - 1)
        token_log_probs = head.gather(1, shortlist_targets[:, None]).squeeze(1).masked_fill(~in_shortlist, 0.0)
        for cluster in range(1, self.num_tail_clusters + 1):
            start, end = self.bounds[cluster]
            rows = ((safe_targets >= start) & (safe_targets < end)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            tail = nn.functional.log_softmax(self._cluster_logits(hidden[rows], cluster), dim=-1)
            cluster_log_probs = head[rows, self.shortlist_size + cluster - 1] + tail.gather(
                1, (safe_targets[rows] - start)[:, None]
            ).squeeze(1)
            token_log_probs = token_log_probs.index_put((rows,), cluster_log_probs)
        return -token_log_probs.masked_fill(~valid, 0.0)
