"""Reversible layers: exact gradients (with dropout) against ordinary autograd, inversion, chunked feed-forward."""

import torch
from torch import nn

from hf_txvariants.txv_reversible import chunked_feed_forward, reversible_sequence


class Block(nn.Module):
    def __init__(self, width, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.f = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.Dropout(0.3), nn.Tanh())
        self.g = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Dropout(0.3), nn.GELU(), nn.Linear(2 * width, width)
        )


def _run(blocks, x, reversible):
    x1, x2 = x.clone(), x.clone()
    if reversible:
        parameters = [p for block in blocks for p in block.parameters()]
        y1, y2 = reversible_sequence(x1, x2, [(b.f, b.g) for b in blocks], parameters)
    else:
        for block in blocks:  # the ordinary computation, every activation stored
            x1 = x1 + block.f(x2)
            x2 = x2 + block.g(x1)
        y1, y2 = x1, x2
    return torch.cat([y1, y2], -1)


def test_reversible_gradients_are_exact_with_dropout():
    blocks = nn.ModuleList(Block(8, seed) for seed in range(4)).train()
    results = []
    for reversible in (False, True):
        blocks.zero_grad()
        x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)).requires_grad_()
        torch.manual_seed(123)
        out = _run(blocks, x, reversible)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), x.grad.clone(), [p.grad.clone() for p in blocks.parameters()]))
    (out_a, gx_a, gp_a), (out_b, gx_b, gp_b) = results
    torch.testing.assert_close(out_b, out_a, atol=1e-6, rtol=0)
    torch.testing.assert_close(gx_b, gx_a, atol=1e-5, rtol=1e-5)
    for a, b in zip(gp_a, gp_b):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert all(g.abs().sum() > 0 for g in gp_b)


def test_dropout_really_active_in_test():
    """Guard for the test above: the two dropout draws differ, so a wrong replay would be caught."""
    blocks = nn.ModuleList([Block(8, 0)]).train()
    x = torch.randn(2, 5, 8)
    assert not torch.allclose(_run(blocks, x, False), _run(blocks, x, False))


def test_no_grad_path_equals_grad_path():
    blocks = nn.ModuleList(Block(8, seed) for seed in range(2)).eval()
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        expected = _run(blocks, x, False)
    torch.testing.assert_close(_run(blocks, x.requires_grad_(), True).detach(), expected, atol=1e-6, rtol=0)


def test_chunked_feed_forward_equals_full():
    layer = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))
    x = torch.randn(2, 11, 6)
    for chunk in (0, 1, 4, 11, 20):
        torch.testing.assert_close(chunked_feed_forward(layer, chunk, x), layer(x), atol=1e-6, rtol=0)
