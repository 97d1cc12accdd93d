"""The attention-pattern core: each pattern equals a naive loop from the paper's definition, and its three
implementations (dense eager/SDPA reference, FlexAttention block mask, blocked) give equal outputs and gradients."""

import pytest
import torch
from torch import nn

from hf_txvariants.txv_patterns import (
    Causal,
    Fixed,
    FixedBlock,
    FixedSummary,
    Local1D,
    Local2D,
    PerHead,
    SlidingWindow,
    Strided,
    StridedColumn,
    StridedLocal,
    blocked_attention,
    dense_allowed,
    from_block_raster,
    pattern_attention,
    to_block_raster,
)

L = 48


def naive_allowed(name, q, k, stride=6, c=2, block=8, window=5):
    """Set definitions from Child et al. 2019 (sec. 4.2) and Parmar et al. 2018 (sec. 3.2), written as loops."""
    if k > q:
        return False
    if name == "causal":
        return True
    if name == "window":
        return q - k < window
    if name == "strided":  # A(1) = {t, t+1, ..., i} with t = max(0, i - l); A(2) = {j : (i - j) mod l = 0}
        return k >= max(0, q - stride + 1) or (q - k) % stride == 0
    if name == "fixed":  # A(1) = {j : floor(j/l) = floor(i/l)}; A(2) = {j : j mod l in {l-c, ..., l-1}}
        return k // stride == q // stride or k % stride in range(stride - c, stride) or k == q
    if name == "local1d":
        return k // block in (q // block, q // block - 1)
    raise KeyError(name)


PATTERNS = {
    "causal": Causal(),
    "window": SlidingWindow(5),
    "strided": Strided(6),
    "fixed": Fixed(6, 2),
    "local1d": Local1D(8),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_matches_paper_definition(name):
    mask = dense_allowed(PATTERNS[name], L, L)[0]
    expected = torch.tensor([[naive_allowed(name, q, k) for k in range(L)] for q in range(L)])
    assert torch.equal(mask, expected)


def test_local2d_matches_paper_definition():
    height, width, (bh, bw), (fh, fw) = 8, 12, (2, 4), (2, 4)
    pattern = Local2D(width, (bh, bw), (fh, fw))
    # Block-raster order from raster positions, by a loop.
    order = []
    for block_row in range(height // bh):
        for block_col in range(width // bw):
            for r in range(bh):
                for c in range(bw):
                    order.append((block_row * bh + r, block_col * bw + c))
    n = height * width
    expected = torch.zeros(n, n, dtype=torch.bool)
    for q, (qr, qc) in enumerate(order):
        top, left = qr // bh * bh, qc // bw * bw
        for k, (kr, kc) in enumerate(order):
            expected[q, k] = k <= q and top - fh <= kr < top + bh and left - fw <= kc < left + bw + fw
    assert torch.equal(dense_allowed(pattern, n, n)[0], expected)
    raster = torch.arange(n)[None]
    positions = to_block_raster(raster, height, width, (bh, bw))[0]
    assert [divmod(int(p), width) for p in positions] == order
    assert torch.equal(from_block_raster(to_block_raster(raster, height, width, (bh, bw)), height, width, (bh, bw)), raster)


def test_factors_and_per_head():
    assert Strided(4).factors() == [StridedLocal(4), StridedColumn(4)]
    assert Fixed(4, 1).factors() == [FixedBlock(4), FixedSummary(4, 1)]
    per_head = PerHead((StridedLocal(4), StridedColumn(4)))
    mask = dense_allowed(per_head, 16, 16, num_heads=3)
    assert torch.equal(mask[0], dense_allowed(StridedLocal(4), 16, 16)[0])
    assert torch.equal(mask[1], dense_allowed(StridedColumn(4), 16, 16)[0])
    assert torch.equal(mask[2], mask[0])


ALL = {**PATTERNS, "local2d": Local2D(8, (2, 4), (2, 2)), "per_head": PerHead((StridedLocal(6), StridedColumn(6))), "column": StridedColumn(5)}


class _Module(nn.Module):
    pass


def _inputs(seed=0, length=L, heads=2):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(2, heads, length, 8, generator=generator) for _ in range(3)]


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("block_size", [5, 16])
def test_three_implementations_agree(name, block_size):
    pattern, module = ALL[name], _Module().eval()
    q, k, v = _inputs()
    padding = torch.ones(2, L, dtype=torch.bool)
    padding[1, -7:] = False  # right padding of row 1: its real queries never see the padded keys
    with torch.no_grad():
        eager, _ = pattern_attention(module, q, k, v, pattern, "eager", key_padding_mask=padding)
        sdpa, _ = pattern_attention(module, q, k, v, pattern, "sdpa", key_padding_mask=padding)
        blocked, _ = pattern_attention(module, q, k, v, pattern, "blocked", key_padding_mask=padding, block_size=block_size)
        flex, _ = pattern_attention(module, q, k, v, pattern, "flex", key_padding_mask=padding)
    real = padding[:, None, :, None].transpose(1, 2).expand_as(eager)
    for other in (sdpa, blocked, flex):
        torch.testing.assert_close(other[real], eager[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(ALL))
def test_blocked_gradients_equal_eager(name):
    pattern, module = ALL[name], _Module().train()
    grads = []
    for implementation in ("eager", "blocked"):
        q, k, v = [t.requires_grad_() for t in _inputs(seed=1)]
        output, _ = pattern_attention(module, q, k, v, pattern, implementation, block_size=7)
        (output * torch.linspace(-1, 1, output.numel()).view_as(output)).sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_offset_queries_equal_full():
    """Queries at an offset (decoding with a cache) see what the same rows see in the full pass."""
    pattern, module = Strided(6), _Module().eval()
    q, k, v = _inputs(seed=2)
    full, _ = pattern_attention(module, q, k, v, pattern, "eager")
    for implementation in ("blocked", "eager", "flex"):
        with torch.no_grad():
            tail, _ = pattern_attention(module, q[:, :, 40:], k, v, pattern, implementation, q_offset=40)
        torch.testing.assert_close(tail, full[:, 40:], atol=1e-5, rtol=0)


def test_blocked_is_sparse():
    """The blocked path gathers only the keys a block may see (not all L)."""
    q, k, v = _inputs(length=256, heads=1)
    from hf_txvariants.txv_patterns import gather_index

    _, index, _ = gather_index(Local1D(16), 256, 256, 16, torch.device("cpu"))
    assert index.shape == (16, 32)
    _, index, _ = gather_index(StridedLocal(16), 256, 256, 16, torch.device("cpu"))
    assert index.shape == (16, 31)
    order, index, _ = gather_index(StridedColumn(16), 256, 256, 16, torch.device("cpu"))
    assert index.shape == (16, 16) and order is not None


def test_flex_refuses_cpu_training():
    q, k, v = [t.requires_grad_() for t in _inputs()]
    with pytest.raises(ValueError, match="blocked"):
        pattern_attention(_Module().train(), q, k, v, Causal(), "flex")
    with pytest.raises(ValueError, match="implementation"):
        pattern_attention(_Module(), q, k, v, Causal(), "dense")
