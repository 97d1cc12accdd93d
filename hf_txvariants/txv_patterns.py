"""Sparse attention patterns, each usable three ways that give equal results.

A pattern is a predicate `allowed(q_idx, kv_idx, head)` on broadcastable integer tensors (True = query may attend to
key). From it come:

* `dense_allowed`: the full `[heads or 1, q_len, k_len]` boolean mask, for the eager (or SDPA) reference;
* `flex_block_mask`: a FlexAttention `BlockMask` (fused kernels on CUDA; on CPU torch 2.13 runs FlexAttention in
  inference only, without gradients);
* `blocked_attention`: queries are cut into blocks of `block_size`; each block gathers only the union of the keys its
  queries may see (sorted by position) and attends to them with the element mask. Plain tensor ops, so it trains on
  CPU, and its cost is O(L * keys-per-block) instead of O(L^2).

`pattern_attention` dispatches between them. Patterns (Child et al. 2019, Parmar et al. 2018):

* `Causal`, `SlidingWindow(w)`: k <= q (and q - k < w).
* `StridedLocal(l)` / `StridedColumn(l)` and their union `Strided(l)`: the previous l positions / every l-th one.
* `FixedBlock(l)` / `FixedSummary(l, c)` and their union `Fixed(l, c)`: the own block of l / the last c positions
  of every block.
* `Local1D(b)`: a query block of b attends to itself and the previous block.
* `Local2D(width, query_shape, memory_flange)`: positions in block-raster order (see `to_block_raster`); a query
  block of (bh, bw) attends to the keys of its memory block, which extends it by fh rows above and fw columns on
  either side, that precede it in block-raster order.
* `Union(*patterns)`, `PerHead(patterns)` (head h uses patterns[h % n]).
Every pattern is causal (the models here are autoregressive) and lets each query see at least itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


# ------------------------------------------------------------------------------------------------------ patterns
class AttentionPattern:
    per_head = False

    def query_order(self, q_len: int, device=None) -> torch.Tensor | None:
        """A permutation of the queries that makes blocks of consecutive ones share keys (None = position order)."""
        return None

    def allowed(self, q_idx: torch.Tensor, kv_idx: torch.Tensor, head: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def factors(self) -> list["AttentionPattern"]:
        """The parts a factorised pattern is made of (itself for a simple one)."""
        return [self]


@dataclass(frozen=True)
class Causal(AttentionPattern):
    def allowed(self, q_idx, kv_idx, head=None):
        return kv_idx <= q_idx


@dataclass(frozen=True)
class SlidingWindow(AttentionPattern):
    window: int

    def allowed(self, q_idx, kv_idx, head=None):
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < self.window)


@dataclass(frozen=True)
class StridedLocal(SlidingWindow):
    """Child et al. A^(1) of the strided pattern: the previous `window` (= stride l) positions."""


@dataclass(frozen=True)
class StridedColumn(AttentionPattern):
    """Child et al. A^(2) of the strided pattern: (q - k) mod l == 0."""

    stride: int

    def allowed(self, q_idx, kv_idx, head=None):
        distance = q_idx - kv_idx
        return (distance >= 0) & (torch.remainder(distance, self.stride) == 0)

    def query_order(self, q_len, device=None):
        # The paper's transpose: queries grouped by q mod l see the same keys (those with k = q mod l).
        positions = torch.arange(q_len, device=device)
        return torch.argsort(torch.remainder(positions, self.stride) * q_len + positions)


@dataclass(frozen=True)
class FixedBlock(AttentionPattern):
    """Child et al. A^(1) of the fixed pattern: floor(k / l) == floor(q / l)."""

    stride: int

    def allowed(self, q_idx, kv_idx, head=None):
        return (kv_idx <= q_idx) & (torch.div(kv_idx, self.stride, rounding_mode="floor") == torch.div(q_idx, self.stride, rounding_mode="floor"))


@dataclass(frozen=True)
class FixedSummary(AttentionPattern):
    """Child et al. A^(2) of the fixed pattern: k mod l >= l - c (the c summary positions of every block), and the
    query itself so that no row is empty."""

    stride: int
    summary: int

    def allowed(self, q_idx, kv_idx, head=None):
        summary = torch.remainder(kv_idx, self.stride) >= self.stride - self.summary
        return (kv_idx <= q_idx) & (summary | (kv_idx == q_idx))


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


def Strided(stride: int) -> Union:
    return Union((StridedLocal(stride), StridedColumn(stride)))


def Fixed(stride: int, summary: int) -> Union:
    return Union((FixedBlock(stride), FixedSummary(stride, summary)))


@dataclass(frozen=True)
class Local1D(AttentionPattern):
    """Parmar et al. local 1D: query block floor(q / b) sees key blocks floor(q / b) - 1 and floor(q / b), causally."""

    block: int

    def allowed(self, q_idx, kv_idx, head=None):
        q_block = torch.div(q_idx, self.block, rounding_mode="floor")
        k_block = torch.div(kv_idx, self.block, rounding_mode="floor")
        return (kv_idx <= q_idx) & (k_block >= q_block - 1)


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
        block_row, block_col = torch.div(block, blocks_per_row, rounding_mode="floor"), torch.remainder(block, blocks_per_row)
        row = block_row * bh + torch.div(inside, bw, rounding_mode="floor")
        col = block_col * bw + torch.remainder(inside, bw)
        return row, col

    def allowed(self, q_idx, kv_idx, head=None):
        bh, bw = self.query_shape
        fh, fw = self.memory_flange
        q_row, q_col = self.row_col(q_idx)
        k_row, k_col = self.row_col(kv_idx)
        top = torch.div(q_row, bh, rounding_mode="floor") * bh
        left = torch.div(q_col, bw, rounding_mode="floor") * bw
        inside = (k_row >= top - fh) & (k_row < top + bh) & (k_col >= left - fw) & (k_col < left + bw + fw)
        return (kv_idx <= q_idx) & inside


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
def dense_allowed(pattern: AttentionPattern, q_len: int, k_len: int, device=None, q_offset: int = 0, num_heads: int = 1):
    """`[num_heads or 1, q_len, k_len]` bool; query i has absolute position q_offset + i."""
    q_idx = torch.arange(q_len, device=device)[:, None] + q_offset
    kv_idx = torch.arange(k_len, device=device)[None, :]
    if pattern.per_head:
        head = torch.arange(num_heads, device=device)[:, None, None]
        return pattern.allowed(q_idx[None], kv_idx[None], head)
    return pattern.allowed(q_idx, kv_idx)[None]


# ------------------------------------------------------------------------------------------------------ flex
def flex_block_mask(pattern, batch, num_heads, q_len, k_len, device, q_offset=0, key_padding_mask=None, block_size=128):
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = pattern.allowed(q_idx + q_offset, kv_idx, h)
        if key_padding_mask is not None:
            allowed = allowed & key_padding_mask[b, kv_idx]
        return allowed

    return create_block_mask(
        mask_mod,
        batch if key_padding_mask is not None else None,
        num_heads if pattern.per_head else None,
        q_len,
        k_len,
        device=device,
        BLOCK_SIZE=block_size,
    )


_compiled_flex = None


def flex_pattern_attention(query, key, value, pattern, scaling, key_padding_mask=None, q_offset=0, compile=None):
    """FlexAttention with the pattern's block mask. Returns `[batch, q_len, heads, head_dim]`."""
    from torch.nn.attention.flex_attention import flex_attention

    global _compiled_flex
    if query.device.type == "cpu" and torch.is_grad_enabled() and (query.requires_grad or key.requires_grad):
        raise ValueError(
            "FlexAttention has no backward on CPU in torch 2.13: use pattern_implementation='blocked' to train on CPU"
        )
    batch, heads, q_len = query.shape[:3]
    block_mask = flex_block_mask(pattern, batch, heads, q_len, key.shape[2], query.device, q_offset, key_padding_mask)
    function = flex_attention
    if compile if compile is not None else query.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        function = _compiled_flex
    output = function(query, key, value, block_mask=block_mask, scale=scaling)
    return output.transpose(1, 2).contiguous()


