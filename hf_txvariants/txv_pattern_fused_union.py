"""One softmax over a union of tilings on CPU: each tiling's tiles through torch's fused CPU attention kernel, which
returns every piece's output and log-sum-exp; the pieces combine exactly (flash-attention style) and are
differentiated by the kernel's own backward (`_FusedUnion`). Used by `txv_pattern_tiled`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .txv_attention import additive_mask
from .txv_pattern_tilings import sdpa_layout, tile_padding
from .txv_patterns import PatternCache

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
        padding = tile_padding(tiling, key_padding_mask)
        if padding is None and mask.shape[1] == mask.shape[2] and torch.equal(mask, _lower_triangle(mask)):
            pieces.append(_Piece(number, causal=True))  # the fixed pattern's blocks
            continue
        batch = 1 if padding is None else padding.shape[0]
        mask = (mask if padding is None else mask & padding).reshape(batch * mask.shape[0], 1, *mask.shape[-2:])
        pieces.append(_Piece(number, bias=additive_mask(mask, dtype)))
    return pieces


_FUSED_PIECES = PatternCache(32)
# The fused CPU kernel that returns the log-sum-exp is a private aten op (torch 2.13 has it); without it the union
# takes the plain-ops path.
HAS_FUSED_CPU_KERNEL = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
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
            [sdpa_layout(tiling.tile_queries(x)) for x in (grad_output, output, log_sum_exp[..., None])]
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
    """`[B * T, H, t, E]` (`sdpa_layout`) -> `[B, H, L, E]` in query order."""
    return tiling.untile_queries(tiled.view(batch, -1, *tiled.shape[1:]).transpose(1, 2), length)


def _triples(tiles):
    return zip(tiles[0::3], tiles[1::3], tiles[2::3])


def _batched_bias(bias, batch_tiles):
    """A cached `[T, 1, tq, tk]` bias for batch 1, repeated for a larger batch (`[B * T, ...]`)."""
    if bias is None or bias.shape[0] == batch_tiles:
        return bias
    return bias.repeat(batch_tiles // bias.shape[0], 1, 1, 1)


def fused_union_attention(query, key, value, tiles, pieces_key, scaling, key_padding_mask, every_query_sees_a_key):
    """A union of tilings through the fused kernel (`_FusedUnion`); queries that see no key get zeros."""
    length = query.shape[2]
    if key_padding_mask is None:
        pieces = _FUSED_PIECES.get_or_build(pieces_key, lambda: _union_pieces(tiles, length, query.dtype, None))
    else:
        pieces = _union_pieces(tiles, length, query.dtype, key_padding_mask)
    tilings = [tiling for tiling, _, _ in tiles]
    inputs = []
    for tiling in tilings:
        inputs += [sdpa_layout(tiling.tile_queries(query))]
        inputs += [sdpa_layout(tiling.tile_keys(states)) for states in (key, value)]
    output = _FusedUnion.apply(tilings, pieces, query.shape[0], length, scaling, *inputs)
    if key_padding_mask is not None or not every_query_sees_a_key:
        sees = []
        for tiling, mask, _ in tiles:
            padding = tile_padding(tiling, key_padding_mask)
            mask = mask[None, None] if padding is None else mask & padding
            sees.append(tiling.untile_queries(mask.any(-1, keepdim=True), length))
        output = output * torch.stack(sees).any(0).to(output.dtype)
    return output
