"""The attention-pattern core: each pattern equals a naive loop from the paper's definition, and its three
implementations (dense eager/SDPA reference, FlexAttention block mask, blocked) give equal outputs and gradients."""

import pytest
import torch
from torch import nn

from hf_txvariants.txv_pattern_attention import choose_implementation, pattern_attention
from hf_txvariants.txv_pattern_flex import compiles_mask
from hf_txvariants.txv_pattern_tiled import tile_masks
from hf_txvariants.txv_pattern_tilings import from_block_raster, to_block_raster
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
    dense_allowed,
)

L = 48
# torch.compile's CPU code (inductor) is built for AVX2 / AVX512 kernels: under ATEN_CPU_CAPABILITY=default its C++
# does not compile (at::vec undeclared)
VECTOR_INDUCTOR = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def naive_allowed(name, q, k, stride=6, c=2, block=8, window=5):
    """Set definitions from Child et al. 2019 (sec. 4.2) and Parmar et al. 2018 (sec. 3.2), written as loops; every
    set is intersected with the causal k <= q."""
    if k > q:
        return False
    if name == "causal":
        return True
    if name == "window":
        return q - k < window
    if name == "strided":  # the union of A(1) and A(2) below (either convention gives the same union)
        return naive_allowed("strided_a1_paper", q, k, stride) or naive_allowed("strided_a2", q, k, stride)
    if name == "strided_a1_paper":  # "A(1)_i = {t, t+1, ..., i} for t = max(0, i - l)": l + 1 keys
        return k in range(max(0, q - stride), q + 1)
    if name == "strided_a1_reference":  # the reference code's reading: the previous l positions
        return k in range(max(0, q - stride + 1), q + 1)
    if name == "strided_a2":  # "A(2)_i = {j : (i - j) mod l = 0}"
        return (q - k) % stride == 0
    if name == "fixed":
        return naive_allowed("fixed_a1", q, k, stride) or naive_allowed("fixed_a2_paper", q, k, stride, c)
    if name == "fixed_a1":  # "A(1)_i = {j : (floor(j/l) = floor(i/l))}"
        return k // stride == q // stride
    if name == "fixed_a2_paper":  # "A(2)_i = {j : j mod l in {t, t+1, ..., l}}, where t = l - c"
        return k % stride in range(stride - c, stride + 1)
    if name == "fixed_a2_reference":  # the reference code's reading: the summary positions and the query itself
        return naive_allowed("fixed_a2_paper", q, k, stride, c) or k == q
    if name == "local1d":
        return k // block in (q // block, q // block - 1)
    if name == "local1d_memory":  # the block and the `memory` positions before it (Parmar et al.'s memory length)
        return k >= q // block * block - window
    raise KeyError(name)


PATTERNS = {
    "causal": Causal(),
    "window": SlidingWindow(5),
    "strided": Strided(6),
    "fixed": Fixed(6, 2),
    "local1d": Local1D(8),
    "local1d_memory": Local1D(8, 5),
    "strided_a1_paper": Strided(6, paper=True).parts[0],
    "strided_a1_reference": Strided(6).parts[0],
    "strided_a2": Strided(6).parts[1],
    "fixed_a1": Fixed(6, 2).parts[0],
    "fixed_a2_paper": Fixed(6, 2, paper=True).parts[1],
    "fixed_a2_reference": Fixed(6, 2).parts[1],
}


@pytest.mark.exact
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_matches_paper_definition(name):
    """Each pattern, and each factor of both conventions on its own (not only their union), equals its set."""
    mask = dense_allowed(PATTERNS[name], L, L)[0]
    expected = torch.tensor([[naive_allowed(name, q, k) for k in range(L)] for q in range(L)])
    assert torch.equal(mask, expected)


