"""Reformer's attentions (Kitaev, Kaiser and Levskaya 2020): LSH self-attention with shared query/key, and chunked
local self-attention. The numerics follow transformers' ReformerModel (same masks and mask values), so checkpoints
saved by it reproduce its outputs when the hash seed is fixed.

LSH attention, per head:
  1. Shared QK: keys are the queries, length-normalised: k = q / sqrt(mean(q^2) + 1e-6) / sqrt(d).
  2. Hashing (angular LSH, Andoni et al. 2015): for each of `num_hashes` rounds a random rotation R of shape
     [d, b/2]; h(x) = argmax([xR ; -xR]) in [0, b). A factorised `num_buckets = [b1, b2]` hashes with b1 and b2
     separately and combines h1 + b1 * h2. Padding tokens get the extra bucket b; round r adds r * (buckets) so that
     rounds never mix.
  3. Sort the n_hashes * L positions by (bucket, position) and cut the sorted sequence into chunks of `chunk_length`;
     each chunk attends to itself and `num_chunks_before` / `num_chunks_after` neighbouring chunks (circularly).
  4. Masks (by original positions): causal (key position <= query position) and padding at -1e9; a query never
     attends to its own position (-1e5), so it does only when nothing else is available.
  5. Un-sort, then combine the rounds with weights softmax_r(logsumexp of round r's scores).
Sequences not longer than one chunk use plain full attention with the same masks.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MASK_VALUE = -1e9  # masked (causal, padding) scores, as transformers' Reformer in float32
SELF_MASK_VALUE = -1e5  # a query's score with its own position


def look_adjacent(vectors: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """`[B, H, n_chunks, chunk, ...]` -> `[B, H, n_chunks, (before + 1 + after) * chunk, ...]`: each chunk with its
    neighbours in the order -before .. +after, circularly (chunk 0's previous chunk is the last one)."""
    if before == 0 and after == 0:
        return vectors
    slices = [vectors if i == 0 else torch.roll(vectors, shifts=-i, dims=2) for i in range(-before, after + 1)]
    return torch.cat(slices, dim=3)


def chunked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    chunk_length: int,
    before: int,
    after: int,
    causal: bool,
    key_valid: torch.Tensor | None = None,
    mask_self: bool = False,
    dropout: float = 0.0,
    training: bool = False,
):
    """Attention inside chunks of a (possibly permuted) sequence.

    `query/key/value [B, H, N, D]` (keys already scaled), N a multiple of `chunk_length`; `positions [B or 1, H or 1,
    N]` the original position of each entry (masks use them); `key_valid [B, 1 or H, N]` bool. Returns the outputs
    `[B, H, N, D]` and the log-sum-exp of each query's scores `[B, H, N]`."""
    batch, heads, length, dim = query.shape
    chunks = length // chunk_length
    split = lambda x: x.reshape(x.shape[0], x.shape[1], chunks, chunk_length, *x.shape[3:])  # noqa: E731
    positions = positions.expand(batch, heads, length)
    q = split(query)
    k = look_adjacent(split(key), before, after)
    v = look_adjacent(split(value), before, after)
    q_pos = split(positions)
    k_pos = look_adjacent(q_pos, before, after)
    scores = torch.matmul(q, k.transpose(-1, -2))  # [B, H, chunks, chunk, window]
    mask = None
    if key_valid is not None:
        mask = look_adjacent(split(key_valid.expand(batch, heads, length)), before, after)[..., None, :]
    if causal:
        causal_mask = q_pos[..., :, None] >= k_pos[..., None, :]
        mask = causal_mask if mask is None else mask & causal_mask
    if mask is not None:
        scores = scores.masked_fill(~mask, MASK_VALUE)
    if mask_self:
        scores = scores.masked_fill(q_pos[..., :, None] == k_pos[..., None, :], SELF_MASK_VALUE)
    logits = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - logits)
    probs = nn.functional.dropout(probs, p=dropout, training=training)
    output = torch.matmul(probs, v)
    return output.reshape(batch, heads, length, -1), logits.reshape(batch, heads, length)


