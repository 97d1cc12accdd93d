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

Scores, softmax and the rounds' weights are computed in float32 whatever the activation dtype (fp16 / bf16 autocast,
a model cast to bf16), so the mask values never overflow and the buckets do not depend on the dtype.

Incremental decoding (`lsh_attention_step`, `local_attention_step`): the new position's output computed from the
keys/values (and, for LSH, the buckets) of the past positions kept in a cache: the same window of the sorted sequence
that the full computation over [past ; new] gives that position, at O(window) floating-point work.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MASK_VALUE = -1e9  # masked (causal, padding) scores, as transformers' Reformer in float32
SELF_MASK_VALUE = -1e5  # a query's score with its own position


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor | None, self_match: torch.Tensor | None):
    """float32 `scores [..., keys]` -> (probabilities, log-sum-exp `[..., 1]`): disallowed keys at MASK_VALUE, then
    the query's own position (`self_match`) at SELF_MASK_VALUE."""
    scores = scores.float()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, MASK_VALUE)
    if self_match is not None:
        scores = scores.masked_fill(self_match, SELF_MASK_VALUE)
    logits = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.exp(scores - logits), logits


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
    return_weights: bool = False,
    num_positions: int | None = None,
):
    """Attention inside chunks of a (possibly permuted) sequence.

    `query/key/value [B, H, N, D]` (keys already scaled), N a multiple of `chunk_length`; `positions [B or 1, H or 1,
    N]` the original position of each entry (masks use them); `key_valid [B, 1 or H, N]` bool. Returns the outputs
    `[B, H, N, D]` and the log-sum-exp of each query's scores `[B, H, N]` (float32), and with `return_weights` the
    attention probabilities of each entry over the original positions `[B, H, N, positions]` (undropped)."""
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
    self_match = q_pos[..., :, None] == k_pos[..., None, :] if mask_self else None
    probs, logits = masked_softmax(scores, mask, self_match)
    dropped = nn.functional.dropout(probs, p=dropout, training=training)
    output = torch.matmul(dropped.to(v.dtype), v).reshape(batch, heads, length, -1)
    if not return_weights:
        return output, logits.reshape(batch, heads, length)
    # Dense weights [B, H, L_positions, L_positions] of each entry's query over the keys' original positions.
    num_positions = num_positions or length
    dense = probs.new_zeros(batch, heads, chunks, chunk_length, num_positions)
    dense.scatter_add_(-1, k_pos[..., None, :].expand_as(probs), probs)
    return output, logits.reshape(batch, heads, length), dense.reshape(batch, heads, length, num_positions)


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


def bucket_factors(num_buckets) -> list[int]:
    return [num_buckets] if isinstance(num_buckets, int) else list(num_buckets)


_SEEDED_ROTATIONS: dict = {}


def seeded_rotations(seed: int, shape: tuple, device) -> torch.Tensor:
    """float32 `torch.randn(shape)` from a generator seeded with `seed` on `device`, drawn once and kept: a seeded
    generator cannot be created inside torch.compile, so a compiled model reads the rotations its first (eager) call
    drew. (torch.export runs the Python code and draws them itself.)"""
    key = (seed, tuple(shape), str(device))
    if key not in _SEEDED_ROTATIONS:
        if len(_SEEDED_ROTATIONS) > 64:
            _SEEDED_ROTATIONS.clear()
        generator = torch.Generator(device=device).manual_seed(seed)
        _SEEDED_ROTATIONS[key] = torch.randn(shape, device=device, dtype=torch.float32, generator=generator)
    return _SEEDED_ROTATIONS[key]