@pytest.mark.exact
def test_conventions_differ_only_in_the_factors():
    assert torch.equal(dense_allowed(Strided(6, paper=True), L, L), dense_allowed(Strided(6), L, L))
    assert torch.equal(dense_allowed(Fixed(6, 2, paper=True), L, L), dense_allowed(Fixed(6, 2), L, L))
    paper_a1, reference_a1 = Strided(6, paper=True).parts[0], Strided(6).parts[0]
    assert dense_allowed(paper_a1, L, L)[0, 20].sum() == 7 and dense_allowed(reference_a1, L, L)[0, 20].sum() == 6
    paper_a2 = Fixed(6, 2, paper=True).parts[1]
    assert not dense_allowed(paper_a2, L, L)[0, :4].any()  # before the first summary position: no key at all


@pytest.mark.exact
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
    assert torch.equal(
        from_block_raster(to_block_raster(raster, height, width, (bh, bw)), height, width, (bh, bw)), raster
    )


@pytest.mark.exact
def test_factors_and_per_head():
    assert Strided(4).factors() == [StridedLocal(4), StridedColumn(4)]
    assert Fixed(4, 1).factors() == [FixedBlock(4), FixedSummary(4, 1)]
    per_head = PerHead((StridedLocal(4), StridedColumn(4)))
    mask = dense_allowed(per_head, 16, 16, num_heads=3)
    assert torch.equal(mask[0], dense_allowed(StridedLocal(4), 16, 16)[0])
    assert torch.equal(mask[1], dense_allowed(StridedColumn(4), 16, 16)[0])
    assert torch.equal(mask[2], mask[0])


ALL = {
    **PATTERNS,
    "local2d": Local2D(8, (2, 4), (2, 2)),
    "local2d_partial_rows": Local2D(10, (2, 5), (3, 5)),  # L = 48: two whole rows of query blocks and a partial one
    "local1d_long_memory": Local1D(4, 10),
    "local2d_no_flange": Local2D(8, (4, 2), (0, 0)),
    "column": StridedColumn(5),
    "per_head_strided": PerHead(tuple(Strided(6).parts)),
    "per_head_strided_paper": PerHead(tuple(Strided(6, paper=True).parts)),
    "per_head_fixed": PerHead(tuple(Fixed(6, 2).parts)),
    "per_head_fixed_paper": PerHead(tuple(Fixed(6, 2, paper=True).parts)),
    "fixed_odd_length_blocks": Fixed(7, 3),  # L = 48 is no multiple of 7: the last tiles are padded
}


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
        blocked, _ = pattern_attention(
            module, q, k, v, pattern, "blocked", key_padding_mask=padding, block_size=block_size
        )
        flex, _ = pattern_attention(module, q, k, v, pattern, "flex", key_padding_mask=padding)
        auto, _ = pattern_attention(module, q, k, v, pattern, "auto", key_padding_mask=padding)
    real = padding[:, None, :, None].transpose(1, 2).expand_as(eager)
    for other in (sdpa, blocked, flex, auto):
        torch.testing.assert_close(other[real], eager[real], atol=1e-5, rtol=0)
    with torch.no_grad():  # and without padding, where single tiles take SDPA's is_causal kernel
        eager, _ = pattern_attention(module, q, k, v, pattern, "eager")
        blocked, _ = pattern_attention(module, q, k, v, pattern, "blocked")
    torch.testing.assert_close(blocked, eager, atol=1e-5, rtol=0)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", sorted(ALL))
def test_blocked_gradients_equal_eager(name, padded):
    pattern, module = ALL[name], _Module().train()
    padding = None
    if padded:
        padding = torch.ones(2, L, dtype=torch.bool)
        padding[0, -11:] = False
    grads = []
    for implementation in ("eager", "blocked"):
        q, k, v = [t.requires_grad_() for t in _inputs(seed=1)]
        output, _ = pattern_attention(module, q, k, v, pattern, implementation, block_size=7, key_padding_mask=padding)
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