def length_normalise(vectors: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) / sqrt(d): the shared-QK keys."""
    normalised = vectors * torch.rsqrt(torch.mean(vectors**2, -1, keepdim=True) + epsilon)
    return normalised / math.sqrt(vectors.shape[-1])


def default_num_buckets(sequence_length: int, chunk_length: int, max_position_embeddings: int):
    """transformers' rule when `num_buckets` is None: about 2 * L / chunk, a power of 2, factorised when large."""
    power = (2 * (sequence_length // chunk_length)).bit_length() - 1
    buckets = 2**power
    limit = 2 * max(int((max_position_embeddings // chunk_length) ** 0.5), chunk_length)
    if buckets > limit:
        return [2 ** (power // 2), 2 ** (power - power // 2)]
    return buckets


def hash_vectors(
    vectors: torch.Tensor,
    num_hashes: int,
    num_buckets,
    seed: int | None = None,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Angular LSH buckets `[B, H, num_hashes, L]`, already offset by round (see the module docstring).

    With `seed`, the rotations are drawn from a generator seeded with it (the same numbers as transformers'
    `torch.manual_seed(hash_seed)`, without touching the global random state); without, from the global RNG."""
    factors = [num_buckets] if isinstance(num_buckets, int) else list(num_buckets)
    rotation_size, total = sum(factors), math.prod(factors)
    batch, heads, _, dim = vectors.shape
    vectors = vectors.detach()
    shape = (heads, dim, num_hashes, rotation_size // 2)
    if seed is not None:
        generator = torch.Generator(device=vectors.device).manual_seed(seed)
        rotations = torch.randn(shape, device=vectors.device, dtype=vectors.dtype, generator=generator)
    else:
        rotations = torch.randn(shape, device=vectors.device, dtype=vectors.dtype)
    rotated = torch.einsum("bmtd,mdhr->bmhtr", vectors, rotations)
    buckets, start, product = None, 0, 1
    for factor in factors:
        part = rotated[..., start : start + factor // 2]
        part_buckets = torch.argmax(torch.cat([part, -part], dim=-1), dim=-1)
        buckets = part_buckets if buckets is None else buckets + product * part_buckets
        start, product = start + factor // 2, product * factor
    if key_valid is not None and not bool(key_valid.all()):
        total = total + 1
        buckets = torch.where(key_valid[:, None, None, :].to(torch.bool), buckets, total - 1)
    offsets = (torch.arange(num_hashes, device=vectors.device) * total).view(1, 1, -1, 1)
    return buckets + offsets


def lsh_attention(
    query_key: torch.Tensor,
    value: torch.Tensor,
    num_hashes: int,
    num_buckets,
    chunk_length: int,
    before: int = 1,
    after: int = 0,
    causal: bool = True,
    key_valid: torch.Tensor | None = None,
    seed: int | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """LSH self-attention. `query_key`, `value [B, H, L, D]`; `key_valid [B, L]` bool. Returns `[B, H, L, D]`."""
    batch, heads, length, dim = query_key.shape
    valid = key_valid[:, None, :] if key_valid is not None else None
    if length <= chunk_length:
        positions = torch.arange(length, device=query_key.device)[None, None]
        output, _ = chunked_attention(
            query_key, length_normalise(query_key), value, positions, length, 0, 0, causal, valid, True, dropout, training
        )
        return output
    if length % chunk_length:
        raise ValueError(f"sequence length {length} must be a multiple of lsh_attn_chunk_length ({chunk_length})")
    buckets = hash_vectors(query_key, num_hashes, num_buckets, seed, key_valid).flatten(2)  # [B, H, R * L]
    with torch.no_grad():
        # Sort by bucket, ties by position: key = bucket * L + position (unique, so any sort is stable).
        index = torch.arange(num_hashes * length, device=buckets.device)
        sort_keys = buckets * length + index % length
        sorted_index = torch.argsort(sort_keys, dim=-1)
        undo_sort = torch.argsort(sorted_index, dim=-1)
        sorted_positions = sorted_index % length
    gather = lambda x: torch.gather(x.repeat(1, 1, num_hashes, 1), 2, sorted_positions[..., None].expand(-1, -1, -1, x.shape[-1]))  # noqa: E731
    sorted_qk, sorted_value = gather(query_key), gather(value)
    sorted_valid = None
    if valid is not None:
        sorted_valid = torch.gather(valid.expand(batch, heads, length).repeat(1, 1, num_hashes), 2, sorted_positions)
    output, logits = chunked_attention(
        sorted_qk,
        length_normalise(sorted_qk),
        sorted_value,
        sorted_positions,
        chunk_length,
        before,
        after,
        causal,
        sorted_valid,
        True,
        dropout,
        training,
    )
    output = torch.gather(output, 2, undo_sort[..., None].expand_as(output))
    logits = torch.gather(logits, 2, undo_sort)
    if num_hashes == 1:
        return output
    output = output.view(batch, heads, num_hashes, length, -1)
    logits = logits.view(batch, heads, num_hashes, length, 1)
    weights = torch.exp(logits - torch.logsumexp(logits, dim=2, keepdim=True))
    return (output * weights).sum(2)


def local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    chunk_length: int,
    before: int = 1,
    after: int = 0,
    causal: bool = True,
    key_valid: torch.Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """Reformer's local attention: chunks of `chunk_length` attend to themselves and their neighbours (keys scaled
    by 1/sqrt(d)). `[B, H, L, D]` in and out; sequences not longer than one chunk use full attention."""
    length = query.shape[2]
    key = key / math.sqrt(query.shape[-1])
    valid = key_valid[:, None, :] if key_valid is not None else None
    positions = torch.arange(length, device=query.device)[None, None]
    if length <= chunk_length:
        return chunked_attention(query, key, value, positions, length, 0, 0, causal, valid, False, dropout, training)[0]
    if length % chunk_length:
        raise ValueError(f"sequence length {length} must be a multiple of local_attn_chunk_length ({chunk_length})")
    return chunked_attention(query, key, value, positions, chunk_length, before, after, causal, valid, False, dropout, training)[0]
