"""txv_adaptive_softmax: the batched adaptive input and the adaptive softmax against a naive implementation written
from the equations (Baevski & Auli 2019; Grave et al. 2017), in mixed precision, and traced by torch.export."""

from __future__ import annotations

import unittest.mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def force_static_shapes(monkeypatch, static_shapes: bool):
    """The path torch.compile / torch.export take (no data-dependent shapes), or the eager one."""
    if static_shapes:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


def parameter_grads(module, loss):
    return torch.autograd.grad(loss, list(module.parameters()), allow_unused=True)


@pytest.mark.parametrize("static_shapes", [False, True], ids=["cluster_by_cluster", "static_shapes"])
@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_embedding_and_its_gradients_equal_token_by_token_lookup(div_val, static_shapes, monkeypatch):
    force_static_shapes(monkeypatch, static_shapes)
    module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
    input_ids = torch.tensor([[0, 9, 10, 24, 25, 39], [3, 30, 12, 12, 1, 38]])
    embeddings, expected = module(input_ids), naive_embedding(module, input_ids)
    torch.testing.assert_close(embeddings, expected, atol=1e-5, rtol=0)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2))
    for grad, expected_grad in zip(
        parameter_grads(module, (embeddings * weights).sum()), parameter_grads(module, (expected * weights).sum())
    ):
        torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=0)


@pytest.mark.parametrize("static_shapes", [False, True], ids=["cluster_by_cluster", "static_shapes"])
def test_adaptive_embedding_of_tokens_all_in_one_cluster(static_shapes, monkeypatch):
    """Clusters with no token (here both tails, then the shortlist and a tail) are skipped, not a crash."""
    force_static_shapes(monkeypatch, static_shapes)
    module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 2))
    for input_ids in (torch.tensor([[0, 9, 3]]), torch.tensor([[30, 39, 25]])):
        torch.testing.assert_close(module(input_ids), naive_embedding(module, input_ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("static_shapes", [False, True], ids=["cluster_by_cluster", "static_shapes"])
def test_adaptive_embedding_with_div_val_and_no_cutoffs_is_one_projected_cluster(static_shapes, monkeypatch):
    force_static_shapes(monkeypatch, static_shapes)
    module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, [], 2))
    input_ids = torch.tensor([[0, 9, 39]])
    expected = module.emb_layers[0](input_ids) @ module.emb_projs[0].T * D_PROJ**0.5
    torch.testing.assert_close(module(input_ids), expected, atol=1e-5, rtol=0)


def test_adaptive_embedding_looks_up_and_projects_each_token_in_its_own_cluster_only():
    """Eager path: cluster c embeds and projects only its n_c tokens (sum_c n_c d_c d_proj multiply-adds), not every
    token with zeros outside its cluster (the static-shape path, sum_c d_c / d_c(t) times the work)."""
    module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 2))
    input_ids = torch.tensor([[0, 9, 10, 24, 25, 39], [3, 30, 12, 12, 1, 38]])
    looked_up, projected = [], []
    for layer in module.emb_layers:
        layer.register_forward_hook(lambda _, inputs, output: looked_up.append(inputs[0].numel()))
    linear = torch.nn.functional.linear
    with unittest.mock.patch.object(
        torch.nn.functional, "linear", lambda x, w, *b: projected.append(x.shape[0]) or linear(x, w, *b)
    ):
        module(input_ids)
    assert looked_up == [4, 4, 4] and projected == [4, 4, 4]


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


