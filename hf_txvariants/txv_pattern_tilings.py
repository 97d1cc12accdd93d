"""Tilings: layouts of a sequence in tiles of dense attention, one per factor of a pattern (`txv_patterns`), the way
the papers compute them (Child et al. 2019 sec. 4; Parmar et al. 2018 sec. 3.2): a band of contiguous blocks for
local / sliding-window attention, the transposed [L/l, l] grid for strided columns, contiguous blocks for fixed blocks,
the summary columns for fixed summaries, for local 2D each query block with its memory block cut from the keys laid
out as an image. Reshapes, slices and strided views: no gather.

Also the block-raster order of an image (`to_block_raster`, `from_block_raster`) and the layouts the attention
kernels take (`sdpa_layout`, `tile_padding`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


# ------------------------------------------------------------------------------------------------------ block raster
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

    pattern: object  # the Local2D pattern it lays out

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


# ------------------------------------------------------------------------------------------------------ kernel layouts
def sdpa_layout(tiled: torch.Tensor) -> torch.Tensor:
    """`[B, H, T, t, D]` -> `[B * T, H, t, D]`: tiles join the batch (a view when the heads are a view of
    `[B, L, H, D]`, as projected states are)."""
    batch, heads, tiles, length, dim = tiled.shape
    return tiled.transpose(1, 2).reshape(batch * tiles, heads, length, dim)


def tile_padding(tiling: Tiling, key_padding_mask: torch.Tensor | None) -> torch.Tensor | None:
    """`key_padding_mask [B, L]` (True = real) in the tiling's key layout, `[B, 1, T, 1, tk]`."""
    if key_padding_mask is None:
        return None
    tiled = tiling.tile_keys(key_padding_mask[:, None, :, None].to(torch.float32))
    return tiled.squeeze(-1)[:, :, :, None, :] > 0.5
