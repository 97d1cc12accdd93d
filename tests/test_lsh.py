"""LSH attention against a naive loop implementation of the paper's algorithm (Kitaev et al. 2020, section 3), and
the properties the paper states."""

import math

import pytest
import torch

from hf_txvariants.txv_lsh import hash_vectors, local_attention, lsh_attention


def naive_hash(x, rotations):
    """h(x) = argmax([xR ; -xR]) (Andoni et al. 2015), one rotation per round. x [L, D], rotations [D, R, b/2]."""
    out = []
    for r in range(rotations.shape[1]):
        projected = x @ rotations[:, r, :]
        out.append(torch.cat([projected, -projected], -1).argmax(-1))
    return torch.stack(out)  # [R, L]


def naive_lsh(qk, v, buckets, chunk, causal=True):
    """One head. Sort each round by (bucket, position), concatenate the rounds, chunk, attend to own and previous
    chunk (circularly); mask the future (-1e9) and the own position (-1e5); combine rounds by softmax of their
    log-normalisers."""
    rounds, length = buckets.shape
    keys = qk / torch.sqrt((qk**2).mean(-1, keepdim=True) + 1e-6) / math.sqrt(qk.shape[-1])
    entries = []
    for r in range(rounds):
        entries += [(r, i) for i in sorted(range(length), key=lambda i: (int(buckets[r, i]), i))]
    n_chunks = len(entries) // chunk
    outputs = torch.zeros(rounds, length, v.shape[-1], dtype=torch.float64)
    lse = torch.zeros(rounds, length, dtype=torch.float64)
    for g, (r, i) in enumerate(entries):
        c = g // chunk
        candidates = [entries[k] for cc in ((c - 1) % n_chunks, c) for k in range(cc * chunk, (cc + 1) * chunk)]
        scores = []
        for _, j in candidates:
            s = float(qk[i] @ keys[j])
            if causal and j > i:
                s = -1e9
            if j == i:
                s = -1e5
            scores.append(s)
        scores = torch.tensor(scores, dtype=torch.float32)  # float32 as the model (see the combination below)
        lse[r, i] = torch.logsumexp(scores, 0)
        weights = torch.exp(scores - torch.logsumexp(scores, 0)).double()
        outputs[r, i] = sum(w * v[j].double() for w, (_, j) in zip(weights, candidates))
    # Combined as exp(lse_r - logsumexp_r(lse)) in float32, like the model (and transformers): float32 resolves
    # -1e5 (the self-mask value) only to 2^-7, so a query that sees only itself in two rounds gets 2 x 0.4989, and
    # one that sees two copies of itself (its position from two rounds) in one chunk too.
    lse = lse.float()
    weights = torch.exp(lse - torch.logsumexp(lse, 0)).double()
    return (weights[..., None] * outputs).sum(0)


@pytest.mark.parametrize("num_hashes, num_buckets", [(1, 4), (2, 4), (3, [2, 4])])
def test_lsh_attention_matches_naive_loops(num_hashes, num_buckets):
    generator = torch.Generator().manual_seed(0)
    batch, heads, length, dim, chunk = 2, 2, 16, 4, 4
    qk = torch.randn(batch, heads, length, dim, generator=generator)
    v = torch.randn(batch, heads, length, dim, generator=generator)
    result = lsh_attention(qk, v, num_hashes, num_buckets, chunk, seed=3)
    buckets = hash_vectors(qk, num_hashes, num_buckets, seed=3)
    total = num_buckets if isinstance(num_buckets, int) else math.prod(num_buckets)
    for b in range(batch):
        for h in range(heads):
            round_buckets = buckets[b, h] - (torch.arange(num_hashes) * total)[:, None]
            assert round_buckets.min() >= 0 and round_buckets.max() < total
            expected = naive_lsh(qk[b, h], v[b, h], round_buckets, chunk)
            torch.testing.assert_close(result[b, h].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.exact
def test_hash_matches_random_rotation_formula():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 10, 6, generator=generator)
    buckets = hash_vectors(x, 2, 8, seed=5)
    rotations = torch.randn((2, 6, 2, 4), generator=torch.Generator().manual_seed(5))
    for h in range(2):
        expected = naive_hash(x[0, h], rotations[h]) + torch.tensor([[0], [8]])
        assert torch.equal(buckets[0, h], expected)
    # transformers draws the same rotations after torch.manual_seed(hash_seed)
    torch.manual_seed(5)
    assert torch.equal(torch.randn((2, 6, 2, 4)), rotations)


