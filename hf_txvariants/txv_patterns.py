"""Sparse attention patterns (Child et al. 2019, Parmar et al. 2018), each a predicate `allowed(q_idx, kv_idx, head)`
on broadcastable integer tensors (True = query may attend to key), with the tilings that hold its pairs
(`txv_pattern_tilings`):

* `Causal`, `SlidingWindow(w)`: k <= q (and q - k < w).
* `StridedLocal(w)` / `StridedColumn(l)` and their union `Strided(l)`: the previous w positions / every l-th one.
* `FixedBlock(l)` / `FixedSummary(l, c)` and their union `Fixed(l, c)`: the own block of l / the last c positions
  of every block (and the query itself unless `include_query=False`).
* `Local1D(b, m)`: a query block of b attends to itself and the m positions before it (default m = b: the previous
  block).
* `Local2D(width, query_shape, memory_flange)`: positions in block-raster order (see
  `txv_pattern_tilings.to_block_raster`); a query block of (bh, bw) attends to the keys of its memory block, which
  extends it by fh rows above and fw columns on either side, that precede it in block-raster order.
* `Union(*patterns)`, `PerHead(patterns)` (head h uses patterns[h % n]).
Every pattern is causal (the models here are autoregressive).

`dense_allowed` is a pattern's full boolean mask (the eager and SDPA reference); `PatternCache` keeps what is built
from a pattern (tile masks, block masks, gather indices) once per pattern, lengths and device.

Each pattern runs through several implementations that give equal results: tiles of dense attention
(`txv_pattern_tiled`, a union on CPU through `txv_pattern_fused_union`), FlexAttention (`txv_pattern_flex`) and
gathering (`txv_pattern_gathered`, for patterns without tilings); `txv_pattern_attention` chooses one per call and
holds the layer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers.utils.import_utils import is_tracing

from .txv_pattern_tilings import Band, Blocks, Columns, MemoryBlocks2D, SummaryColumns, Tiling, WholeSequence


# ------------------------------------------------------------------------------------------------------ patterns
class AttentionPattern:
    per_head = False
    every_query_sees_a_key = True  # False: some queries may see no key (their output is zero)
    causal_in_tiles = False  # its one tiling's tiles are plainly causal (SDPA's is_causal kernel runs them)

    def query_order(self, q_len: int, device=None) -> torch.Tensor | None:
        """A permutation of the queries that makes blocks of consecutive ones share keys (None = position order)."""
        return None

    def allowed(self, q_idx: torch.Tensor, kv_idx: torch.Tensor, head: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def factors(self) -> list[AttentionPattern]:
        """The parts a factorised pattern is made of (itself for a simple one)."""
        return [self]

    def tilings(self) -> list[Tiling] | None:
        """Tilings whose tiles together hold every (query, key) pair the pattern allows (None: not tileable)."""
        return None


@dataclass(frozen=True)
class Causal(AttentionPattern):
    causal_in_tiles = True

    def allowed(self, q_idx, kv_idx, head=None):
        return kv_idx <= q_idx

    def tilings(self):
        return [WholeSequence()]


@dataclass(frozen=True)
class SlidingWindow(AttentionPattern):
    window: int

    def allowed(self, q_idx, kv_idx, head=None):
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < self.window)

    def tilings(self):
        return [Band(self.window)]


@dataclass(frozen=True)
class StridedLocal(SlidingWindow):
    """Child et al. A^(1) of the strided pattern: the previous `window` positions (the reference code: window = l;
    the paper's {max(0, i - l), ..., i}: window = l + 1)."""


@dataclass(frozen=True)
class StridedColumn(AttentionPattern):
    """Child et al. A^(2) of the strided pattern: (q - k) mod l == 0."""

    stride: int
    causal_in_tiles = True

    def allowed(self, q_idx, kv_idx, head=None):
        distance = q_idx - kv_idx
        return (distance >= 0) & (torch.remainder(distance, self.stride) == 0)

    def query_order(self, q_len, device=None):
        # The paper's transpose: queries grouped by q mod l see the same keys (those with k = q mod l).
        positions = torch.arange(q_len, device=device)
        return torch.argsort(torch.remainder(positions, self.stride) * q_len + positions)

    def tilings(self):
        return [Columns(self.stride)]


@dataclass(frozen=True)
class FixedBlock(AttentionPattern):
    """Child et al. A^(1) of the fixed pattern: floor(k / l) == floor(q / l)."""

    stride: int
    causal_in_tiles = True

    def allowed(self, q_idx, kv_idx, head=None):
        return (kv_idx <= q_idx) & (
            torch.div(kv_idx, self.stride, rounding_mode="floor")
            == torch.div(q_idx, self.stride, rounding_mode="floor")
        )

    def tilings(self):
        return [Blocks(self.stride)]


@dataclass(frozen=True)
class FixedSummary(AttentionPattern):
    """Child et al. A^(2) of the fixed pattern: k mod l >= l - c (the c summary positions of every block), k <= q;
    with `include_query` (the reference code) also the query itself, so that no row is empty; without it (the paper)
    a query before the first summary position sees nothing and gets a zero output."""

    stride: int
    summary: int
    include_query: bool = True

    @property
    def every_query_sees_a_key(self):
        return self.include_query

    def allowed(self, q_idx, kv_idx, head=None):
        summary = torch.remainder(kv_idx, self.stride) >= self.stride - self.summary
        if self.include_query:
            summary = summary | (kv_idx == q_idx)
        return (kv_idx <= q_idx) & summary

    def tilings(self):
        tiles = [SummaryColumns(self.stride, self.summary)]
        # The query itself (when it is no summary position) from its own block's tile.
        return tiles + [Blocks(self.stride)] if self.include_query else tiles


@dataclass(frozen=True)
class Union(AttentionPattern):
    parts: tuple

    def allowed(self, q_idx, kv_idx, head=None):
        result = self.parts[0].allowed(q_idx, kv_idx, head)
        for part in self.parts[1:]:
            result = result | part.allowed(q_idx, kv_idx, head)
        return result

    def factors(self):
        return list(self.parts)

    def tilings(self):
        tilings = [part.tilings() for part in self.parts]
        return None if any(t is None for t in tilings) else [t for part in tilings for t in part]


def Strided(stride: int, paper: bool = False) -> Union:
    """A^(1) the previous l positions (`paper`: l + 1 positions, {max(0, i - l), ..., i}) and A^(2) every l-th."""
    return Union((StridedLocal(stride + 1 if paper else stride), StridedColumn(stride)))


def Fixed(stride: int, summary: int, paper: bool = False) -> Union:
    """A^(1) the own block and A^(2) the summary positions (`paper`: without the query itself; the union is the
    same either way, the query being in its own block)."""
    return Union((FixedBlock(stride), FixedSummary(stride, summary, include_query=not paper)))


@dataclass(frozen=True)
class Local1D(AttentionPattern):
    """Parmar et al. local 1D: a query block of `block` positions sees itself and the `memory` positions before it
    (default: one block, i.e. key blocks floor(q / b) - 1 and floor(q / b)), causally."""

    block: int
    memory: int | None = None

    def allowed(self, q_idx, kv_idx, head=None):
        block_start = torch.div(q_idx, self.block, rounding_mode="floor") * self.block
        memory = self.block if self.memory is None else self.memory
        return (kv_idx <= q_idx) & (kv_idx >= block_start - memory)

    def tilings(self):
        return [Band(self.block, self.memory)]


@dataclass(frozen=True)
class Local2D(AttentionPattern):
    """Parmar et al. local 2D over an image `width` positions wide (channels included), laid out in block-raster
    order: query blocks of `query_shape` (bh, bw) in raster order, pixels inside a block in raster order. Query block
    (R, C) sees the keys at rows [R*bh - fh, R*bh + bh) and columns [C*bw - fw, C*bw + bw + fw) that come before the
    query in block-raster order."""

    width: int
    query_shape: tuple = (8, 8)
    memory_flange: tuple = (8, 8)

    def row_col(self, index):
        bh, bw = self.query_shape
        block, inside = torch.div(index, bh * bw, rounding_mode="floor"), torch.remainder(index, bh * bw)
        blocks_per_row = self.width // bw
        block_row, block_col = (
            torch.div(block, blocks_per_row, rounding_mode="floor"),
            torch.remainder(block, blocks_per_row),
        )
        row = block_row * bh + torch.div(inside, bw, rounding_mode="floor")
        col = block_col * bw + torch.remainder(inside, bw)
        return row, col

    def in_memory_block(self, q_idx, kv_idx):
        """Whether key k lies in the memory block of query q's block (before or after q)."""
        bh, bw = self.query_shape
        fh, fw = self.memory_flange
        q_row, q_col = self.row_col(q_idx)
        k_row, k_col = self.row_col(kv_idx)
        top = torch.div(q_row, bh, rounding_mode="floor") * bh
        left = torch.div(q_col, bw, rounding_mode="floor") * bw
        return (k_row >= top - fh) & (k_row < top + bh) & (k_col >= left - fw) & (k_col < left + bw + fw)

    def allowed(self, q_idx, kv_idx, head=None):
        return (kv_idx <= q_idx) & self.in_memory_block(q_idx, kv_idx)

    def tilings(self):
        return [MemoryBlocks2D(self)]


@dataclass(frozen=True)
class PerHead(AttentionPattern):
    """Head h uses `parts[h % len(parts)]`."""

    parts: tuple
    per_head = True

    def allowed(self, q_idx, kv_idx, head=None):
        if head is None:
            raise ValueError("PerHead patterns need the head index")
        head = torch.as_tensor(head)
        result = torch.zeros((), dtype=torch.bool, device=head.device)
        for number, part in enumerate(self.parts):
            result = torch.where(torch.remainder(head, len(self.parts)) == number, part.allowed(q_idx, kv_idx), result)
        return result

    def factors(self):
        return list(self.parts)


def dense_allowed(
    pattern: AttentionPattern, q_len: int, k_len: int, device=None, q_offset: int = 0, num_heads: int = 1
):
    """`[num_heads or 1, q_len, k_len]` bool; query i has absolute position q_offset + i."""
    q_idx = torch.arange(q_len, device=device)[:, None] + q_offset
    kv_idx = torch.arange(k_len, device=device)[None, :]
    if pattern.per_head:
        head = torch.arange(num_heads, device=device)[:, None, None]
        return pattern.allowed(q_idx[None], kv_idx[None], head)
    return pattern.allowed(q_idx, kv_idx)[None]


# ------------------------------------------------------------------------------------------------------ cache
class PatternCache(OrderedDict):
    """A small least-recently-used cache: what is built from a pattern (masks, BlockMasks, indices) is built once per
    pattern, lengths and device."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def get_or_build(self, key, build):
        if key in self:  # also while tracing: the cached tensors enter the graph as constants
            if not is_tracing():
                self.move_to_end(key)
            return self[key]
        if is_tracing():
            return build()  # torch.compile / torch.export: the traced graph holds it, the cache is left alone
        value = self[key] = build()
        if len(self) > self.capacity:
            self.popitem(last=False)
        return value