def raw_buckets(vectors: torch.Tensor, num_hashes: int, num_buckets, seed: int | None = None) -> torch.Tensor:
    """Angular LSH buckets `[B, H, num_hashes, L]` in [0, prod(num_buckets)), without padding bucket or round offsets.

    With `seed`, the rotations are drawn from a generator seeded with it (the same numbers as transformers'
    `torch.manual_seed(hash_seed)`, without touching the global random state); without, from the global RNG. The
    rotation is applied in float32 whatever the dtype of `vectors`."""
    factors = bucket_factors(num_buckets)
    heads, dim = vectors.shape[1], vectors.shape[-1]
    vectors = vectors.detach().float()
    shape = (heads, dim, num_hashes, sum(factors) // 2)
    if seed is None:
        rotations = torch.randn(shape, device=vectors.device, dtype=torch.float32)
    else:
        rotations = seeded_rotations(seed, shape, vectors.device)
    rotated = torch.einsum("bmtd,mdhr->bmhtr", vectors, rotations)
    buckets, start, product = None, 0, 1
    for factor in factors:
        part = rotated[..., start : start + factor // 2]
        part_buckets = torch.argmax(torch.cat([part, -part], dim=-1), dim=-1)
        buckets = part_buckets if buckets is None else buckets + product * part_buckets
        start, product = start + factor // 2, product * factor
    return buckets


def hash_vectors(
    vectors: torch.Tensor,
    num_hashes: int,
    num_buckets,
    seed: int | None = None,
    key_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Angular LSH buckets `[B, H, num_hashes, L]`, already offset by round (see the module docstring).

    With `key_valid [B, L]`, invalid positions go into the extra bucket prod(num_buckets). The extra bucket is added
    whenever a mask is given (not only when it masks something): the round offsets then grow by one, which leaves the
    sort order unchanged, and no data-dependent check is needed (torch.export / torch.compile trace it)."""
    buckets = raw_buckets(vectors, num_hashes, num_buckets, seed)
    total = math.prod(bucket_factors(num_buckets))
    if key_valid is not None:
        buckets = torch.where(key_valid[:, None, None, :].to(torch.bool), buckets, total)
        total = total + 1
    offsets = (torch.arange(num_hashes, device=vectors.device) * total).view(1, 1, -1, 1)
    return buckets + offsets


def combine_rounds(output: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """`output [B, H, R, L, D]`, float32 `logits [B, H, R, L]` -> `[B, H, L, D]` weighted by softmax_r(logits)."""
    weights = torch.exp(logits - torch.logsumexp(logits, dim=2, keepdim=True))[..., None]
    return (output * weights).sum(2).to(output.dtype)


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
    output_attentions: bool = False,
):
    """LSH self-attention. `query_key`, `value [B, H, L, D]`; `key_valid [B, L]` bool. Returns `[B, H, L, D]`, and
    with `output_attentions` also the dense `[B, H, L, L]` attention weights each query actually used (its rounds'
    probabilities over the original key positions, weighted by the rounds' weights; rows sum to 1)."""
    batch, heads, length, dim = query_key.shape
    valid = key_valid[:, None, :] if key_valid is not None else None
    if length <= chunk_length:
        positions = torch.arange(length, device=query_key.device)[None, None]
        result = chunked_attention(
            query_key,
            length_normalise(query_key),
            value,
            positions,
            length,
            0,
            0,
            causal,
            valid,
            True,
            dropout,
            training,
            output_attentions,
        )
        return (result[0], result[2]) if output_attentions else result[0]
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

    def gather(x):
        return torch.gather(
            x.repeat(1, 1, num_hashes, 1), 2, sorted_positions[..., None].expand(-1, -1, -1, x.shape[-1])
        )

    sorted_qk, sorted_value = gather(query_key), gather(value)
    sorted_valid = None
    if valid is not None:
        sorted_valid = torch.gather(valid.expand(batch, heads, length).repeat(1, 1, num_hashes), 2, sorted_positions)
    result = chunked_attention(
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
        output_attentions,
        length,
    )
    output = torch.gather(result[0], 2, undo_sort[..., None].expand_as(result[0]))
    logits = torch.gather(result[1], 2, undo_sort).view(batch, heads, num_hashes, length)
    output = output.view(batch, heads, num_hashes, length, -1)
    combined = output[:, :, 0] if num_hashes == 1 else combine_rounds(output, logits)
    if not output_attentions:
        return combined
    dense = torch.gather(result[2], 2, undo_sort[..., None].expand_as(result[2]))
    dense = dense.view(batch, heads, num_hashes, length, length)
    round_weights = torch.exp(logits - torch.logsumexp(logits, dim=2, keepdim=True))[..., None]
    return combined, (dense * round_weights).sum(2)


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
    output_attentions: bool = False,
):
    """Reformer's local attention: chunks of `chunk_length` attend to themselves and their neighbours (keys scaled
    by 1/sqrt(d)). `[B, H, L, D]` in and out (with `output_attentions`, also the `[B, H, L, L]` weights); sequences
    not longer than one chunk use full attention."""
    length = query.shape[2]
    key = key / math.sqrt(query.shape[-1])
    valid = key_valid[:, None, :] if key_valid is not None else None
    positions = torch.arange(length, device=query.device)[None, None]
    if length <= chunk_length:
        chunk_length, before, after = length, 0, 0
    elif length % chunk_length:
        raise ValueError(f"sequence length {length} must be a multiple of local_attn_chunk_length ({chunk_length})")
    result = chunked_attention(
        query,
        key,
        value,
        positions,
        chunk_length,
        before,
        after,
        causal,
        valid,
        False,
        dropout,
        training,
        output_attentions,
    )
    return (result[0], result[2]) if output_attentions else result[0]


# ------------------------------------------------------------------------------------------------ incremental decoding
def _attend_window(query, keys, values, key_positions, key_valid, query_position, mask_self):
    """One query per row against a window of keys. `query [B, H, R, D]`, `keys/values [B, H, R, W, D]`,
    `key_positions [B, H, R, W]` (original positions), `key_valid [B, H, R, W]`. Causal. Returns the output
    `[B, H, R, D]`, float32 log-sum-exp `[B, H, R]` and probabilities `[B, H, R, W]`."""
    scores = torch.einsum("bhrd,bhrwd->bhrw", query, keys)
    allowed = key_valid & (key_positions <= query_position)
    self_match = key_positions == query_position if mask_self else None
    probs, logits = masked_softmax(scores, allowed, self_match)
    output = torch.einsum("bhrw,bhrwd->bhrd", probs.to(values.dtype), values)
    return output, logits[..., 0], probs


def _window_weights(probs, key_positions, length):
    """Probabilities over a window `[B, H, R, W]` (rounds already weighted) -> dense `[B, H, 1, length]`."""
    batch, heads = probs.shape[:2]
    dense = probs.new_zeros(batch, heads, length)
    dense.scatter_add_(
        -1, key_positions.reshape(batch, heads, -1).clamp(max=length - 1), probs.reshape(batch, heads, -1)
    )
    return dense[:, :, None]


def lsh_attention_step(
    query_key: torch.Tensor,
    value: torch.Tensor,
    past_buckets: torch.Tensor | None,
    key_valid: torch.Tensor,
    padded_length: int,
    num_hashes: int,
    num_buckets,
    chunk_length: int,
    before: int = 1,
    after: int = 0,
    seed: int | None = None,
    output_attentions: bool = False,
):
    """The last position's output of `lsh_attention` (causal) over `query_key`, `value [B, H, n, D]` (the cached past
    followed by the new position), as if the sequence were padded to `padded_length` (what the model does), at
    O(window) floating-point work: the past's buckets `past_buckets [B, H, R, n - 1]` (`raw_buckets`, or None: hashed
    here) give the new position's rank in each round's sorted order, hence its chunk and the window of sorted entries
    it attends to. `key_valid [B, n]` bool. Returns (output `[B, H, 1, D]`, buckets of all n positions or None when
    the sequence fits in one chunk, weights `[B, H, 1, n]` or None)."""
    batch, heads, length, dim = query_key.shape
    query = query_key[:, :, -1]
    t = length - 1
    positions = torch.arange(length, device=query_key.device)
    if padded_length <= chunk_length:  # full attention, as `lsh_attention` for one chunk
        window = lambda x: x[:, :, None]  # noqa: E731
        key_positions = positions.view(1, 1, 1, -1).expand(batch, heads, 1, length)
        output, _, probs = _attend_window(
            query[:, :, None],
            window(length_normalise(query_key)),
            window(value),
            key_positions,
            key_valid[:, None, None, :].expand(batch, heads, 1, length),
            t,
            True,
        )
        weights = _window_weights(probs, key_positions, length) if output_attentions else None
        return output, None, weights
    new_buckets = raw_buckets(query_key[:, :, -1:], num_hashes, num_buckets, seed)
    if past_buckets is None or past_buckets.shape[-1] != t:
        past_buckets = raw_buckets(query_key[:, :, :t], num_hashes, num_buckets, seed)
    buckets = torch.cat([past_buckets, new_buckets], dim=-1)  # [B, H, R, n]
    pad_bucket = math.prod(bucket_factors(num_buckets))
    sort_buckets = torch.where(key_valid[:, None, None, :], buckets, pad_bucket)
    sort_buckets = nn.functional.pad(sort_buckets, (0, padded_length - length), value=pad_bucket)  # [B, H, R, Lp]
    # Rank of the new position (the last real one) in each round: entries with a smaller bucket, or the same bucket
    # and a smaller position (every other real position is smaller).
    query_bucket = sort_buckets[..., t : t + 1]
    all_positions = torch.arange(padded_length, device=query_key.device)
    rank = ((sort_buckets < query_bucket) | ((sort_buckets == query_bucket) & (all_positions < t))).sum(-1)
    # Position of every sorted entry, the rounds one after the other (round r starts at r * Lp, a chunk boundary).
    sort_keys = sort_buckets * padded_length + all_positions
    sorted_positions = torch.argsort(sort_keys, dim=-1).flatten(2)  # [B, H, R * Lp]
    total_chunks = num_hashes * padded_length // chunk_length
    chunk = torch.div(
        torch.arange(num_hashes, device=rank.device) * padded_length + rank, chunk_length, rounding_mode="floor"
    )
    offsets = torch.arange(-before, after + 1, device=rank.device)
    window_chunks = torch.remainder(chunk[..., None] + offsets, total_chunks)  # [B, H, R, before + 1 + after]
    window_index = (window_chunks[..., None] * chunk_length + torch.arange(chunk_length, device=rank.device)).flatten(3)
    key_positions = torch.gather(sorted_positions[:, :, None].expand(-1, -1, num_hashes, -1), 3, window_index)
    gather_positions = key_positions.clamp(max=t)  # entries past the sequence are padding, masked below
    pick = lambda x: torch.gather(  # noqa: E731
        x[:, :, None].expand(-1, -1, num_hashes, -1, -1),
        3,
        gather_positions[..., None].expand(-1, -1, -1, -1, x.shape[-1]),
    )
    valid = nn.functional.pad(key_valid, (0, padded_length - length), value=False)
    window_valid = torch.gather(valid[:, None, None].expand(-1, heads, num_hashes, -1), 3, key_positions)
    output, logits, probs = _attend_window(
        query[:, :, None].expand(-1, -1, num_hashes, -1),
        pick(length_normalise(query_key)),
        pick(value),
        key_positions,
        window_valid,
        t,
        True,
    )
    round_weights = torch.exp(logits - torch.logsumexp(logits, dim=2, keepdim=True))  # [B, H, R]
    combined = (
        output[:, :, :1]
        if num_hashes == 1
        else (output * round_weights[..., None]).sum(2, keepdim=True).to(output.dtype)
    )
    weights = None
    if output_attentions:
        weights = _window_weights(probs * round_weights[..., None], gather_positions, length)
    return combined, buckets, weights


def local_attention_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_valid: torch.Tensor,
    padded_length: int,
    chunk_length: int,
    before: int = 1,
    output_attentions: bool = False,
):
    """The last position's output of `local_attention` (causal) over `key`, `value [B, H, n, D]` (cached past and
    the new position; `query [B, H, 1, D]`): the keys of its chunk and the `before` chunks before it. Returns
    (`[B, H, 1, D]`, weights `[B, H, 1, n]` or None)."""
    batch, heads, length, dim = key.shape
    t = length - 1
    start = 0 if padded_length <= chunk_length else max(0, (t // chunk_length - before) * chunk_length)
    keys, values = key[:, :, None, start:] / math.sqrt(dim), value[:, :, None, start:]
    key_positions = torch.arange(start, length, device=key.device).view(1, 1, 1, -1).expand(batch, heads, 1, -1)
    window_valid = key_valid[:, None, None, start:].expand(batch, heads, 1, -1)
    output, _, probs = _attend_window(query, keys, values, key_positions, window_valid, t, False)
    weights = _window_weights(probs, key_positions, length) if output_attentions else None
    return output, weights
