"""Sparse attention patterns, each usable through several implementations that give equal results.

A pattern is a predicate `allowed(q_idx, kv_idx, head)` on broadcastable integer tensors (True = query may attend to
key). From it come:

* `tiled_attention` ("blocked"): the pattern as tiles of dense attention, the way the papers compute it (Child et al.
  2019 sec. 4; Parmar et al. 2018 sec. 3.2): the sequence is reshaped so that every factor is a batch of dense tiles
  (a band of contiguous blocks for local / sliding-window attention, the transposed [L/l, l] grid for strided
  columns, contiguous blocks for fixed blocks, the summary columns for fixed summaries, for local 2D each query
  block with its memory block cut from the keys laid out as an image), no gather, memory O(L * keys per query).
  A single factor runs every tile through the fused SDPA kernel (`is_causal=True` where the tile is plainly causal);
  a union of factors (merged mode; the fixed summaries with the query itself) takes one softmax over all its tiles,
  each key counted once: on CPU every tiling through torch's fused kernel, the results combined by their
  log-sum-exp (flash-attention style) and differentiated by the kernel's own backward (`_FusedUnion`); elsewhere,
  or with attention dropout, with plain tensor ops. It trains on CPU.
* `dense_allowed`: the full `[heads or 1, q_len, k_len]` boolean mask, for the eager (or SDPA) reference;
* `flex_block_mask`: a FlexAttention `BlockMask`, built once per (pattern, lengths, device) and cached (fused kernels
  on CUDA; on CPU torch 2.13 runs FlexAttention in inference only, without gradients).

`pattern_attention` dispatches between them ("auto": the fastest exact path for the device). A query that may see no
key at all (possible only in the paper's fixed summary set, or for padding) gets a zero output on every path.
Patterns (Child et al. 2019, Parmar et al. 2018):

* `Causal`, `SlidingWindow(w)`: k <= q (and q - k < w).
* `StridedLocal(w)` / `StridedColumn(l)` and their union `Strided(l)`: the previous w positions / every l-th one.
* `FixedBlock(l)` / `FixedSummary(l, c)` and their union `Fixed(l, c)`: the own block of l / the last c positions
  of every block (and the query itself unless `include_query=False`).
* `Local1D(b, m)`: a query block of b attends to itself and the m positions before it (default m = b: the previous
  block).
* `Local2D(width, query_shape, memory_flange)`: positions in block-raster order (see `to_block_raster`); a query
  block of (bh, bw) attends to the keys of its memory block, which extends it by fh rows above and fw columns on
  either side, that precede it in block-raster order.
* `Union(*patterns)`, `PerHead(patterns)` (head h uses patterns[h % n]).
Every pattern is causal (the models here are autoregressive).

`PatternSelfAttention` is the multi-head self-attention layer of the pattern models (Sparse and Image Transformer).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
from transformers.utils.import_utils import is_tracing

from .txv_attention import additive_mask, attention_function, eager_attention_forward
from .txv_mha import MultiHeadAttention, cache_past_length


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


def to_block_raster(x: torch.Tensor, height: int, width: int, query_shape) -> torch.Tensor:
    """`[batch, height * width, ...]` in raster order -> the same positions in block-raster order."""
    bh, bw = query_shape
    rest = x.shape[2:]
    x = x.reshape(x.shape[0], height // bh, bh, width // bw, bw, *rest).transpose(2, 3)
    return x.reshape(x.shape[0], height * width, *rest)


def from_block_raster(x: torch.Tensor, height: int, width: int, query_shape) -> torch.Tensor:
    """Inverse of `to_block_raster`."""
    bh, bw = query_shape
    rest = x.shape[2:]
    x = x.reshape(x.shape[0], height // bh, width // bw, bh, bw, *rest).transpose(2, 3)
    return x.reshape(x.shape[0], height * width, *rest)


# ------------------------------------------------------------------------------------------------------ dense
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


# ------------------------------------------------------------------------------------------------------ tilings
def _pad_length(x: torch.Tensor, length: int) -> torch.Tensor:
    """`x [B, H, L, D]` padded with zeros at the end of dim 2 to `length` positions."""
    return x if x.shape[2] == length else nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))


class Tiling:
    """A layout of a sequence in tiles: `tile_queries` / `tile_keys` turn `[B, H, L, D]` into `[B, H, T, tq, D]` /
    `[B, H, T, tk, D]` (reshapes and slices, padded with zeros at the end), `query_positions` / `key_positions` give the
    absolute position of every slot (`[T, tq]`, `[T, tk]`; out-of-sequence slots are < 0 or >= L), and
    `covers(q, k)` says whether key k sits in a tile of query q."""

    def size(self, length: int) -> int:
        return length

    def tile_queries(self, x: torch.Tensor) -> torch.Tensor:
        size = self.size(x.shape[2])
        x = _pad_length(x, math.ceil(x.shape[2] / size) * size)
        return x.view(*x.shape[:2], -1, size, x.shape[-1])

    def tile_keys(self, x: torch.Tensor) -> torch.Tensor:
        return self.tile_queries(x)

    def untile_queries(self, y: torch.Tensor, length: int) -> torch.Tensor:
        return y.reshape(*y.shape[:2], -1, y.shape[-1])[:, :, :length]

    def query_positions(self, length: int, device) -> torch.Tensor:
        size = self.size(length)
        return torch.arange(math.ceil(length / size) * size, device=device).view(-1, size)

    def key_positions(self, length: int, device) -> torch.Tensor:
        return self.query_positions(length, device)

    def covers(self, q_idx, kv_idx):
        raise NotImplementedError


@dataclass(frozen=True)
class WholeSequence(Tiling):
    """One tile: every query with every key (plain causal attention)."""

    def covers(self, q_idx, kv_idx):
        return torch.ones_like(q_idx - kv_idx, dtype=torch.bool)


@dataclass(frozen=True)
class Blocks(Tiling):
    """Contiguous blocks of `block`: a query sees the keys of its own block."""

    block: int

    def size(self, length):
        return self.block

    def covers(self, q_idx, kv_idx):
        return torch.div(q_idx, self.block, rounding_mode="floor") == torch.div(
            kv_idx, self.block, rounding_mode="floor"
        )


@dataclass(frozen=True)
class Band(Blocks):
    """Contiguous blocks of `block` queries; each sees the keys of its own block and the `memory` positions before it
    (default: the previous block; before the sequence's start: out-of-sequence slots)."""

    memory: int | None = None

    @property
    def _memory(self) -> int:
        return self.block if self.memory is None else self.memory

    def tile_keys(self, x):
        # Overlapping windows of memory + block over the sequence padded by `memory` in front: a strided view.
        tiles = math.ceil(x.shape[2] / self.block)
        padded = nn.functional.pad(x, (0, 0, self._memory, tiles * self.block - x.shape[2]))
        return padded.unfold(2, self._memory + self.block, self.block).transpose(-1, -2)

    def key_positions(self, length, device):
        own = self.query_positions(length, device)
        return torch.cat([own[:, :1] - self._memory + torch.arange(self._memory, device=device), own], dim=1)

    def covers(self, q_idx, kv_idx):
        block_start = torch.div(q_idx, self.block, rounding_mode="floor") * self.block
        return (kv_idx >= block_start - self._memory) & (kv_idx < block_start + self.block)


@dataclass(frozen=True)
class Columns(Tiling):
    """The transposed `[L / stride, stride]` grid: tile c holds positions c, c + stride, c + 2 stride, ..."""

    stride: int

    def tile_queries(self, x):
        rows = math.ceil(x.shape[2] / self.stride)
        x = _pad_length(x, rows * self.stride)
        return x.view(*x.shape[:2], rows, self.stride, x.shape[-1]).transpose(2, 3)

    def untile_queries(self, y, length):
        return y.transpose(2, 3).reshape(*y.shape[:2], -1, y.shape[-1])[:, :, :length]

    def query_positions(self, length, device):
        rows = math.ceil(length / self.stride)
        return torch.arange(rows * self.stride, device=device).view(rows, self.stride).t()

    def covers(self, q_idx, kv_idx):
        return torch.remainder(q_idx - kv_idx, self.stride) == 0


@dataclass(frozen=True)
class SummaryColumns(Tiling):
    """One tile: every query with the last `summary` positions of every block of `stride` (a strided slice)."""

    stride: int
    summary: int

    def tile_keys(self, x):
        blocks = math.ceil(x.shape[2] / self.stride)
        x = _pad_length(x, blocks * self.stride).view(*x.shape[:2], blocks, self.stride, x.shape[-1])
        return x[:, :, :, self.stride - self.summary :].reshape(*x.shape[:2], 1, blocks * self.summary, x.shape[-1])

    def key_positions(self, length, device):
        blocks = math.ceil(length / self.stride)
        starts = torch.arange(blocks, device=device)[:, None] * self.stride + self.stride - self.summary
        return (starts + torch.arange(self.summary, device=device)[None]).view(1, -1)

    def covers(self, q_idx, kv_idx):
        return torch.remainder(kv_idx, self.stride) >= self.stride - self.summary


@dataclass(frozen=True)
class MemoryBlocks2D(Tiling):
    """Local 2D (Parmar et al. sec. 3.2) as 2D tiles: every query block of (bh, bw) positions (contiguous in
    block-raster order) with its memory block, the (bh + fh) x (bw + 2 fw) rectangle of the image around and above
    it, cut from the keys laid out as an image (raster order, zero-padded by the flanges) by two `unfold`s: no
    gather, memory O(L * keys per query). The sequence is padded to whole rows of query blocks."""

    pattern: Local2D

    def _padded_length(self, length: int) -> int:
        row_of_blocks = self.pattern.width * self.pattern.query_shape[0]
        return math.ceil(length / row_of_blocks) * row_of_blocks

    def size(self, length):
        return self.pattern.query_shape[0] * self.pattern.query_shape[1]

    def tile_queries(self, x):
        x = _pad_length(x, self._padded_length(x.shape[2]))
        return x.view(*x.shape[:2], -1, self.size(x.shape[2]), x.shape[-1])

    def query_positions(self, length, device):
        return torch.arange(self._padded_length(length), device=device).view(-1, self.size(length))

    def tile_keys(self, x):
        (bh, bw), (fh, fw), width = self.pattern.query_shape, self.pattern.memory_flange, self.pattern.width
        x = _pad_length(x, self._padded_length(x.shape[2]))
        rows = x.shape[2] // width
        image = from_block_raster(x.transpose(1, 2), rows, width, (bh, bw)).transpose(1, 2)  # [B, H, L, D] raster
        image = image.reshape(*x.shape[:2], rows, width, x.shape[-1])
        image = nn.functional.pad(image, (0, 0, fw, fw, fh, 0))  # the flanges outside the image: zeros
        tiles = image.unfold(2, bh + fh, bh).unfold(3, bw + 2 * fw, bw)  # [B, H, R, C, D, bh + fh, bw + 2 fw]
        tiles = tiles.permute(0, 1, 2, 3, 5, 6, 4)
        return tiles.reshape(*x.shape[:2], -1, (bh + fh) * (bw + 2 * fw), x.shape[-1])

    def key_positions(self, length, device):
        # The tiles of the positions themselves (+ 1, so that the zero padding outside the image becomes -1).
        positions = torch.arange(1, self._padded_length(length) + 1, device=device)
        return self.tile_keys(positions[None, None, :, None])[0, 0, :, :, 0] - 1

    def covers(self, q_idx, kv_idx):
        return self.pattern.in_memory_block(q_idx, kv_idx)


# ------------------------------------------------------------------------------------------------------ tiled
class _LRU(OrderedDict):
    """A small least-recently-used cache (masks and BlockMasks are built once per pattern, length and device)."""

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


_TILE_MASKS = _LRU(32)


def tile_masks(pattern: AttentionPattern, length: int, device) -> list[tuple[Tiling, torch.Tensor, bool]]:
    """For every tiling of `pattern`: its bool mask `[T, tq, tk]` (the pattern's pairs in this tiling and in no
    earlier one: each pair is counted once) and whether the tiles are plainly causal (`causal_in_tiles`)."""

    def build():
        tilings = pattern.tilings()
        masks = []
        for number, tiling in enumerate(tilings):
            q_idx = tiling.query_positions(length, device)[:, :, None]
            kv_idx = tiling.key_positions(length, device)[:, None, :]
            in_tile = tiling.covers(q_idx, kv_idx) & (kv_idx >= 0)
            mask = pattern.allowed(q_idx, kv_idx) & in_tile
            for earlier in tilings[:number]:
                mask = mask & ~earlier.covers(q_idx, kv_idx)
            masks.append((tiling, mask & (kv_idx < length)))
        # A tiling whose pairs all sit in earlier ones adds nothing (e.g. the fixed pattern's own-block tile for the
        # query itself, when the block factor holds the whole block).
        masks = [(tiling, mask) for tiling, mask in masks if mask.any()] or masks[:1]
        plain_causal = len(masks) == 1 and pattern.causal_in_tiles
        return [(tiling, mask, plain_causal) for tiling, mask in masks]

    return _TILE_MASKS.get_or_build((pattern, length, str(device)), build)


def _tile_padding(tiling: Tiling, key_padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """`key_padding_mask [B, L]` (True = real) in the tiling's key layout, `[B, 1, T, 1, tk]`."""
    if key_padding_mask is None:
        return None
    tiled = tiling.tile_keys(key_padding_mask[:, None, :, None].to(torch.float32))
    return tiled.squeeze(-1)[:, :, :, None, :] > 0.5


def tiled_attention(query, key, value, pattern, scaling, key_padding_mask=None, dropout=0.0, training=False):
    """`pattern` as tiles of dense attention (see the module docstring). `query`/`key`/`value [B, H, L, D]` (same
    length, no cache), `key_padding_mask [B, L]` bool (True = real). Returns `[B, L, H, D]`."""
    if pattern.per_head:
        parts = len(pattern.parts)
        output = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
        for number, part in enumerate(pattern.parts):
            heads = slice(number, None, parts)
            output[:, :, heads] = tiled_attention(
                query[:, heads], key[:, heads], value[:, heads], part, scaling, key_padding_mask, dropout, training
            )
        return output
    dropout = dropout if training else 0.0
    tiles = tile_masks(pattern, query.shape[2], query.device)
    bias_key = (pattern, query.shape[2], str(query.device), query.dtype)  # the additive masks, cached like the masks
    fused_union = (
        _HAS_FUSED_CPU_KERNEL
        and query.device.type == "cpu"
        and not dropout
        and query.dtype in (torch.float32, torch.bfloat16)
    )
    # A union of tilings, or one tile of every query (cut in groups by the union's pieces), goes through the fused
    # union on CPU; single tilings of many tiles through SDPA directly.
    one_tile = len(tiles) == 1 and tiles[0][1].shape[0] == 1 and not tiles[0][2]
    if fused_union and (len(tiles) > 1 or one_tile):
        output = _fused_union_attention(
            query, key, value, tiles, bias_key, scaling, key_padding_mask, pattern.every_query_sees_a_key
        )
    elif len(tiles) == 1:
        output = _single_tiling_attention(
            query, key, value, *tiles[0], pattern.every_query_sees_a_key, bias_key, scaling, key_padding_mask, dropout
        )
    else:
        output = _merged_tilings_attention(query, key, value, tiles, bias_key, scaling, key_padding_mask, dropout)
    return output.transpose(1, 2).contiguous()


def _sdpa_layout(tiled: torch.Tensor) -> torch.Tensor:
    """`[B, H, T, t, D]` -> `[B * T, H, t, D]`: tiles join the batch (a view when the heads are a view of
    `[B, L, H, D]`, as projected states are)."""
    batch, heads, tiles, length, dim = tiled.shape
    return tiled.transpose(1, 2).reshape(batch * tiles, heads, length, dim)


_TILE_BIASES = _LRU(32)


def _single_tiling_attention(
    query, key, value, tiling, mask, plain_causal, pattern_sees_keys, bias_key, scaling, key_padding_mask, dropout
):
    """Every tile through the fused SDPA kernel: `is_causal=True` when the tile is plainly causal and nothing is
    padded, else with the tile mask (a 4-D additive mask: torch's fused CPU kernel takes no 3-D one and no bool one
    without falling back to the math kernel); queries that see no key get zeros."""
    batch, heads, length, dim = query.shape
    tiled_query = tiling.tile_queries(query)
    tiles, tile_length = tiled_query.shape[2:4]
    tiled_query, tiled_key, tiled_value = (
        _sdpa_layout(tiled_query),
        _sdpa_layout(tiling.tile_keys(key)),
        _sdpa_layout(tiling.tile_keys(value)),
    )
    sdpa = nn.functional.scaled_dot_product_attention
    if plain_causal and key_padding_mask is None:
        output = sdpa(tiled_query, tiled_key, tiled_value, dropout_p=dropout, is_causal=True, scale=scaling)
    else:
        padding = _tile_padding(tiling, key_padding_mask)
        if padding is None:
            bias = _TILE_BIASES.get_or_build(bias_key, lambda: additive_mask(mask[:, None], query.dtype))
            bias = bias if batch == 1 else bias.repeat(batch, 1, 1, 1)
        else:
            mask = (mask & padding).transpose(1, 2).reshape(batch * tiles, 1, *mask.shape[-2:])
            bias = additive_mask(mask, query.dtype)
        output = sdpa(tiled_query, tiled_key, tiled_value, attn_mask=bias, dropout_p=dropout, scale=scaling)
        if padding is not None or not pattern_sees_keys:
            output = output * mask.any(-1, keepdim=True).reshape(-1, 1, tile_length, 1).to(output.dtype)
    output = output.view(batch, tiles, heads, tile_length, -1).transpose(1, 2)
    return tiling.untile_queries(output, length)


def _merged_tilings_attention(query, key, value, tiles, bias_key, scaling, key_padding_mask, dropout):
    """One softmax over the tiles of several tilings (a union pattern) with plain tensor ops (attention dropout, or
    off CPU where the fused union does not run): each tiling's scores `[.., T, tq, tk]` are
    laid out in query order `[.., L, tk]` (untiled like queries), joined along the keys and normalised by one softmax,
    then split and tiled back to weight each tiling's values. Each key is in one tiling only (see `tile_masks`), so
    this is the pattern's softmax exactly; memory O(L * keys per query)."""
    length = query.shape[2]
    scores = []
    for tiling, _, _ in tiles:
        tile_scores = torch.matmul(tiling.tile_queries(query), tiling.tile_keys(key).transpose(-1, -2))
        scores.append(tiling.untile_queries(tile_scores, length))
    widths = [part.shape[-1] for part in scores]
    scores = torch.cat(scores, dim=-1).float() * scaling

    def allowed(padding_mask=None):  # [1 or B, 1, L, sum of tk]
        parts = []
        for tiling, mask, _ in tiles:
            padding = _tile_padding(tiling, padding_mask)
            mask = mask[None, None] if padding is None else mask & padding
            parts.append(tiling.untile_queries(mask, length))
        return torch.cat(parts, dim=-1)

    if key_padding_mask is None:
        bias = _TILE_BIASES.get_or_build(bias_key, lambda: additive_mask(allowed(), torch.float32))
        weights = torch.softmax(scores + bias, dim=-1)
    else:
        mask = allowed(key_padding_mask)
        weights = torch.softmax(scores + additive_mask(mask, torch.float32), dim=-1)
        weights = weights * mask.any(-1, keepdim=True)  # queries that see no key get zeros
    weights = nn.functional.dropout(weights, p=dropout) if dropout else weights
    output = 0.0
    for (tiling, _, _), tile_weights in zip(tiles, weights.split(widths, dim=-1)):
        values = tiling.tile_keys(value)
        tile_output = torch.matmul(tiling.tile_queries(tile_weights).to(values.dtype), values)
        output = output + tiling.untile_queries(tile_output, length)
    return output


# ------------------------------------------------------------------------------------------------------ fused union
SUMMARY_QUERY_GROUPS = 16  # a single tile of every query (the fixed summaries) is cut in this many groups of queries


class _Piece(NamedTuple):
    """One call of the fused kernel inside a union: the tiles of the union's tiling number `tiling`, all of them, or
    (`rows` given, for a tiling of one tile holding the queries in order) the queries `rows` of its one tile with
    the keys `keys` of the tile; an additive mask `bias` (broadcast over heads) or none (every pair allowed, or with
    `causal` the plainly causal pairs of square tiles: the kernel's is_causal)."""

    tiling: int
    rows: slice = slice(None)
    keys: slice = slice(None)
    bias: torch.Tensor | None = None
    causal: bool = False


def _group_pieces(number, mask, dtype):
    """Tiling `number`, one tile (`mask [1, L, K]`, queries in order), cut into groups of queries; a group's keys
    split into the leading ones every query of the group may see (a piece without a mask: the summary keys of the
    earlier blocks) and the rest up to its last visible key (a piece with the mask). Exact by construction."""
    mask = mask[0]
    length = mask.shape[0]
    group = math.ceil(length / SUMMARY_QUERY_GROUPS)
    pieces = []
    for start in range(0, length, group):
        rows = slice(start, min(start + group, length))
        part = mask[rows]
        seen = torch.nonzero(part.any(0))
        end = int(seen.max()) + 1 if len(seen) else 0
        prefix = min(end, int(part.all(0).to(torch.int32).cumprod(0).sum()))
        if prefix:
            pieces.append(_Piece(number, rows, slice(0, prefix)))
        if end > prefix:
            pieces.append(
                _Piece(number, rows, slice(prefix, end), additive_mask(part[None, None, :, prefix:end], dtype))
            )
    return pieces


def _union_pieces(tiles, length, dtype, key_padding_mask):
    """The fused-kernel calls of a union of tilings (`tile_masks`): one per tiling (its tile masks as the bias), a
    one-tile tiling without padding cut by `_group_pieces`."""
    pieces = []
    for number, (tiling, mask, _) in enumerate(tiles):
        one_tile_in_order = mask.shape[0] == 1 and mask.shape[1] == length
        if key_padding_mask is None and one_tile_in_order:
            pieces += _group_pieces(number, mask, dtype)
            continue
        padding = _tile_padding(tiling, key_padding_mask)
        if padding is None and mask.shape[1] == mask.shape[2] and torch.equal(mask, _lower_triangle(mask)):
            pieces.append(_Piece(number, causal=True))  # the fixed pattern's blocks
            continue
        batch = 1 if padding is None else padding.shape[0]
        mask = (mask if padding is None else mask & padding).reshape(batch * mask.shape[0], 1, *mask.shape[-2:])
        pieces.append(_Piece(number, bias=additive_mask(mask, dtype)))
    return pieces


_FUSED_PIECES = _LRU(32)
# The fused CPU kernel that returns the log-sum-exp is a private aten op (torch 2.13 has it); without it the union
# takes the plain-ops path.
_HAS_FUSED_CPU_KERNEL = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"
)


def _lower_triangle(mask):
    return torch.ones_like(mask[0]).tril()[None].expand_as(mask)


class _FusedUnion(torch.autograd.Function):
    """One softmax over the pieces of a union, each run by torch's fused CPU attention kernel: the kernel returns
    every piece's output and log-sum-exp, which combine exactly (flash-attention style: weights exp(lse_p - lse));
    the backward runs the kernel's own backward per piece with the combined output and log-sum-exp, which gives the
    gradients of the union's softmax (its rows' D = dO . O and normaliser are the union's). Inputs: every tiling's
    query / key / value tiles `[B * T, H, t, D]` (autograd carries their gradients back through the tiling views)."""

    @staticmethod
    def forward(ctx, tilings, pieces, batch, length, scaling, *tiles):
        tiled_output, tiled_lse = [], []
        for _tiling, (query, _, value) in zip(tilings, _triples(tiles)):
            tiled_output.append(query.new_zeros(*query.shape[:-1], value.shape[-1]))
            tiled_lse.append(query.new_full(query.shape[:-1], -math.inf, dtype=torch.float32))
        for piece in pieces:
            query, key, value = tiles[3 * piece.tiling : 3 * piece.tiling + 3]
            rows, keys = piece.rows, piece.keys
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                query[:, :, rows],
                key[:, :, keys],
                value[:, :, keys],
                0.0,
                piece.causal,
                attn_mask=_batched_bias(piece.bias, query.shape[0]),
                scale=scaling,
            )
            _merge_into(tiled_output[piece.tiling][:, :, rows], tiled_lse[piece.tiling][:, :, rows], out, lse.float())
        # The tilings' results in query order, combined.
        output = log_sum_exp = None
        for tiling, out, lse in zip(tilings, tiled_output, tiled_lse):
            out, lse = _query_order(tiling, out, batch, length), _query_order(tiling, lse[..., None], batch, length)
            if output is None:
                output, log_sum_exp = out.clone(), lse[..., 0].clone()
            else:
                _merge_into(output, log_sum_exp, out, lse[..., 0])
        ctx.tilings, ctx.pieces, ctx.scaling = tilings, pieces, scaling
        ctx.save_for_backward(output, log_sum_exp, *tiles)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        output, log_sum_exp, *tiles = ctx.saved_tensors
        # The combined output, log-sum-exp (float32) and output gradient in every tiling's query layout.
        layouts = [
            [_sdpa_layout(tiling.tile_queries(x)) for x in (grad_output, output, log_sum_exp[..., None])]
            for tiling in ctx.tilings
        ]
        grads = [torch.zeros_like(tile) for tile in tiles]
        for piece in ctx.pieces:
            query, key, value = tiles[3 * piece.tiling : 3 * piece.tiling + 3]
            grad_out, out, lse = (x[:, :, piece.rows] for x in layouts[piece.tiling])
            rows, keys = piece.rows, piece.keys
            grad_query, grad_key, grad_value = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out,
                query[:, :, rows],
                key[:, :, keys],
                value[:, :, keys],
                out,
                lse[..., 0],
                0.0,
                piece.causal,
                attn_mask=_batched_bias(piece.bias, query.shape[0]),
                scale=ctx.scaling,
            )
            grads[3 * piece.tiling][:, :, rows] += grad_query
            grads[3 * piece.tiling + 1][:, :, keys] += grad_key
            grads[3 * piece.tiling + 2][:, :, keys] += grad_value
        return None, None, None, None, None, *grads


