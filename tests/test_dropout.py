"""txv_dropout: the CPU dropout keeps each unit with probability 1 - p, scales the kept ones by 1 / (1 - p), and
multiplies the gradient by the same mask."""

from __future__ import annotations

import math

import pytest
import torch

from hf_txvariants.txv_dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scaling_are_those_of_dropout(p):
    torch.manual_seed(0)
    hidden = torch.rand(200_000) + 0.5  # no zeros: a zero output means a dropped unit
    output = dropout(hidden, p, training=True)
    kept = output != 0
    rate, count = kept.double().mean().item(), kept.numel()
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / count)  # 5 standard deviations of the binomial
    torch.testing.assert_close(output[kept], hidden[kept] / (1 - p), atol=0, rtol=1e-6)


def test_masks_are_independent_draws():
    torch.manual_seed(0)
    first, second = (dropout(torch.ones(100_000), 0.5, training=True) != 0 for _ in range(2))
    assert 0.23 < (first & second).double().mean().item() < 0.27  # independent: 1/4 kept by both


def test_backward_uses_the_forward_mask():
    torch.manual_seed(0)
    hidden = (torch.rand(4, 50, 30) + 0.5).requires_grad_(True)
    upstream = torch.randn(4, 50, 30)
    output = dropout(hidden, 0.3, training=True)
    output.backward(upstream)
    torch.testing.assert_close(hidden.grad, upstream * (output != 0) / 0.7, atol=0, rtol=1e-6)


@pytest.mark.exact
def test_identity_in_evaluation_and_for_p_zero_and_module_form():
    hidden = torch.randn(3, 5)
    assert dropout(hidden, 0.5, training=False) is hidden
    assert dropout(hidden, 0.0, training=True) is hidden
    module = Dropout(0.5)
    assert isinstance(module, torch.nn.Dropout)
    module.eval()
    assert module(hidden) is hidden
    module.train()
    assert (module(hidden) == 0).any()
    assert torch.equal(dropout(hidden, 1.0, training=True), torch.zeros_like(hidden))


def test_low_precision_input_keeps_its_dtype():
    torch.manual_seed(0)
    hidden = torch.ones(10_000, dtype=torch.bfloat16)
    output = dropout(hidden, 0.2, training=True)
    assert output.dtype == torch.bfloat16
    assert set(output.unique().tolist()) <= {0.0, float(torch.tensor(1 / 0.8, dtype=torch.bfloat16))}
