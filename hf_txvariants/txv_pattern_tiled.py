"""A pattern (`txv_patterns`) as tiles of dense attention (`txv_pattern_tilings`), the way the papers compute it: no
gather, memory O(L * keys per query); it trains on CPU. A single factor runs every tile through the fused SDPA kernel
(`is_causal=True` where the tile is plainly causal); a union of factors (merged mode; the fixed summaries with the
query itself) takes one softmax over all its tiles, each key counted once: on CPU every tiling through torch's fused
kernel, the results combined by their log-sum-exp (`txv_pattern_fused_union`); elsewhere, or with attention dropout,
with plain tensor ops (`_merged_tilings_attention`).
"""

from __future__ import annotations

import torch
from torch import nn

from .txv_attention import additive_mask
from .txv_pattern_fused_union import HAS_FUSED_CPU_KERNEL, fused_union_attention
from .txv_pattern_tilings import Tiling, sdpa_layout, tile_padding
from .txv_patterns import AttentionPattern, PatternCache

_TILE_MASKS = PatternCache(32)


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
        HAS_FUSED_CPU_KERNEL
        and query.device.type == "cpu"
        and not dropout
        and query.dtype in (torch.float32, torch.bfloat16)
    )
    # A union of tilings, or one tile of every query (cut in groups by the union's pieces), goes through the fused
    # union on CPU; single tilings of many tiles through SDPA directly.
    one_tile = len(tiles) == 1 and tiles[0][1].shape[0] == 1 and not tiles[0][2]
    if fused_union and (len(tiles) > 1 or one_tile):
        output = fused_union_attention(
            query, key, value, tiles, bias_key, scaling, key_padding_mask, pattern.every_query_sees_a_key
        )
    elif len(tiles) == 1:
        output = _single_tiling_attention(
            query, key, value, *tiles[0], pattern.every_query_sees_a_key, bias_key, scaling, key_padding_mask, dropout
        )
    else:
        output = _merged_tilings_attention(query, key, value, tiles, bias_key, scaling, key_padding_mask, dropout)
    return output.transpose(1, 2).contiguous()


_TILE_BIASES = PatternCache(32)


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
        sdpa_layout(tiled_query),
        sdpa_layout(tiling.tile_keys(key)),
        sdpa_layout(tiling.tile_keys(value)),
    )
    sdpa = nn.functional.scaled_dot_product_attention
    if plain_causal and key_padding_mask is None:
        output = sdpa(tiled_query, tiled_key, tiled_value, dropout_p=dropout, is_causal=True, scale=scaling)
    else:
        padding = tile_padding(tiling, key_padding_mask)
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
            padding = tile_padding(tiling, padding_mask)
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
