"""Reformer (txv_reformer): shared tester, parity with transformers' ReformerModelWithLMHead checkpoints (fixtures
made by tests/fixtures/make_txv_reformer_fixtures.py), exact reversible gradients, any input length in training."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_txvariants import (
    TxvReformerCache,
    TxvReformerForCausalLM,
    TxvReformerForSequenceClassification,
    TxvReformerModel,
)
from hf_txvariants.txv_compat import output_cache
from tiny_configs import tiny_config
from txv_tester import TxvModelTesterMixin

FIXTURES = Path(__file__).parent / "fixtures"


# this file's tiny model: tiny_config("txv_reformer") with two hashing rounds under a fixed seed and no dropout
TINY_OVERRIDES = dict(num_hashes=2, hash_seed=7, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0)


class TestTxvReformer(TxvModelTesterMixin):
    model_type = "txv_reformer"
    config_overrides = TINY_OVERRIDES
    model_classes = (TxvReformerModel, TxvReformerForCausalLM, TxvReformerForSequenceClassification)
    causal_lm_class = TxvReformerForCausalLM
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
    return TxvReformerForCausalLM(tiny_config("txv_reformer", **{**TINY_OVERRIDES, **overrides}))


def test_reversible_gradients_equal_stored_activations_with_dropout():
    dropout = dict(
        hidden_dropout_prob=0.2,
        local_attention_probs_dropout_prob=0.2,
        lsh_attention_probs_dropout_prob=0.2,
        hash_seed=None,
        attn_layers=["local", "lsh", "lsh"],
        chunk_size_feed_forward=3,
    )
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
        torch.testing.assert_close(
            model(padded, attention_mask=mask).logits[:, :10], model(ids).logits, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize(
    "field, value",
    [
        ("attn_layers", ["lsh", "global"]),
        ("num_buckets", 3),
        ("axial_pos_embds_dim", [4, 4]),
        ("num_hashes", 0),
        ("axial_pos_shape", [4, 4]),
    ],
)
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_reformer", **{field: value})


def test_bad_input_names_tensor():
    model = _model().eval()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, 31]]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="is_decoder"):
        TxvReformerForCausalLM(tiny_config("txv_reformer", is_decoder=False))


# ------------------------------------------------------------------------------------------------ generation cache
GREEDY = dict(do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)


def _trained_like(model):
    """Larger weights than the initialisation, so that attention is far from uniform and differences show."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model


@pytest.mark.exact
@pytest.mark.parametrize("attn_layers", [["local", "lsh"], ["local", "local"], ["lsh"]])
def test_cached_generation_equals_recomputing_the_sequence(attn_layers):
    """Greedy tokens and every step's logits with the cache equal those of recomputing the whole sequence, past
    several chunks (padded lengths 4 to 28), for the layer stacks where the cache is exact (up to the first LSH
    layer: see the module docstring)."""
    model = _trained_like(_model(attn_layers=attn_layers)).eval()
    ids = torch.randint(0, 31, (2, 3), generator=torch.Generator().manual_seed(1))
    cached = model.generate(ids, max_new_tokens=24, use_cache=True, **GREEDY)
    full = model.generate(ids, max_new_tokens=24, use_cache=False, **GREEDY)
    assert isinstance(output_cache(cached), TxvReformerCache) and output_cache(cached).seen_tokens == 26
    assert torch.equal(cached.sequences, full.sequences)
    for step, (a, b) in enumerate(zip(cached.logits, full.logits)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"step {step}")


