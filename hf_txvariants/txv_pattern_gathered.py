"""A pattern (`txv_patterns`) by gathering: each query block gathers the union of the keys its queries may see. The
fallback for patterns without tilings.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .txv_patterns import PatternCache

_INDEX_CACHE = PatternCache(32)


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
