"""txv_adaptive_softmax: the batched adaptive input and the adaptive softmax against a naive implementation written
from the equations (Baevski & Auli 2019; Grave et al. 2017), in mixed precision, and traced by torch.export."""

from __future__ import annotations

import pytest
import torch

from hf_txvariants.txv_adaptive_softmax import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax

VOCAB, CUTOFFS, D_EMBED, D_PROJ = 40, [10, 25], 16, 12


def random_init(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return module


def cluster_of(token: int) -> int:
    return sum(token >= cutoff for cutoff in CUTOFFS)


def naive_embedding(module: AdaptiveEmbedding, input_ids: torch.Tensor) -> torch.Tensor:
    """Token by token: e = P_c E_c[w - start_c] * sqrt(d_proj), c the cluster of w."""
    rows = []
    for token in input_ids.reshape(-1).tolist():
        cluster = cluster_of(token) if module.div_val > 1 else 0
        start = module.bounds[cluster][0] if module.div_val > 1 else 0
        vector = module.emb_layers[cluster].weight[token - start]
        if len(module.emb_projs):
            vector = module.emb_projs[cluster] @ vector
        rows.append(vector * D_PROJ**0.5)
    return torch.stack(rows).view(*input_ids.shape, -1)


def naive_log_prob(module: ProjectedAdaptiveLogSoftmax, hidden: torch.Tensor, token: int) -> torch.Tensor:
    """log p(w) = log softmax(head)[w] for a shortlist token, else log softmax(head)[column of cluster c] +
    log softmax(tail_c)[w - start_c]; head = [shortlist logits | cluster logits]."""

    def scores(cluster):
        start, end = module.bounds[cluster]
        if module.div_val == 1:
            weight, bias = module.out_layers[0].weight[start:end], module.out_layers[0].bias[start:end]
        else:
            weight, bias = module.out_layers[cluster].weight, module.out_layers[cluster].bias
        projected = hidden @ module.out_projs[cluster] if len(module.out_projs) else hidden
        return projected @ weight.T + bias

    head = torch.cat([scores(0), hidden_cluster_scores(module, hidden)])
    head_log_probs = head - torch.logsumexp(head, 0)
    cluster = cluster_of(token)
    if cluster == 0:
        return head_log_probs[token]
    tail = scores(cluster)
    return head_log_probs[CUTOFFS[0] + cluster - 1] + (tail - torch.logsumexp(tail, 0))[token - CUTOFFS[cluster - 1]]


def hidden_cluster_scores(module, hidden):
    projected = hidden @ module.out_projs[0] if len(module.out_projs) else hidden
    return projected @ module.cluster_weight.T + module.cluster_bias


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_embedding_equals_token_by_token_lookup(div_val):
    module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
    input_ids = torch.tensor([[0, 9, 10, 24, 25, 39], [3, 30, 12, 12, 1, 38]])
    torch.testing.assert_close(module(input_ids), naive_embedding(module, input_ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_softmax_log_probs_and_nll_equal_the_equations(div_val):
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
    hidden = torch.randn(6, D_PROJ, generator=torch.Generator().manual_seed(3))
    targets = torch.tensor([0, 11, 39, -100, 25, 9])
    expected = torch.stack([naive_log_prob(module, hidden[i], max(t, 0)) for i, t in enumerate(targets.tolist())])
    log_probs = module.log_probs(hidden)
    torch.testing.assert_close(log_probs.gather(1, targets.clamp(min=0)[:, None])[:, 0], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(6), atol=1e-5, rtol=0)
    expected_nll = -expected.masked_fill(targets == -100, 0.0)
    torch.testing.assert_close(module.nll(hidden, targets), expected_nll, atol=1e-5, rtol=0)


def test_nll_static_shape_path_equals_row_selection(monkeypatch):
    """Under torch.compile / torch.export the tail is evaluated for every row (no data-dependent row count)."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 2))
    hidden = torch.randn(7, D_PROJ, generator=torch.Generator().manual_seed(4))
    targets = torch.tensor([0, 11, 39, -100, 25, 9, 30])
    selected_rows = module.nll(hidden, targets)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(module.nll(hidden, targets), selected_rows, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adaptive_embedding_rows_are_in_the_activation_dtype_under_autocast(dtype):
    """The div_val > 1 path used to gather bf16/fp16 cluster rows into a float32 buffer (`index_copy`, a crash on
    CUDA): its output must have the dtype autocast gives the projection, like the div_val = 1 path."""
    input_ids = torch.tensor([[0, 9, 10, 24, 25, 39]])
    for div_val in (1, 2):
        module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
        reference = module(input_ids)
        with torch.autocast("cpu", dtype=dtype):
            embeddings = module(input_ids)
        assert embeddings.dtype == dtype, f"div_val={div_val}"
        torch.testing.assert_close(embeddings.float(), reference, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_softmax_normalises_in_float32_for_bfloat16_weights(div_val):
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val)).to(torch.bfloat16)
    hidden = torch.randn(5, D_PROJ, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    log_probs = module.log_probs(hidden)
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(5), atol=1e-5, rtol=0)
    assert module.nll(hidden, torch.tensor([0, 11, 39, 25, 9])).dtype == torch.float32


class EmbedAndScore(torch.nn.Module):
    def __init__(self, div_val):
        super().__init__()
        self.embedding = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_EMBED, CUTOFFS, div_val))
        self.softmax = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_EMBED, CUTOFFS, div_val), seed=1)

    def forward(self, input_ids, targets):
        return self.softmax.nll(self.embedding(input_ids).flatten(0, 1), targets.flatten())


@pytest.mark.parametrize("div_val", [1, 2])
def test_torch_export_traces_adaptive_input_and_softmax(div_val):
    """No data-dependent Python check on the path (issue 13: `txv_adaptive_softmax.py:63` broke torch.export)."""
    module = EmbedAndScore(div_val)
    input_ids = torch.tensor([[0, 9, 10, 24], [25, 39, 3, 30]])
    targets = torch.tensor([[11, 39, -100, 25], [9, 0, 30, 12]])
    exported = torch.export.export(module, (input_ids, targets))
    torch.testing.assert_close(exported.module()(input_ids, targets), module(input_ids, targets), atol=1e-5, rtol=0)