@pytest.mark.exact
@pytest.mark.parametrize("attn_layers", [["local", "lsh", "local", "lsh"], ["lsh", "lsh", "local"]])
def test_cached_generation_is_exact_past_one_lsh_chunk_with_several_lsh_layers(attn_layers):
    """Past one LSH chunk, an LSH layer's outputs at earlier positions change when a token is added (the sort is
    over the whole sequence), so the layers after the first LSH layer are recomputed from its cached inputs: greedy
    tokens and every step's logits equal those of `use_cache=False`, batch 2 with an attention mask, padded lengths
    4 to 32 (several LSH chunks, rounds and bucket counts)."""
    model = _trained_like(_model(attn_layers=attn_layers, num_hashes=2, num_buckets=None)).eval()
    ids = torch.randint(1, 31, (2, 5), generator=torch.Generator().manual_seed(11))
    mask = torch.ones_like(ids)
    cached = model.generate(ids, attention_mask=mask, max_new_tokens=25, use_cache=True, **GREEDY)
    full = model.generate(ids, attention_mask=mask, max_new_tokens=25, use_cache=False, **GREEDY)
    assert isinstance(output_cache(cached), TxvReformerCache) and output_cache(cached).seen_tokens == 29
    for step, (a, b) in enumerate(zip(cached.logits, full.logits)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {step}")
    assert torch.equal(cached.sequences, full.sequences)


def test_cached_step_equals_full_forward_with_padding_and_hidden_states():
    """One step against a cache built from a right-padded prompt (row 1 has two padding positions) gives the hidden
    states and the logits of one full forward of the sequence, in every layer, past one LSH chunk."""
    model = _trained_like(_model(attn_layers=["lsh", "local", "lsh"], num_hashes=3)).eval()
    ids = torch.randint(1, 31, (2, 14), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 11:13] = 0
    with torch.no_grad():
        out = model(ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        step = model(ids[:, -1:], attention_mask=mask, cache=output_cache(out), output_hidden_states=True)
        full = model(ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    for layer, (a, b) in enumerate(zip(step.hidden_states, full.hidden_states)):
        torch.testing.assert_close(a[:, -1], b[:, -1], atol=1e-5, rtol=1e-5, msg=f"layer {layer}")
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.exact
def test_cache_reorders_rows_for_beam_search():
    model = _trained_like(_model(attn_layers=["local", "lsh"])).eval()
    ids = torch.randint(0, 31, (2, 3), generator=torch.Generator().manual_seed(3))
    kwargs = dict(max_new_tokens=10, num_beams=3, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(model.generate(ids, use_cache=True, **kwargs), model.generate(ids, use_cache=False, **kwargs))


def test_cache_takes_one_token_per_step_and_refuses_training():
    model = _model().eval()
    with torch.no_grad():
        cache = output_cache(model(torch.tensor([[1, 2, 3]]), use_cache=True))
    with pytest.raises(ValueError, match="one new token"):
        model(torch.tensor([[4, 5]]), cache=cache)
    model.train()
    with pytest.raises(ValueError, match="eval"):
        model(torch.tensor([[4]]), cache=cache)


# ------------------------------------------------------------------------------------------------ issue 13
def test_attentions_are_returned():
    model = _trained_like(_model()).eval()
    ids = torch.randint(0, 31, (2, 13), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    assert len(out.attentions) == 2
    for weights in out.attentions:
        assert weights.shape == (2, 2, 13, 13)
        assert float(weights.triu(1).abs().max()) < 1e-6  # causal
        assert float((weights.sum(-1) - 1).abs().max()) < 5e-3


def test_hidden_states_carry_gradients_and_returned_attentions_do_not():
    """The model card's limit (and the by-design skip of transformers' test_retain_grad_hidden_states_attentions): the
    attentions returned are a rebuilt copy that the output does not flow through; the hidden states are real nodes."""
    model = _model(reversible=True).train()
    ids = torch.randint(0, 31, (2, 8), generator=torch.Generator().manual_seed(3))
    out = model(ids, output_attentions=True, output_hidden_states=True)
    hidden, attentions = out.hidden_states[0], out.attentions[0]
    hidden.retain_grad()
    if attentions.requires_grad:
        attentions.retain_grad()
    out.logits.flatten()[0].backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    assert attentions.grad is None


def test_generate_returns_attentions_and_hidden_states_at_every_step():
    model = _model().eval()
    ids = torch.tensor([[1, 2, 3]])
    for use_cache in (True, False):
        out = model.generate(
            ids, max_new_tokens=3, use_cache=use_cache, output_attentions=True, output_hidden_states=True, **GREEDY
        )
        assert len(out.attentions) == 3 and all(step is not None and step[0] is not None for step in out.attentions)
        assert all(step is not None and step[0] is not None for step in out.hidden_states)
        assert out.attentions[-1][0].shape[-1] == 5  # the last step's query sees the 5 positions before it


def test_left_padded_generation_is_refused():
    model = _model().eval()
    ids = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match="left-padded"):
        model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=0)


def test_shift_labels_are_honoured():
    model = _model().eval()
    ids = torch.randint(0, 31, (2, 9), generator=torch.Generator().manual_seed(5))
    shifted = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, shift_labels=shifted).loss, model(ids, labels=ids).loss)
        other = model(ids, shift_labels=torch.roll(shifted, 1, 1)).loss
    assert not torch.allclose(other, model(ids, labels=ids).loss)


@pytest.mark.slow  # torch.export and torch.compile
def test_export_and_compile_trace_the_model():
    model = _model(use_cache=False).eval()
    ids = torch.randint(0, 31, (2, 13), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    reference = model(ids, attention_mask=mask).logits  # eager first: draws the seeded rotations
    exported = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask})
    torch.testing.assert_close(exported.module()(input_ids=ids, attention_mask=mask).logits, reference)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(ids, attention_mask=mask).logits, reference)


# ------------------------------------------------------------------------------------------------ issue 12
@pytest.mark.parametrize("mode", ["autocast_fp16", "autocast_bf16", "model_bf16"])
def test_mixed_precision_forward_and_backward_are_finite(mode):
    """Under fp16 / bf16 autocast and with the model cast to bf16, the loss and every gradient are finite and the
    loss is close to float32's (the masks at -1e9 overflowed float16 before)."""
    model = _model(attn_layers=["local", "lsh", "lsh"]).train()
    ids = torch.randint(1, 31, (2, 13), generator=torch.Generator().manual_seed(7))
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    reference = model(ids, attention_mask=mask, labels=ids).loss.item()
    if mode == "model_bf16":
        model = model.to(torch.bfloat16)
        loss = model(ids, attention_mask=mask, labels=ids).loss
    else:
        dtype = torch.float16 if mode == "autocast_fp16" else torch.bfloat16
        with torch.autocast("cpu", dtype=dtype):
            loss = model(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert abs(loss.item() - reference) < 0.05
    for name, parameter in model.named_parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all(), name
