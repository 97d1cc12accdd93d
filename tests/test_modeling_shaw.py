"""Shaw Transformer (txv_shaw): the shared tester (decoder, encoder), relation-aware attention against a naive
O(n^2 d) implementation written from the paper's equations (eqs. 3-4 with a^K_ij, a^V_ij materialised per pair),
key/value cache, padding invariance, EncoderDecoderModel."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderModel

import hf_txvariants  # noqa: F401
from hf_txvariants.modeling_shaw import (
    ShawForCausalLM,
    ShawForMaskedLM,
    ShawForSequenceClassification,
    ShawModel,
)
from hf_txvariants.txv_compat import cache_field, output_cache
from hf_txvariants.txv_shaw_attention import RelationAwareSelfAttention, relative_distance_index
from tiny_configs import tiny_config
from txv_tester import TxvModelTesterMixin

# this file's tiny model: tiny_config("txv_shaw") with dropout on (the tester checks that evaluation turns it off and
# that gradient checkpointing replays it)
TINY_OVERRIDES = dict(dropout=0.1, attention_dropout=0.1)


class TestShawDecoder(TxvModelTesterMixin):
    """With relative values (the default) the value term needs the attention weights: eager only."""

    model_type = "txv_shaw"
    config_overrides = TINY_OVERRIDES
    supports_sdpa = False
    model_classes = (ShawModel, ShawForCausalLM, ShawForSequenceClassification)
    causal_lm_class = ShawForCausalLM


@pytest.mark.slow
class TestShawEncoderKeysOnly(TxvModelTesterMixin):
    """Without relative values the key term goes through sdpa as a bias: eager == sdpa is checked here."""

    model_type = "txv_shaw"
    model_classes = (ShawModel, ShawForMaskedLM, ShawForSequenceClassification)
    config_overrides = {**TINY_OVERRIDES, "is_decoder": False, "relative_values": False, "pre_lnorm": True}


def naive_relation_aware_attention(attn: RelationAwareSelfAttention, x, past=None, causal=True):
    """Shaw et al. eqs. (3), (4), (2) literally: for every pair (i, j), a^K_ij = w^K_clip(j-i,k), a^V_ij likewise;
    e_ij = q_i . (k_j + a^K_ij) / sqrt(d_z); alpha = softmax_j; z_i = sum_j alpha_ij (v_j + a^V_ij).
    `past`: earlier inputs (the cache); queries are the positions of x, after them."""
    full = x if past is None else torch.cat([past, x], dim=1)
    batch, n_q, _ = x.shape
    n_k = full.shape[1]
    offset = n_k - n_q
    k = attn.max_relative_position
    outputs = torch.zeros(batch, n_q, attn.num_heads * attn.head_dim)
    for h in range(attn.num_heads):
        part = slice(h * attn.head_dim, (h + 1) * attn.head_dim)
        q = x @ attn.q_proj.weight[part].t() + attn.q_proj.bias[part]
        keys = full @ attn.k_proj.weight[part].t() + attn.k_proj.bias[part]
        values = full @ attn.v_proj.weight[part].t() + attn.v_proj.bias[part]
        for b in range(batch):
            for i in range(n_q):
                pos_i = offset + i
                js = [j for j in range(n_k) if not causal or j <= pos_i]
                a_k = torch.stack([attn.relative_key_embeddings.weight[max(-k, min(k, j - pos_i)) + k] for j in js])
                e = torch.stack([q[b, i] @ (keys[b, j] + a_k[n]) for n, j in enumerate(js)]) / attn.head_dim**0.5
                alpha = e.softmax(0)
                z = torch.zeros(attn.head_dim)
                for n, j in enumerate(js):
                    a_v = 0.0
                    if attn.relative_value_embeddings is not None:
                        a_v = attn.relative_value_embeddings.weight[max(-k, min(k, j - pos_i)) + k]
                    z = z + alpha[n] * (values[b, j] + a_v)
                outputs[b, i, part] = z
    return attn.o_proj(outputs)


def make_attention(relative_values=True, seed=0):
    torch.manual_seed(seed)
    attn = RelationAwareSelfAttention(
        tiny_config("txv_shaw", **TINY_OVERRIDES, relative_values=relative_values), layer_idx=0
    ).eval()
    with torch.no_grad():  # non-trivial relative embeddings and biases
        for parameter in attn.parameters():
            parameter.normal_(0, 0.5)
    return attn


def causal_mask(n_q, n_k):
    allowed = torch.ones(n_q, n_k).tril(n_k - n_q).bool()
    return torch.zeros(n_q, n_k).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


@pytest.mark.parametrize("relative_values", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_naive_equations(relative_values, causal):
    attn = make_attention(relative_values)
    x = torch.randn(2, 9, 16)  # longer than 2k + 1 = 7: distances get clipped
    mask = causal_mask(9, 9) if causal else None
    with torch.no_grad():
        ours = attn(x, mask)[0]
        naive = naive_relation_aware_attention(attn, x, causal=causal)
    torch.testing.assert_close(ours, naive, atol=1e-5, rtol=0)


def test_attention_with_cache_queries_are_the_last_positions():
    attn = make_attention()
    past, x = torch.randn(2, 6, 16), torch.randn(2, 3, 16)
    cache = DynamicCache()
    with torch.no_grad():
        attn(past, causal_mask(6, 6), cache=cache)
        ours = attn(x, causal_mask(3, 9), cache=cache)[0]
        naive = naive_relation_aware_attention(attn, x, past=past, causal=True)
    torch.testing.assert_close(ours, naive, atol=1e-5, rtol=0)


@pytest.mark.exact
def test_relative_distance_index():
    index = relative_distance_index(2, 5, 2, "cpu")  # queries at positions 3, 4
    expected = torch.tensor([[-2, -2, -1, 0, 1], [-2, -2, -2, -1, 0]]) + 2
    assert torch.equal(index, expected)


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return ShawForCausalLM(tiny_config("txv_shaw", **{**TINY_OVERRIDES, **overrides})).eval()


def ids(batch=2, length=9, seed=0):
    return torch.randint(1, 21, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_cache_incremental_equals_full():
    model = build()
    x = ids(length=11)
    with torch.no_grad():
        full = model(x).logits
        first = model(x[:, :5], use_cache=True)
        second = model(x[:, 5:6], cache=output_cache(first))
        third = model(x[:, 6:], cache=output_cache(second))
    torch.testing.assert_close(torch.cat([first.logits, second.logits, third.logits], 1), full, atol=1e-5, rtol=0)


@pytest.mark.exact
def test_translation_invariant_and_padding_invariant():
    """Only distances matter: a left-padded row gives the same outputs as alone, and generate agrees."""
    model = build()
    x = ids(1, 6)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 6)], dim=1).long()
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, 3:], model(x).logits, atol=1e-5, rtol=0)
    batch = torch.cat([padded, ids(1, 9, seed=4)])
    batch_mask = torch.cat([mask, torch.ones(1, 9, dtype=torch.long)])
    together = model.generate(batch, attention_mask=batch_mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    alone = model.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(together[0, 3:], alone[0])


def test_no_absolute_positions_and_errors():
    model = build()
    assert not any("position" in n and "relative" not in n for n, _ in model.named_parameters())
    with pytest.raises(ValueError, match="max_relative_position"):
        tiny_config("txv_shaw", max_relative_position=0)
    with pytest.raises(ValueError, match="is_decoder=False"):
        ShawForMaskedLM(tiny_config("txv_shaw"))
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids(), attention_mask=torch.ones(2, 4))


def test_encoder_decoder_model():
    torch.manual_seed(0)
    encoder = ShawModel(tiny_config("txv_shaw", **TINY_OVERRIDES, is_decoder=False))
    decoder = ShawForCausalLM(tiny_config("txv_shaw", **TINY_OVERRIDES, add_cross_attention=True))
    model = EncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id = 1
    model.config.pad_token_id = 0
    model.generation_config.decoder_start_token_id = 1
    model.generation_config.pad_token_id = 0
    source, target = ids(2, 7, seed=1), ids(2, 6, seed=2)
    source_mask = torch.ones_like(source)
    source_mask[1, 4:] = 0
    model.train()
    model(input_ids=source, attention_mask=source_mask, labels=target).loss.backward()
    assert model.decoder.model.layers[1].cross_attn.q_proj.weight.grad is not None
    model.eval()
    with torch.no_grad():
        full = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
        encoder_outputs = model.encoder(input_ids=source, attention_mask=source_mask)
        first = model(encoder_outputs=encoder_outputs, attention_mask=source_mask, decoder_input_ids=target[:, :3])
        second = model(
            encoder_outputs=encoder_outputs,
            attention_mask=source_mask,
            decoder_input_ids=target[:, 3:],
            **cache_field(output_cache(first)),  # transformers' EncoderDecoderModel: the release's own name
        )
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), full, atol=1e-5, rtol=0)
    generated = model.generate(source, attention_mask=source_mask, max_new_tokens=4, do_sample=False)
    assert generated.shape == (2, 5)


def test_no_per_pair_vectors_are_materialised():
    """The efficient form: no intermediate tensor has a (query, key, head_dim) layout, i.e. no a_ij vectors per pair."""
    from torch.utils._python_dispatch import TorchDispatchMode

    shapes = []

    class RecordShapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor):
                    shapes.append(tuple(tensor.shape))
            return out

    def per_pair(recorded):  # a shape holding the query and key lengths (11, 11) together with head_dim (8)
        return [shape for shape in recorded if shape.count(11) >= 2 and 8 in shape]

    attn = make_attention()
    x = torch.randn(2, 11, 16)  # q = k = 11, head_dim = 8, 2k + 1 = 7: all different
    with torch.no_grad(), RecordShapes():
        attn(x, causal_mask(11, 11))
    assert (2, 2, 11, 11) in shapes  # the attention scores exist (the recording works)
    assert not per_pair(shapes), per_pair(shapes)
    shapes.clear()
    with torch.no_grad(), RecordShapes():  # the detector catches the materialised form a^K_ij = w^K[index_ij]
        attn.relative_key_embeddings(relative_distance_index(11, 11, 3, "cpu"))
    assert per_pair(shapes)
