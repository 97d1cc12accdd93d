"""Reformer (txv_reformer): shared tester, parity with transformers' ReformerModelWithLMHead checkpoints (fixtures
made by tests/fixtures/make_txv_reformer_fixtures.py), exact reversible gradients, any input length in training."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from txv_tester import TxvModelTesterMixin

from hf_txvariants import (
    TxvReformerConfig,
    TxvReformerForCausalLM,
    TxvReformerForSequenceClassification,
    TxvReformerModel,
)

FIXTURES = Path(__file__).parent / "fixtures"

TINY = dict(
    vocab_size=31,
    hidden_size=16,
    num_attention_heads=2,
    attention_head_size=8,
    feed_forward_size=24,
    attn_layers=["local", "lsh"],
    axial_pos_shape=[8, 8],
    axial_pos_embds_dim=[8, 8],
    max_position_embeddings=64,
    lsh_attn_chunk_length=4,
    local_attn_chunk_length=4,
    num_buckets=4,
    num_hashes=2,
    hash_seed=7,
    hidden_dropout_prob=0.0,
    local_attention_probs_dropout_prob=0.0,
)


class TestTxvReformer(TxvModelTesterMixin):
    config_class = TxvReformerConfig
    model_classes = (TxvReformerModel, TxvReformerForCausalLM, TxvReformerForSequenceClassification)
    causal_lm_class = TxvReformerForCausalLM
    tiny_config_kwargs = TINY
    supports_sdpa = False
    seq_length = 13  # not a multiple of the chunk length: padded inside


CASES = ["multiple", "not_multiple", "short", "padded"]


@pytest.mark.parametrize("case", CASES)
def test_loads_transformers_reformer_checkpoint_and_reproduces_it(case):
    reference = load_file(str(FIXTURES / "txv_reformer_reference.safetensors"))
    model = TxvReformerForCausalLM.from_pretrained(FIXTURES / "txv_reformer_hf").eval()
    ids, mask = reference[f"{case}.input_ids"], reference[f"{case}.attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(logits[real], reference[f"{case}.logits"][real], atol=1e-5, rtol=1e-5)


def test_parity_depends_on_the_hash_seed():
    """Guard: another seed gives other buckets and other outputs, so the parity test does test hashing."""
    reference = load_file(str(FIXTURES / "txv_reformer_reference.safetensors"))
    model = TxvReformerForCausalLM.from_pretrained(FIXTURES / "txv_reformer_hf", hash_seed=99).eval()
    with torch.no_grad():
        logits = model(input_ids=reference["multiple.input_ids"]).logits
    assert not torch.allclose(logits, reference["multiple.logits"], atol=1e-3)


def _model(**overrides):
    torch.manual_seed(0)
    return TxvReformerForCausalLM(TxvReformerConfig(**{**TINY, **overrides}))


def test_reversible_gradients_equal_stored_activations_with_dropout():
    dropout = dict(hidden_dropout_prob=0.2, local_attention_probs_dropout_prob=0.2, lsh_attention_probs_dropout_prob=0.2,
                   hash_seed=None, attn_layers=["local", "lsh", "lsh"], chunk_size_feed_forward=3)
    ids = torch.randint(0, 31, (2, 16), generator=torch.Generator().manual_seed(0))
    results = []
    for reversible in (False, True):
        model = _model(reversible=reversible, **dropout).train()
        torch.manual_seed(5)
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-6, rtol=0)
    for name, grad in results[0][1].items():
        if grad is None:
            assert results[1][1][name] is None, name
            continue
        torch.testing.assert_close(results[1][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_any_length_trains():
    """No length restriction: 13 is not a multiple of the chunk length (transformers raises in training)."""
    model = _model().train()
    ids = torch.randint(0, 31, (2, 13))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_padding_does_not_change_real_positions():
    """With one hash round, right padding (masked, in its own bucket) leaves the real positions unchanged. (With
    several rounds the sorted rounds are concatenated, so the first chunk of a round looks back at the end of the
    previous round: how much padding there is then changes what it sees, in transformers' Reformer too.)"""
    model = _model(num_hashes=1).eval()
    ids = torch.randint(1, 31, (1, 10), generator=torch.Generator().manual_seed(3))
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], 1).long()
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, :10], model(ids).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "field, value",
    [("attn_layers", ["lsh", "global"]), ("num_buckets", 3), ("axial_pos_embds_dim", [4, 4]), ("num_hashes", 0),
     ("axial_pos_shape", [4, 4])],
)
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        TxvReformerConfig(**{**TINY, field: value})


def test_bad_input_names_tensor():
    model = _model().eval()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, 31]]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="is_decoder"):
        TxvReformerForCausalLM(TxvReformerConfig(**{**TINY, "is_decoder": False}))