def _merge_into(output, log_sum_exp, out, lse):
    """In place: (output, log_sum_exp) <- the softmax over both key sets, from each one's output and log-sum-exp."""
    new = torch.logaddexp(log_sum_exp, lse)
    finite = new.clamp(min=torch.finfo(new.dtype).min)  # rows no key reached yet (-inf) keep weight 0, not nan
    output.mul_(torch.exp(log_sum_exp - finite)[..., None].to(output.dtype))
    output.add_(out * torch.exp(lse - finite)[..., None].to(out.dtype))
    log_sum_exp.copy_(new)


def _query_order(tiling, tiled, batch, length):
    """`[B * T, H, t, E]` (`_sdpa_layout`) -> `[B, H, L, E]` in query order."""
    return tiling.untile_queries(tiled.view(batch, -1, *tiled.shape[1:]).transpose(1, 2), length)


def _triples(tiles):
    return zip(tiles[0::3], tiles[1::3], tiles[2::3])


def _batched_bias(bias, batch_tiles):
    """A cached `[T, 1, tq, tk]` bias for batch 1, repeated for a larger batch (`[B * T, ...]`)."""
    if bias is None or bias.shape[0] == batch_tiles:
        return bias
    return bias.repeat(batch_tiles // bias.shape[0], 1, 1, 1)


def _fused_union_attention(query, key, value, tiles, pieces_key, scaling, key_padding_mask, every_query_sees_a_key):
    """A union of tilings through the fused kernel (`_FusedUnion`); queries that see no key get zeros."""
    length = query.shape[2]
    if key_padding_mask is None:
        pieces = _FUSED_PIECES.get_or_build(pieces_key, lambda: _union_pieces(tiles, length, query.dtype, None))
    else:
        pieces = _union_pieces(tiles, length, query.dtype, key_padding_mask)
    tilings = [tiling for tiling, _, _ in tiles]
    inputs = []
    for tiling in tilings:
        inputs += [_sdpa_layout(tiling.tile_queries(query))]
        inputs += [_sdpa_layout(tiling.tile_keys(states)) for states in (key, value)]
    output = _FusedUnion.apply(tilings, pieces, query.shape[0], length, scaling, *inputs)
    if key_padding_mask is not None or not every_query_sees_a_key:
        sees = []
        for tiling, mask, _ in tiles:
            padding = _tile_padding(tiling, key_padding_mask)
            mask = mask[None, None] if padding is None else mask & padding
            sees.append(tiling.untile_queries(mask.any(-1, keepdim=True), length))
        output = output * torch.stack(sees).any(0).to(output.dtype)
    return output


# ------------------------------------------------------------------------------------------------------ flex
_BLOCK_MASKS = _LRU(16)
FLEX_MIN_HEAD_DIM = 16  # FlexAttention's kernels need head_dim >= 16: smaller heads are zero-padded (exact)


# torch.compile keeps a few kernels per function (torch._dynamo.config.recompile_limit, 8) and past that runs the
# function eagerly: flex_attention unfused, materialising every score (measured on an H100 at 16k, 4 layers, the fixed
# merged pattern: a forward of 305 ms and 26.8 GB against 9 ms and 0.26 GB fused), and a block mask built on the whole
# grid. Each pattern, grad mode and length is a kernel of its own, so a process with a few patterns (a benchmark, a
# sweep, evaluation at another length) passes 8 quickly: the compiled calls here run under this limit.
FLEX_RECOMPILE_LIMIT = 64
_COMPILED: dict = {}  # function -> its torch.compile'd form, made on first use


def _call_compiled(function, *args, **kwargs):
    """`function(*args, **kwargs)` through torch.compile (made once, static shapes), under FLEX_RECOMPILE_LIMIT."""
    if function not in _COMPILED:
        _COMPILED[function] = torch.compile(function, dynamic=False)
    limit = max(torch._dynamo.config.recompile_limit, FLEX_RECOMPILE_LIMIT)
    with torch._dynamo.config.patch(recompile_limit=limit):
        return _COMPILED[function](*args, **kwargs)


# Above this many mask entries (heads x q_len x k_len) a CUDA block mask is built by a compiled kernel, block by
# block: eager `create_block_mask` evaluates the pattern on the whole [heads, q_len, k_len] grid, with int64
# intermediates. Measured on an H100 at 64k (4 layers, 8 heads): the strided merged, strided per-head and fixed
# per-head patterns ran out of its 80 GB building their masks eagerly.
COMPILED_MASK_ENTRIES = 2**28


def compiles_mask(device, heads: int | None, q_len: int, k_len: int) -> bool:
    """Whether `flex_block_mask` builds this mask with a compiled kernel by default (CUDA, long masks)."""
    return torch.device(device).type == "cuda" and (heads or 1) * q_len * k_len > COMPILED_MASK_ENTRIES


def flex_block_mask(pattern, num_heads, q_len, k_len, device, q_offset=0, block_size=128, compile_mask=None):
    """The pattern's FlexAttention `BlockMask`, built once per (pattern, heads, lengths, offset, device) and kept in a
    small LRU cache (padding is applied as a score modification, so it does not enter the mask). `compile_mask`:
    build it with a compiled kernel (default: on CUDA above `COMPILED_MASK_ENTRIES`), else eagerly."""
    from torch.nn.attention.flex_attention import create_block_mask

    heads = num_heads if pattern.per_head else None
    if compile_mask is None:
        compile_mask = compiles_mask(device, heads, q_len, k_len)

    def build():
        def mask_mod(b, h, q_idx, kv_idx):
            return pattern.allowed(q_idx + q_offset, kv_idx, h)

        arguments = (mask_mod, None, heads, q_len, k_len)
        if compile_mask:
            return _call_compiled(create_block_mask, *arguments, device=device, BLOCK_SIZE=block_size)
        return create_block_mask(*arguments, device=device, BLOCK_SIZE=block_size)

    key = (pattern, heads, q_len, k_len, q_offset, str(device), block_size, compile_mask)
    return _BLOCK_MASKS.get_or_build(key, build)


def flex_pattern_attention(query, key, value, pattern, scaling, key_padding_mask=None, q_offset=0, compile=None):
    """FlexAttention with the pattern's cached block mask. Returns `[batch, q_len, heads, head_dim]`."""
    from torch.nn.attention.flex_attention import flex_attention

    if query.device.type == "cpu" and torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
        raise ValueError(
            "FlexAttention has no backward on CPU in torch 2.13: use pattern_implementation='blocked' to train on CPU"
        )
    heads, q_len, head_dim = query.shape[1:]
    block_mask = flex_block_mask(pattern, heads, q_len, key.shape[2], query.device, q_offset)
    if head_dim < FLEX_MIN_HEAD_DIM:
        query, key, value = (nn.functional.pad(t, (0, FLEX_MIN_HEAD_DIM - head_dim)) for t in (query, key, value))
    score_mod = None
    if key_padding_mask is not None:
        minimum = torch.finfo(query.dtype).min  # not -inf: a row with only padded keys stays finite

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(key_padding_mask[b, kv_idx], score, minimum)

    compiled = compile if compile is not None else query.device.type == "cuda"
    if not compiled or torch.compiler.is_compiling():  # inside a compiled model the model's graph holds the kernel
        output = flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling)
    else:
        output = _call_compiled(
            flex_attention, query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling
        )
    return output[..., :head_dim].transpose(1, 2).contiguous()