@pytest.mark.exact
def test_angular_hashing_properties():
    x = torch.randn(1, 1, 32, 8)
    buckets = hash_vectors(torch.cat([x, 3 * x, -x], 2), 1, 16, seed=0)[0, 0, 0]
    assert torch.equal(buckets[:32], buckets[32:64])  # scale invariant (angular)
    assert torch.equal((buckets[:32] + 8) % 16, buckets[64:])  # x and -x: opposite buckets


def test_self_attention_only_when_nothing_else():
    qk = torch.randn(1, 1, 8, 4)
    v = torch.randn(1, 1, 8, 4)
    out = lsh_attention(qk, v, 1, 2, 8, seed=0)  # one chunk: full causal attention
    torch.testing.assert_close(out[0, 0, 0], v[0, 0, 0])  # position 0 has only itself
    # Position 1 sees position 0 and (with weight ~exp(-1e5)) itself: the output is v[0].
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, 0])


@pytest.mark.exact
def test_padding_bucket_and_hash_seed():
    x = torch.randn(1, 1, 6, 4)
    valid = torch.tensor([[True, True, True, True, False, False]])
    buckets = hash_vectors(x, 2, 4, seed=0, key_valid=valid)[0, 0]
    assert (buckets[0, 4:] == 4).all() and (buckets[1, 4:] == 9).all()  # extra bucket; rounds offset by 5
    assert torch.equal(hash_vectors(x, 2, 4, seed=0), hash_vectors(x, 2, 4, seed=0))
    state = torch.get_rng_state()
    hash_vectors(x, 2, 4, seed=0)
    assert torch.equal(state, torch.get_rng_state())  # a fixed seed does not touch the global random state