# ------------------------------------------------------------------------------------------------------ blocked
_INDEX_CACHE: dict = {}


def gather_index(pattern, q_len, k_len, block_size, device, q_offset=0):
    """For each query block: the sorted union of the keys its queries may see, padded to the largest count.

    Returns `order` (the query permutation or None), `index [blocks, K]` (long) and `mask [blocks, block_size, K]`
    (the element mask, False on padding). Queries past q_len (padding of the last block) repeat the last query.
    Cached per (pattern, lengths, block size, offset, device) like a FlexAttention BlockMask."""
    cache_key = (pattern, q_len, k_len, block_size, q_offset, str(device))
    if cache_key in _INDEX_CACHE:
        return _INDEX_CACHE[cache_key]
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
    if len(_INDEX_CACHE) > 64:
        _INDEX_CACHE.clear()
    _INDEX_CACHE[cache_key] = (order, index, mask)
    return order, index, mask


def blocked_attention(
    query, key, value, pattern, scaling, block_size=64, key_padding_mask=None, dropout=0.0, training=False, q_offset=0
):
    """Block-sparse attention with plain tensor ops (trains on CPU). `query [B, H, Lq, D]`, `key`/`value
    [B, H, Lk, D]`, `key_padding_mask [B, Lk]` bool (True = real). Returns `[B, Lq, H, D]` (and no weights)."""
    if pattern.per_head:
        heads = query.shape[1]
        output = query.new_empty(query.shape[0], query.shape[2], heads, value.shape[-1])
        for number, part in enumerate(pattern.parts):
            group = list(range(number, heads, len(pattern.parts)))
            if group:
                output[:, :, group] = blocked_attention(
                    query[:, group], key[:, group], value[:, group], part, scaling, block_size,
                    key_padding_mask, dropout, training, q_offset,
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
IMPLEMENTATIONS = ("blocked", "flex", "eager", "sdpa")


def pattern_attention(
    module,
    query,
    key,
    value,
    pattern,
    implementation="blocked",
    scaling=None,
    key_padding_mask=None,
    dropout=0.0,
    block_size=64,
    q_offset=0,
    output_attentions=False,
):
    """Attention restricted to `pattern`. `implementation`: "blocked" (trains on CPU), "flex" (FlexAttention),
    "eager" or "sdpa" (dense masks: the reference). Returns `([B, Lq, H, D], weights or None)`; weights (dense,
    `[B, H, Lq, Lk]`) only come from the eager path, which `output_attentions` selects."""
    from .txv_attention import additive_mask, eager_attention_forward, get_attention_function

    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if output_attentions:
        implementation = "eager"
    if implementation == "blocked":
        output = blocked_attention(
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
    mask = additive_mask(allowed, query.dtype)
    if implementation == "eager":
        return eager_attention_forward(module, query, key, value, mask, scaling=scaling, dropout=dropout)

    class _Config:
        _attn_implementation = implementation

    function = get_attention_function(_Config())
    return function(module, query, key, value, mask, scaling=scaling, dropout=dropout if module.training else 0.0)