@pytest.mark.parametrize("div_val", [1, 2])
def test_adaptive_softmax_gradients_equal_the_equations(div_val):
    """Through the head's padding columns (bias -inf) too: finite gradients, equal to the naive ones."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
    hidden = torch.randn(6, D_PROJ, generator=torch.Generator().manual_seed(3))
    targets = torch.tensor([0, 11, 39, -100, 25, 9])
    expected = -sum(naive_log_prob(module, hidden[i], t) for i, t in enumerate(targets.tolist()) if t != -100)
    for grad, expected_grad in zip(
        parameter_grads(module, module.nll(hidden, targets).sum()), parameter_grads(module, expected)
    ):
        if expected_grad is not None:
            torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=0)


def test_head_scores_are_padded_to_a_multiple_of_8_columns_that_get_no_probability():
    """[shortlist 10 | 2 tail clusters | 4 padding columns]: the product over more rows than d_embed runs at a
    multiple-of-8 width; the padding scores are -inf, so the head's normaliser is that of the 12 real columns."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 2))
    hidden = torch.randn(D_EMBED + 1, D_PROJ, generator=torch.Generator().manual_seed(6))
    head = module._cluster_logits(hidden, 0)
    assert head.shape == (D_EMBED + 1, 16)
    assert torch.isinf(head[:, 12:]).all() and (head[:, 12:] < 0).all()
    torch.testing.assert_close(torch.logsumexp(head, -1), torch.logsumexp(head[:, :12], -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("div_val", [1, 2])
def test_few_rows_score_the_head_without_copying_its_weights(div_val):
    """A generation step (at most d_embed rows) concatenates the shortlist's and the tail clusters' scores instead of
    the weights: the same log-probabilities as the padded product (those rows computed among many), no padding."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
    hidden = torch.randn(D_EMBED + 1, D_PROJ, generator=torch.Generator().manual_seed(8))
    few = hidden[:3]
    assert module._cluster_logits(few, 0).shape == (3, 12)
    with WeightShapedOutputs((16, D_EMBED)) as writes:  # the padded head weight [10 + 2 + 4, d_embed]
        few_log_probs = module.log_probs(few)
    assert not writes.ops
    with WeightShapedOutputs((16, D_EMBED)) as writes:
        module.log_probs(hidden)
    assert writes.ops  # (the check sees the copy where there is one)
    torch.testing.assert_close(few_log_probs, module.log_probs(hidden)[:3], atol=1e-6, rtol=1e-6)


@pytest.mark.exact
@pytest.mark.parametrize("div_val", [1, 2])
def test_log_probs_without_autograd_equal_the_autograd_path(div_val):
    """Without autograd the clusters' log-probabilities are written into one output buffer (no concatenation)."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
    hidden = torch.randn(2, 5, D_PROJ, generator=torch.Generator().manual_seed(7))
    with_autograd = module.log_probs(hidden)
    assert with_autograd.requires_grad
    with torch.no_grad():
        without_autograd = module.log_probs(hidden)
    # exact: the same matmuls and log-softmaxes on the same tensors; only where each sum is written differs
    torch.testing.assert_close(without_autograd, with_autograd.detach(), atol=0, rtol=0)


class WeightShapedOutputs(TorchDispatchMode):
    """The aten ops (views aside) that write a tensor of `shape` (e.g. a full-size gradient) while active."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.ops = torch.Size(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        if isinstance(output, torch.Tensor) and output.shape == self.shape and not func.is_view:
            self.ops.append(str(func))
        return output


@pytest.mark.parametrize("method", ["nll", "log_probs"])
def test_div_val_1_backward_writes_the_output_layer_gradient_once(method):
    """With div_val 1 the clusters' weights are views of one [vocab, d_embed] layer: their gradients are gathered by
    one concatenation, not by zero-filling a vocabulary-sized gradient for each cluster and adding them up."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 1))
    hidden = torch.randn(6, D_PROJ, generator=torch.Generator().manual_seed(3))
    targets = torch.tensor([0, 11, 39, 5, 25, 9])
    output = module.nll(hidden, targets) if method == "nll" else module.log_probs(hidden)
    with WeightShapedOutputs(module.out_layers[0].weight.shape) as writes:
        output.sum().backward()
    assert len(writes.ops) == 1, writes.ops


def test_log_probs_train_the_tails_of_a_frozen_head():
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 2))
    for parameter in (module.cluster_weight, module.cluster_bias, *module.out_layers[0].parameters()):
        parameter.requires_grad_(False)
    hidden = torch.randn(4, D_PROJ, generator=torch.Generator().manual_seed(8))
    module.log_probs(hidden)[:, 30].sum().backward()
    assert module.out_layers[0].weight.grad is None and module.out_layers[2].weight.grad.abs().sum() > 0


def test_nll_static_shape_path_equals_row_selection(monkeypatch):
    """Under torch.compile / torch.export the tail is evaluated for every row (no data-dependent row count)."""
    module = random_init(ProjectedAdaptiveLogSoftmax(VOCAB, D_EMBED, D_PROJ, CUTOFFS, 2))
    hidden = torch.randn(7, D_PROJ, generator=torch.Generator().manual_seed(4))
    targets = torch.tensor([0, 11, 39, -100, 25, 9, 30])
    selected_rows = module.nll(hidden, targets)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(module.nll(hidden, targets), selected_rows, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adaptive_embedding_rows_are_in_the_activation_dtype_under_autocast(dtype, monkeypatch):
    """The div_val > 1 path used to gather bf16/fp16 cluster rows into a float32 buffer (`index_copy`, a crash on
    CUDA): its output must have the dtype autocast gives the projection, like the div_val = 1 path."""
    input_ids = torch.tensor([[0, 9, 10, 24, 25, 39]])
    for div_val, static_shapes in ((1, False), (2, False), (2, True)):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda static_shapes=static_shapes: static_shapes)
        module = random_init(AdaptiveEmbedding(VOCAB, D_EMBED, D_PROJ, CUTOFFS, div_val))
        reference = module(input_ids)
        with torch.autocast("cpu", dtype=dtype):
            embeddings = module(input_ids)
        assert embeddings.dtype == dtype, f"div_val={div_val}, static shapes {static_shapes}"
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
@pytest.mark.slow  # torch.export
def test_torch_export_traces_adaptive_input_and_softmax(div_val):
    """No data-dependent Python check on the path (issue 13: `txv_adaptive_softmax.py:63` broke torch.export)."""
    module = EmbedAndScore(div_val)
    input_ids = torch.tensor([[0, 9, 10, 24], [25, 39, 3, 30]])
    targets = torch.tensor([[11, 39, -100, 25], [9, 0, 30, 12]])
    exported = torch.export.export(module, (input_ids, targets))
    torch.testing.assert_close(exported.module()(input_ids, targets), module(input_ids, targets), atol=1e-5, rtol=0)