@pytest.mark.parametrize("name", sorted(ALL))
def test_tiles_without_gathers(name, monkeypatch):
    """The tiled path never gathers keys, and its masks hold O(L * keys per query) entries, not O(L^2)."""
    import hf_txvariants.txv_pattern_gathered as gathered

    monkeypatch.setattr(gathered, "gather_index", lambda *a, **k: pytest.fail("the tiled path gathered keys"))
    q, k, v = _inputs(length=L)
    with torch.no_grad():
        pattern_attention(_Module().eval(), q, k, v, ALL[name], "blocked")
    length = 1024
    for part in ALL[name].parts if ALL[name].per_head else [ALL[name]]:
        entries = sum(mask.numel() for _, mask, _ in tile_masks(part, length, "cpu"))
        keys_per_query = int(dense_allowed(part, length, length)[0].sum(-1).max())
        assert entries <= 2 * length * (keys_per_query + 1), (name, entries, keys_per_query)


@pytest.mark.exact
def test_tile_shapes_follow_the_paper():
    """Strided rows: contiguous blocks of l (each with the previous one); columns: the transposed [L/l, l] grid;
    fixed: blocks of l, then the summary columns (c per block) shared by every query."""
    length, stride = 256, 16
    (band, band_mask, _), (columns, column_mask, column_causal) = tile_masks(Strided(stride), length, "cpu")
    assert band_mask.shape == (16, 16, 32) and column_mask.shape == (16, 16, 16) and not column_causal
    assert tile_masks(StridedColumn(stride), length, "cpu")[0][2]  # alone: plainly causal tiles (is_causal)
    (
        (_, block_mask, _),
        (_, summary_mask, _),
    ) = tile_masks(Fixed(stride, 2, paper=True), length, "cpu")
    assert block_mask.shape == (16, 16, 16) and summary_mask.shape == (1, length, 16 * 2)
    # Local 2D: a query block of (bh, bw) with the (bh + fh) x (bw + 2 fw) rectangle around and above it, as an image.
    height, width, (bh, bw), (fh, fw) = 8, 16, (2, 4), (2, 4)
    ((tiling, mask, _),) = tile_masks(Local2D(width, (bh, bw), (fh, fw)), height * width, "cpu")
    assert mask.shape == (height * width // (bh * bw), bh * bw, (bh + fh) * (bw + 2 * fw))
    raster = to_block_raster(torch.arange(height * width)[None], height, width, (bh, bw))[0]  # position -> raster
    tile = 2 * (width // bw) + 1  # query block at block row 2, block column 1: its memory block lies inside the image
    slots = tiling.key_positions(height * width, "cpu")[tile]
    rows, cols = raster[slots] // width, raster[slots] % width
    assert torch.equal(
        rows.view(bh + fh, bw + 2 * fw), torch.arange(2 * bh - fh, 3 * bh)[:, None].expand(-1, bw + 2 * fw)
    )
    assert torch.equal(cols.view(bh + fh, bw + 2 * fw), torch.arange(bw - fw, 2 * bw + fw)[None].expand(bh + fh, -1))


def test_block_mask_built_once(monkeypatch):
    import torch.nn.attention.flex_attention as flex

    calls = []
    original = flex.create_block_mask
    monkeypatch.setattr(flex, "create_block_mask", lambda *a, **k: calls.append(1) or original(*a, **k))
    q, k, v = _inputs(seed=3)
    pattern = Strided(4)
    with torch.no_grad():
        first, _ = pattern_attention(_Module().eval(), q, k, v, pattern, "flex")
        second, _ = pattern_attention(
            _Module().eval(), q, k, v, pattern, "flex", key_padding_mask=torch.ones(2, L, dtype=torch.bool)
        )
    assert len(calls) == 1
    torch.testing.assert_close(second, first)


def test_auto_picks_the_fastest_exact_path():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_implementation(Strided(4), "auto", "sdpa", cpu, True, False) == "blocked"
    assert choose_implementation(Strided(4), "auto", "sdpa", cuda, True, False) == "flex"
    assert choose_implementation(StridedColumn(4), "auto", "sdpa", cuda, True, False) == "blocked"
    assert choose_implementation(Strided(4), "auto", "sdpa", cuda, True, True) == "blocked"  # dropout: no flex
    assert choose_implementation(Strided(4), "auto", "sdpa", cpu, False, False) == "sdpa"  # decoding with a cache
    # decoding on CUDA: the dense mask, not a BlockMask and a kernel compiled for every new key length
    assert choose_implementation(Strided(4), "auto", "sdpa", cuda, False, False) == "sdpa"
    assert choose_implementation(Strided(4), "dense", "eager", cpu, True, False) == "eager"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's head_dim limit is a GPU kernel's")
def test_flex_small_heads_on_gpu():
    q, k, v = [t.cuda() for t in _inputs()]  # head_dim 8 < 16: zero-padded
    with torch.no_grad():
        flex, _ = pattern_attention(_Module().eval(), q, k, v, Strided(6), "flex")
        eager, _ = pattern_attention(_Module().eval(), q, k, v, Strided(6), "eager")
    torch.testing.assert_close(flex, eager, atol=1e-4, rtol=0)


def test_flex_refuses_cpu_training():
    q, k, v = [t.requires_grad_() for t in _inputs()]
    with pytest.raises(ValueError, match="blocked"):
        pattern_attention(_Module().train(), q, k, v, Causal(), "flex")
    with pytest.raises(ValueError, match="implementation"):
        pattern_attention(_Module(), q, k, v, Causal(), "sparse")


@pytest.mark.exact
@pytest.mark.parametrize("name", ["strided", "fixed", "fixed_a2_reference", "fixed_a2_paper", "per_head_fixed"])
def test_unions_run_fused_kernel_with_summaries_unmasked(name, monkeypatch):
    """On CPU a union of tilings takes one softmax over fused-kernel calls (combined by their log-sum-exp), never
    the materialised scores; the fixed pattern's summary keys of earlier blocks go to the kernel without a mask."""
    import hf_txvariants.txv_pattern_fused_union as fused_union
    import hf_txvariants.txv_pattern_tiled as tiled

    monkeypatch.setattr(tiled, "_merged_tilings_attention", lambda *a, **k: pytest.fail("scores materialised"))
    if name == "fixed_a2_paper":  # one tile of every query with every summary key: cut in groups, not one masked call
        monkeypatch.setattr(tiled, "_single_tiling_attention", lambda *a, **k: pytest.fail("one masked call"))
    pattern, length = ALL[name], 96
    q, k, v = [t.requires_grad_() for t in _inputs(seed=4, length=length)]
    blocked, _ = pattern_attention(_Module().train(), q, k, v, pattern, "blocked")
    eager, _ = pattern_attention(_Module().train(), q, k, v, pattern, "eager")
    torch.testing.assert_close(blocked, eager, atol=1e-5, rtol=0)
    for part in pattern.parts if pattern.per_head else [pattern]:
        pieces = fused_union._union_pieces(tile_masks(part, length, "cpu"), length, torch.float32, None)
        unmasked = [piece for piece in pieces if piece.bias is None and not piece.causal]
        assert bool(unmasked) == ("fixed" in name and not isinstance(part, FixedBlock)), part
        for piece in unmasked:  # every pair of an unmasked piece is allowed
            tiling, mask, _ = tile_masks(part, length, "cpu")[piece.tiling]
            assert mask[0, piece.rows, piece.keys].all()
        causal = [piece for piece in pieces if piece.causal]  # the blocks of the merged fixed pattern: is_causal
        assert len(causal) == any(isinstance(factor, FixedBlock) for factor in part.factors())
        for piece in causal:
            mask = tile_masks(part, length, "cpu")[piece.tiling][1]
            assert torch.equal(mask, torch.ones_like(mask).tril())


@pytest.mark.slow
@pytest.mark.release_independent
@pytest.mark.skipif(
    not VECTOR_INDUCTOR, reason="torch.compile lowers FlexAttention for CPU only with AVX2 (inductor's flex_cpu)"
)
def test_compiled_flex_keeps_its_fused_kernel_past_the_global_recompile_limit(caplog):
    """Each pattern is a kernel of its own; past torch's recompile limit torch.compile would run flex_attention unfused
    (every score materialised: on an H100 at 16k, 305 ms and 26.8 GB a forward against 9 ms and 0.26 GB). The
    compiled call runs under FLEX_RECOMPILE_LIMIT, so three patterns under a global limit of 1 still compile,
    with no fallback."""
    import logging

    from hf_txvariants import txv_pattern_flex

    torch._dynamo.reset()
    q, k, v = _inputs()
    with torch._dynamo.config.patch(recompile_limit=1), torch.no_grad(), caplog.at_level(logging.WARNING):
        for stride in (2, 4, 8):
            pattern = Strided(stride)
            compiled = txv_pattern_flex.flex_pattern_attention(q, k, v, pattern, 0.5, compile=True)
            reference = txv_pattern_flex.flex_pattern_attention(q, k, v, pattern, 0.5, compile=False)
            torch.testing.assert_close(compiled, reference, atol=1e-5, rtol=1e-4)  # fused vs unfused sums
    assert not [record for record in caplog.records if "recompile_limit" in record.getMessage()]
    torch._dynamo.reset()


def test_the_compiled_build_is_chosen_for_long_cuda_masks():
    """Eagerly, a block mask is first the whole [heads, q_len, k_len] grid (with int64 intermediates): on an H100 at
    64k three patterns ran out of memory. Long CUDA masks are built by a compiled kernel, block by block."""
    assert compiles_mask("cuda", 8, 65536, 65536) and compiles_mask("cuda", None, 65536, 65536)
    assert not compiles_mask("cuda", None, 4096, 4096)
    assert not compiles_mask("cpu", 8, 65536, 65536)  # CPU: FlexAttention is for inference at moderate lengths


@pytest.mark.exact  # integer block tables
@pytest.mark.slow
@pytest.mark.release_independent
@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=pytest.mark.skipif(not VECTOR_INDUCTOR, reason="inductor's CPU code needs AVX2")),
        *(["cuda"] if torch.cuda.is_available() else []),
    ],
)
@pytest.mark.parametrize(
    "pattern",
    [Strided(64), PerHead(tuple(Strided(64).factors())), Fixed(64, 8), PerHead(tuple(Fixed(64, 8).factors()))],
    ids=["strided", "strided per head", "fixed", "fixed per head"],
)
def test_compiled_block_mask_equals_the_eager_one(pattern, device):
    """The compiled build gives the eager build's blocks: the same partial and full blocks of every query block,
    in the same order, at a length that is no multiple of the block size."""
    from hf_txvariants.txv_pattern_flex import flex_block_mask

    eager, compiled = (flex_block_mask(pattern, 4, 1000, 1000, device, compile_mask=flag) for flag in (False, True))
    assert torch.equal(compiled.to_dense(), eager.to_dense())
    for counts, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        assert torch.equal(getattr(compiled, counts), getattr(eager, counts)), counts
        used = torch.arange(eager.kv_indices.shape[-1], device=device) < getattr(eager, counts)[..., None]
        assert torch.equal(getattr(compiled, indices)[used], getattr(eager, indices)[used]), indices


@pytest.mark.slow
@pytest.mark.release_independent
@pytest.mark.skipif(not VECTOR_INDUCTOR, reason="inductor's CPU code needs AVX2")
def test_compiled_mask_builds_stay_compiled_past_the_global_recompile_limit(caplog):
    """Each pattern's mask is a kernel of its own; past torch's recompile limit the build would run eagerly, on the
    whole [heads, L, L] grid (out of an H100's memory at 64k). The compiled builds run under FLEX_RECOMPILE_LIMIT."""
    import logging

    from hf_txvariants.txv_pattern_flex import flex_block_mask

    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1), caplog.at_level(logging.WARNING):
        for stride in (2, 4, 8):
            flex_block_mask(Strided(stride), 2, 256, 256, "cpu", compile_mask=True)
    assert not [record for record in caplog.records if "recompile_limit" in record.getMessage()]
    torch._dynamo.reset()