def test_local_attention_matches_dense_mask():
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=generator) for _ in range(3))
    out = local_attention(q, k, v, 4, before=1)
    scores = q @ k.transpose(-1, -2) / 2.0
    i, j = torch.arange(12)[:, None], torch.arange(12)[None]
    allowed = (j <= i) & (j // 4 >= i // 4 - 1)
    expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_lengths_not_multiple_of_chunk_raise():
    with pytest.raises(ValueError, match="lsh_attn_chunk_length"):
        lsh_attention(torch.randn(1, 1, 10, 4), torch.randn(1, 1, 10, 4), 1, 4, 4)


def _padded(x, padded_length):
    return torch.nn.functional.pad(x, (0, 0, 0, padded_length - x.shape[2]))


@pytest.mark.exact
@pytest.mark.parametrize(
    "num_hashes, num_buckets, before, after", [(1, 4, 1, 0), (2, 4, 1, 0), (4, [2, 4], 1, 1), (2, 8, 2, 0)]
)
@pytest.mark.parametrize("length", [3, 9, 12, 17])
def test_lsh_step_equals_full_attention_at_the_last_position(num_hashes, num_buckets, before, after, length):
    """The incremental step (cached buckets, one chunk window) gives the last position exactly what `lsh_attention`
    over the whole (padded) sequence gives it, whether the past's buckets are cached or hashed in the step."""
    from hf_txvariants.txv_lsh import lsh_attention_step, raw_buckets

    chunk = 4
    generator = torch.Generator().manual_seed(length)
    qk, v = torch.randn(2, 2, length, 8, generator=generator), torch.randn(2, 2, length, 8, generator=generator)
    padded_length = length if length <= chunk else -(-length // chunk) * chunk + (chunk if length == 12 else 0)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, 1] = False  # a padding position inside the past
    full_valid = torch.nn.functional.pad(valid, (0, padded_length - length), value=False)
    reference = lsh_attention(
        _padded(qk, padded_length),
        _padded(v, padded_length),
        num_hashes,
        num_buckets,
        chunk,
        before,
        after,
        True,
        full_valid,
        seed=3,
    )[:, :, length - 1 : length]
    past = raw_buckets(qk[:, :, :-1], num_hashes, num_buckets, seed=3)
    for past_buckets in (None, past):
        output, buckets, _ = lsh_attention_step(
            qk, v, past_buckets, valid, padded_length, num_hashes, num_buckets, chunk, before, after, seed=3
        )
        torch.testing.assert_close(output, reference, atol=1e-6, rtol=1e-5)
        if padded_length > chunk:
            assert torch.equal(buckets, raw_buckets(qk, num_hashes, num_buckets, seed=3))


@pytest.mark.parametrize("length", [3, 12, 14])
def test_local_step_equals_full_attention_at_the_last_position(length):
    from hf_txvariants.txv_lsh import local_attention_step

    generator = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(1, 2, length, 8, generator=generator) for _ in range(3))
    padded_length = length if length <= 4 else -(-length // 4) * 4
    valid = torch.ones(1, length, dtype=torch.bool)
    full_valid = torch.nn.functional.pad(valid, (0, padded_length - length), value=False)
    reference = local_attention(
        _padded(q, padded_length), _padded(k, padded_length), _padded(v, padded_length), 4, 1, 0, True, full_valid
    )[:, :, length - 1 : length]
    output, weights = local_attention_step(q[:, :, -1:], k, v, valid, padded_length, 4, 1, output_attentions=True)
    torch.testing.assert_close(output, reference, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights @ v, output, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("num_hashes", [1, 3])
def test_attention_weights_are_what_the_output_is_made_of(num_hashes):
    """The returned weights are each query's distribution over the key positions: rows sum to 1, the output is
    weights @ values, and no query weighs a later position."""
    generator = torch.Generator().manual_seed(0)
    qk, v = torch.randn(2, 2, 16, 8, generator=generator), torch.randn(2, 2, 16, 8, generator=generator)
    output, weights = lsh_attention(qk, v, num_hashes, 4, 4, seed=1, output_attentions=True)
    assert weights.shape == (2, 2, 16, 16)
    # Within float32's resolution of the rounds' log-normalisers near -1e5 (see naive_lsh): a query that sees only
    # itself sums to 2 x 0.4989 with several rounds.
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 16), atol=5e-3, rtol=0)
    torch.testing.assert_close(weights @ v, output, atol=1e-5, rtol=1e-5)
    assert float(weights.triu(1).abs().max()) < 1e-6
    local_output, local_weights = local_attention(qk, qk, v, 4, output_attentions=True)
    torch.testing.assert_close(local_weights @ v, local_output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_scores_do_not_overflow(dtype):
    """-1e9 does not fit in float16 (issue 12): scores are masked and normalised in float32 whatever the dtype."""
    generator = torch.Generator().manual_seed(0)
    qk, v = torch.randn(1, 2, 16, 8, generator=generator), torch.randn(1, 2, 16, 8, generator=generator)
    valid = torch.ones(1, 16, dtype=torch.bool)
    valid[0, -3:] = False
    reference = lsh_attention(qk, v, 2, 4, 4, key_valid=valid, seed=1)
    output = lsh_attention(qk.to(dtype), v.to(dtype), 2, 4, 4, key_valid=valid, seed=1)
    assert output.dtype == dtype and torch.isfinite(output).all()
    torch.testing.assert_close(output.float(), reference, atol=3e-2, rtol=3e-2)