# ------------------------------------------------------------------------------------------------------ gathered
_INDEX_CACHE = _LRU(32)


def gather_index(pattern, q_len, k_len, block_size, device, q_offset=0):
    """For each query block: the sorted union of the keys its queries may see, padded to the largest count.

    Returns `order` (the query permutation or None), `index [blocks, K]` (long) and `mask [blocks, block_size, K]`
    (the element mask, False on padding). Queries past q_len (padding of the last block) repeat the last query.
    Cached per (pattern, lengths, block size, offset, device) like a FlexAttention BlockMask."""
    return _INDEX_CACHE.get_or_build(
        (pattern, q_len, k_len, block_size, q_offset, str(device)),
        lambda: _build_gather_index(pattern, q_len, k_len, block_size, device, q_offset),
    )


def _build_gather_index(pattern, q_len, k_len, block_size, device, q_offset):
    blocks = math.ceil(q_len / block_size)
    order = pattern.query_order(q_len, device)
    positions = order if order is not None else torch.arange(q_len, device=device)
    positions = torch.cat([positions, positions[-1:].expand(blocks * block_size - q_len)]) + q_offset
    kv_idx = torch.arange(k_len, device=device)
    chunk = max(1, (1 << 24) // max(1, block_size * k_len))
    seen = []
    for start in range(0, blocks, chunk):
        q_idx = positions[start * block_size : (start + chunk) * block_size]
        allowed = pattern.allowed(q_idx[:, None], kv_idx[None, :]).view(-1, block_size, k_len)
        seen.append(allowed.any(1))
    seen = torch.cat(seen)  # [blocks, k_len]
    width = max(1, int(seen.sum(-1).max()))
    # Stable sort puts the seen keys first, in position order.
    index = torch.sort((~seen).to(torch.int8), dim=-1, stable=True).indices[:, :width]
    valid = torch.gather(seen, 1, index)
    mask = pattern.allowed(positions.view(blocks, block_size, 1), index[:, None, :]) & valid[:, None, :]
    return order, index, mask


def gathered_attention(
    query, key, value, pattern, scaling, block_size=64, key_padding_mask=None, dropout=0.0, training=False, q_offset=0
):
    """Block-sparse attention by gathering, the fallback for patterns without tilings (every pattern defined here has
    them; a pattern of your own may not): each query block gathers the union of the keys its queries may see.
    `query [B, H, Lq, D]`, `key`/`value [B, H, Lk, D]`, `key_padding_mask [B, Lk]` bool (True = real). Returns
    `[B, Lq, H, D]` (and no weights)."""
    if pattern.per_head:
        heads = query.shape[1]
        output = query.new_empty(query.shape[0], query.shape[2], heads, value.shape[-1])
        for number, part in enumerate(pattern.parts):
            group = list(range(number, heads, len(pattern.parts)))
            if group:
                output[:, :, group] = gathered_attention(
                    query[:, group],
                    key[:, group],
                    value[:, group],
                    part,
                    scaling,
                    block_size,
                    key_padding_mask,
                    dropout,
                    training,
                    q_offset,
                )
        return output
    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    block_size = max(1, min(block_size, q_len))
    order, index, mask = gather_index(pattern, q_len, k_len, block_size, query.device, q_offset)
    blocks, width = index.shape
    padded = blocks * block_size
    if order is not None:
        query = query[:, :, order]
    if padded != q_len:
        query = nn.functional.pad(query, (0, 0, 0, padded - q_len))
    query = query.view(batch, heads, blocks, block_size, dim)
    flat = index.reshape(-1)
    keys = key[:, :, flat].view(batch, heads, blocks, width, dim)
    values = value[:, :, flat].view(batch, heads, blocks, width, value.shape[-1])
    scores = torch.matmul(query, keys.transpose(-1, -2)) * scaling  # [B, H, blocks, block, K]
    mask = mask[None, None]
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, flat].view(batch, 1, blocks, 1, width)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=training)
    output = torch.matmul(weights, values).view(batch, heads, padded, -1)[:, :, :q_len]
    if order is not None:
        output = output[:, :, torch.argsort(order)]
    return output.transpose(1, 2).contiguous()


