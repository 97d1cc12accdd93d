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

from .txv_precision import at_least_float32

HEAD_WIDTH_MULTIPLE = 8


def cluster_bounds(vocab_size: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    edges = [0, *cutoffs, vocab_size]
    return list(zip(edges[:-1], edges[1:]))


def cluster_dims(d_embed: int, div_val: int, num_clusters: int) -> list[int]:
    return [d_embed // (div_val**i) for i in range(num_clusters)]


def token_clusters(token_ids: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """The cluster of each token id (0 = shortlist), as int64 (all 0 without tail clusters)."""
    return sum(((token_ids >= start).long() for start, _ in bounds[1:]), torch.zeros_like(token_ids, dtype=torch.long))


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
        if torch.compiler.is_compiling() or input_ids.shape[-1] == 1:  # compiling, or one position per row (a step)
            return self._embed_with_static_shapes(input_ids) * self.emb_scale
        return self._embed_cluster_by_cluster(input_ids) * self.emb_scale

    def _embed_cluster_by_cluster(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each cluster embeds and projects only its own tokens (the tokens sorted by cluster, one split, one
        reordering `index_copy` whose backward is a gather), so the projections cost what they must:
        sum_c n_c d_c d_proj multiply-adds. The split sizes are read on the host (one synchronisation on a GPU, as
        the softmax's row selection has too)."""
        flat_ids = input_ids.reshape(-1)
        clusters = token_clusters(flat_ids, self.bounds)
        order = torch.argsort(clusters, stable=True)
        tokens_per_cluster = torch.bincount(clusters, minlength=len(self.bounds)).tolist()
        pieces = zip(self.bounds, self.emb_layers, self.emb_projs, flat_ids[order].split(tokens_per_cluster))
        # a cluster without tokens stays out of the graph: its parameters get no gradient (None, not zeros), so an
        # optimiser leaves them as they are, as the original code does (a zero gradient would still move them by
        # Adam's momentum)
        projected = torch.cat(
            [
                nn.functional.linear(layer(ids - start), projection)
                for (start, _), layer, projection, ids in pieces
                if len(ids)
            ]
        )
        # in the activation dtype (autocast's for the projection): never a float32 buffer for bf16/fp16 rows
        embeddings = projected.new_empty(projected.shape).index_copy(0, order, projected)
        return embeddings.view(*input_ids.shape, self.d_proj)

    def _embed_with_static_shapes(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Batched over clusters, no data-dependent shapes and no host synchronisation (torch.compile / torch.export,
        and a generation step, where sorting a few tokens by cluster costs more than the products): every cluster
        embeds and projects every token, and a token keeps its own cluster's P_c e_c(t) (the others are exact zeros),
        at sum_c d_c / d_c(t) times the multiply-adds of the cluster-by-cluster path. The output has the projection's
        dtype under autocast too."""
        embeddings = None
        for (start, end), layer, projection in zip(self.bounds, self.emb_layers, self.emb_projs):
            in_cluster = (input_ids >= start) & (input_ids < end)
            projected = nn.functional.linear(layer((input_ids - start).clamp(0, end - start - 1)), projection)
            projected = torch.where(in_cluster[..., None], projected, 0.0)
            embeddings = projected if embeddings is None else embeddings + projected
        return embeddings


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

    def _output_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(weight, bias) of each cluster; with div_val 1, views of the one output layer, split once per call (the
        backward of a split is one concatenation, where that of each slice would zero-fill a vocabulary-sized
        gradient: 4 x [267735, 410] for wt103)."""
        if self.div_val == 1:
            sizes = [end - start for start, end in self.bounds]
            return list(zip(self.out_layers[0].weight.split(sizes), self.out_layers[0].bias.split(sizes)))
        return [(layer.weight, layer.bias) for layer in self.out_layers]

    def _cluster_logits(self, hidden: torch.Tensor, cluster: int, layers=None) -> torch.Tensor:
        """Unnormalised scores of cluster `cluster` (for cluster 0 including the tail-cluster columns); `layers`:
        `_output_layers()` of the current call."""
        weight, bias = (layers or self._output_layers())[cluster]
        if len(self.out_projs):
            hidden = torch.matmul(hidden, self.out_projs[cluster])  # [N, d_proj] @ [d_proj, d_emb_i]
        if cluster == 0 and self.num_tail_clusters > 0:
            if hidden.numel() <= hidden.shape[-1] ** 2:
                # at most d_emb rows (a generation step): the two products' outputs concatenated, N x (shortlist +
                # tail clusters) values, fewer than the head's weights (shortlist x d_emb) that the other form copies
                tail_scores = nn.functional.linear(hidden, self.cluster_weight, self.cluster_bias)
                return torch.cat([nn.functional.linear(hidden, weight, bias), tail_scores], dim=-1)
            # the head scores [shortlist | tail clusters | padding]: the padding columns (zero weights, bias -inf,
            # so exp() of them is exactly 0 and their gradient too) make the width a multiple of 8, which the
            # matrix-product kernels run faster (benchmarks/bench_adaptive_softmax.py)
            padding = -(self.shortlist_size + self.num_tail_clusters) % HEAD_WIDTH_MULTIPLE
            weight = torch.cat([weight, self.cluster_weight, weight.new_zeros(padding, weight.shape[1])], dim=0)
            bias = torch.cat([bias, self.cluster_bias, bias.new_full((padding,), float("-inf"))], dim=0)
        return nn.functional.linear(hidden, weight, bias)

    @staticmethod
    def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
        # in float32 for bf16/fp16 logits (autocast): the normaliser of a large vocabulary loses too much in half
        # precision; float64 logits stay float64
        return nn.functional.log_softmax(logits, dim=-1, dtype=at_least_float32(logits.dtype))

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[..., d_proj]` -> `[..., vocab_size]` log-probabilities (float32)."""
        layers = self._output_layers()
        head = self._log_softmax(self._cluster_logits(hidden, 0, layers))
        if self.num_tail_clusters == 0:
            return head
        # views of the head: [shortlist | one column per tail cluster | padding] (the backward of a split is one
        # concatenation, where slicing and selecting would each zero-fill a head-sized gradient)
        padding = head.shape[-1] - self.shortlist_size - self.num_tail_clusters
        shortlist, cluster_columns, _ = head.split([self.shortlist_size, self.num_tail_clusters, padding], dim=-1)
        tails = [self._log_softmax(self._cluster_logits(hidden, c, layers)) for c in range(1, len(layers))]
        if not torch.compiler.is_compiling() and not any(scores.requires_grad for scores in (head, *tails)):
            # eager without autograd: each cluster's log-probabilities are written straight into their columns of
            # the output (the sum log p_head(cluster) + log p_cluster(w) is the write): no concatenation (a compiler
            # fuses the concatenation itself, and Dynamo does not trace `out=` into a strided view)
            log_probs = head.new_empty(*head.shape[:-1], self.vocab_size)
            log_probs[..., : self.shortlist_size] = shortlist
            for (start, end), column, tail in zip(self.bounds[1:], cluster_columns.unbind(-1), tails):
                torch.add(tail, column[..., None], out=log_probs[..., start:end])
            return log_probs
        in_clusters = [column[..., None] + tail for column, tail in zip(cluster_columns.unbind(-1), tails)]
        return torch.cat([shortlist, *in_clusters], dim=-1)

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Per-token negative log-likelihood (float32) in position order, 0 where `targets == ignore_index`.

        hidden: `[N, d_proj]`, targets: `[N]`. The head is one matmul over all rows; a tail cluster's scores are
        computed only for the rows whose target lies in it (under torch.compile / torch.export, where the number of
        such rows cannot be data-dependent, for all rows, then selected)."""
        valid = targets != ignore_index
        safe_targets = targets.masked_fill(~valid, 0)
        layers = self._output_layers()
        head = self._log_softmax(self._cluster_logits(hidden, 0, layers))
        if self.num_tail_clusters == 0:
            token_log_probs = head.gather(1, safe_targets[:, None]).squeeze(1)
            return -token_log_probs.masked_fill(~valid, 0.0)
        # cluster of each target (0 = shortlist) and its head column: the token itself, or the tail cluster's column
        target_cluster = token_clusters(safe_targets, self.bounds)
        head_column = torch.where(target_cluster == 0, safe_targets, self.shortlist_size + target_cluster - 1)
        token_log_probs = head.gather(1, head_column[:, None]).squeeze(1)
        for cluster in range(1, self.num_tail_clusters + 1):
            in_cluster = target_cluster == cluster
            if torch.compiler.is_compiling():
                tail_log_probs = self._tail_log_probs_all_rows(hidden, safe_targets, in_cluster, cluster, layers)
                token_log_probs = token_log_probs + tail_log_probs
            else:
                rows = in_cluster.nonzero().squeeze(1)
                if not len(rows):  # no target in the cluster: its parameters stay out of the graph (no gradient)
                    continue
                tail_log_probs = self._tail_log_probs(hidden[rows], safe_targets[rows], cluster, layers)
                token_log_probs = token_log_probs.index_add(0, rows, tail_log_probs)
        return -token_log_probs.masked_fill(~valid, 0.0)

    def _tail_log_probs(self, hidden: torch.Tensor, targets: torch.Tensor, cluster: int, layers) -> torch.Tensor:
        """log p_cluster(target | cluster) for rows whose targets all lie in `cluster`."""
        start, end = self.bounds[cluster]
        tail = self._log_softmax(self._cluster_logits(hidden, cluster, layers))
        return tail.gather(1, (targets - start).clamp(0, end - start - 1)[:, None]).squeeze(1)

    def _tail_log_probs_all_rows(self, hidden, targets, in_cluster, cluster: int, layers) -> torch.Tensor:
        """`_tail_log_probs` for every row, 0 for the rows outside the cluster (static shapes for compilers)."""
        return torch.where(in_cluster, self._tail_log_probs(hidden, targets, cluster, layers), 0.0)