# ------------------------------------------------------------------------------------------------------ dispatch
IMPLEMENTATIONS = ("auto", "blocked", "flex", "dense", "eager", "sdpa")


def choose_implementation(pattern, implementation, dense_implementation, device, full_sequence, training_dropout):
    """The implementation that runs: "dense" is the dense mask through `dense_implementation` (eager or sdpa); "auto"
    is the fastest exact path for the device: tiles on CPU (FlexAttention has no CPU backward and its CPU kernels are
    slower), and on CUDA tiles where every tile is plainly causal (fused flash kernels), FlexAttention with its
    cached BlockMask otherwise. Decoding with a cache (queries after the first position) uses the dense mask."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "auto":
        # FlexAttention only for whole sequences: a decoding step would build a BlockMask and compile a kernel for
        # every new key length.
        if device.type == "cuda" and full_sequence and not training_dropout and not pattern.causal_in_tiles:
            implementation = "flex"
        else:
            implementation = "blocked"
    if implementation == "blocked" and not full_sequence:
        implementation = "dense"
    if implementation == "dense":
        implementation = "sdpa" if dense_implementation == "sdpa" else "eager"
    return implementation


def pattern_attention(
    module,
    query,
    key,
    value,
    pattern,
    implementation="auto",
    scaling=None,
    key_padding_mask=None,
    dropout=0.0,
    block_size=64,
    q_offset=0,
    output_attentions=False,
    dense_implementation="eager",
):
    """Attention restricted to `pattern`. `implementation`: "auto" (the fastest exact path for the device), "blocked"
    (tiles of dense attention: trains on CPU), "flex" (FlexAttention), "dense" (a dense mask through
    `dense_implementation`), "eager" or "sdpa" (dense masks: the reference). Returns `([B, Lq, H, D], weights or
    None)`; weights (dense, `[B, H, Lq, Lk]`) only come from the eager path, which `output_attentions` selects.
    `block_size`: query block of the gathered path (patterns without tilings)."""
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    full_sequence = q_offset == 0 and query.shape[2] == key.shape[2]
    implementation = choose_implementation(
        pattern, implementation, dense_implementation, query.device, full_sequence, module.training and dropout > 0
    )
    if output_attentions:
        implementation = "eager"
    if implementation == "blocked":
        if pattern.tilings() is not None or (pattern.per_head and all(p.tilings() for p in pattern.parts)):
            return tiled_attention(
                query, key, value, pattern, scaling, key_padding_mask, dropout, module.training
            ), None
        output = gathered_attention(
            query, key, value, pattern, scaling, block_size, key_padding_mask, dropout, module.training, q_offset
        )
        return output, None
    if implementation == "flex":
        if module.training and dropout > 0:
            raise ValueError("attention dropout is not supported on the FlexAttention path; use 'blocked'")
        return flex_pattern_attention(query, key, value, pattern, scaling, key_padding_mask, q_offset), None
    allowed = dense_allowed(pattern, query.shape[2], key.shape[2], query.device, q_offset, query.shape[1])[None]
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
    function = eager_attention_forward if implementation == "eager" else attention_function(implementation)
    output, weights = function(
        module,
        query,
        key,
        value,
        additive_mask(allowed, query.dtype),
        scaling=scaling,
        dropout=dropout if module.training else 0.0,
    )
    sees_a_key = allowed.any(-1).transpose(1, 2)[..., None]  # [B or 1, Lq, H or 1, 1]: rows with no key give zeros
    return output * sees_a_key.to(output.dtype), weights


class PatternSelfAttention(MultiHeadAttention):
    """Multi-head self-attention restricted to `pattern` (q/k/v/o projections and the cache of `txv_mha`), run by
    `config.pattern_implementation` (its dense path by `config._attn_implementation`, gathered queries in blocks of
    `config.block_size`). With `cache`, the new positions' keys/values join the cached ones and the queries
    (at positions past_length + i) attend to the keys their pattern allows among all of them."""

    def __init__(self, config, layer_idx: int, pattern: AttentionPattern):
        super().__init__(config, layer_idx)
        self.pattern = pattern

    def forward(self, hidden_states, key_padding_mask=None, cache=None, output_attentions=False):
        batch, length = hidden_states.shape[:2]
        past_length = cache_past_length(cache, self.layer_idx)
        query = self._heads(self.q_proj(hidden_states))
        key, value = self.keys_values(hidden_states, cache=cache)
        output, weights = pattern_attention(
            self,
            query,
            key,
            value,
            self.pattern,
            self.config.pattern_implementation,
            scaling=self.scaling,
            key_padding_mask=key_padding_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            block_size=self.config.block_size,
            q_offset=past_length,
            output_attentions=output_attentions,
            dense_implementation=self.config._attn_implementation,
        )
        return self.o_proj(output.reshape(batch, length, -1)), weights
