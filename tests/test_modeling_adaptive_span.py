"""Adaptive attention span: the shared tester (static and dynamic spans), parity of the soft mask, the span loss and
the kept size with the original facebookresearch/adaptive-span code (fixtures), the masked-and-renormalised weights
against a naive computation, trimming that changes nothing but the work done, the span penalty in the loss, spans
kept inside [0, S], memory and generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from hf_txvariants import AdaptiveSpanConfig, AdaptiveSpanForCausalLM, AdaptiveSpanModel
from hf_txvariants.txv_adaptive_span import AdaptiveSpan, soft_span_mask, span_attention_bias
from hf_txvariants.txv_compat import output_cache
from tiny_configs import span_off, tiny_config
from txv_tester import ATOL, TxvModelTesterMixin

FIXTURES = Path(__file__).parent / "fixtures" / "adaptive_span_original"
TINY_OVERRIDES = dict(initializer_range=0.2)  # this file's tiny model: tiny_config("txv_adaptive_span") with these


class TestAdaptiveSpan(TxvModelTesterMixin):
    model_type = "txv_adaptive_span"
    model_classes = (AdaptiveSpanModel, AdaptiveSpanForCausalLM)
    causal_lm_class = AdaptiveSpanForCausalLM
    config_overrides = TINY_OVERRIDES
    has_memory = True
    memory_test_config_kwargs = dict(attn_span=20, adapt_span_init=0.4)


class TestAdaptiveSpanDynamic(TestAdaptiveSpan):
    config_overrides = {**TINY_OVERRIDES, "adapt_span_dynamic": True}


class TestAdaptiveSpanAdaptiveSoftmax(TestAdaptiveSpan):
    """The shared tester with Transformer-XL's adaptive embedding and softmax on (a large-vocabulary option)."""

    config_overrides = {**TINY_OVERRIDES, "vocab_size": 40, "adaptive": True, "cutoffs": [8, 20], "div_val": 2}


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return AdaptiveSpanForCausalLM(tiny_config("txv_adaptive_span", **{**TINY_OVERRIDES, **overrides})).eval()


def ids(batch, length, seed=0):
    return torch.randint(1, 31, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- original parity
@pytest.mark.parametrize("case", range(3))
def test_soft_mask_span_loss_and_kept_size_match_the_original(case):
    meta = json.loads((FIXTURES / "meta.json").read_text())[case]
    reference = load_file(FIXTURES / "reference.safetensors")
    scores = reference[f"case{case}.scores"]
    span_len, heads, ramp = meta["attn_span"], meta["heads"], meta["ramp"]
    spans = span_len * reference[f"case{case}.current_val"]
    # the original's column j is the key at distance x = L - 1 - j
    distances = torch.arange(span_len - 1, -1, -1.0)
    bias = span_attention_bias(distances[None, None, :], spans[:, None, None], ramp, torch.float32)
    scores = scores.view(-1, heads, *scores.shape[1:])
    ours = torch.softmax(scores + bias, dim=-1).view(-1, *scores.shape[2:])
    torch.testing.assert_close(ours, reference[f"case{case}.weights"], atol=1e-6, rtol=1e-5)
    module = AdaptiveSpan(heads, span_len, ramp)
    with torch.no_grad():
        module.current_val.copy_(reference[f"case{case}.current_val"])
    assert meta["adapt_span_loss"] * float(module.penalty(module.spans()).detach()) == pytest.approx(
        meta["loss"], rel=1e-6
    )
    assert module.required_keys(module.spans()) == meta["current_max_size"]


def test_soft_mask_formula():
    # m_z(x) = clamp((R + z - x) / R, 0, 1) with R = 4, z = 2
    x = torch.arange(8.0)
    expected = torch.tensor([1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    torch.testing.assert_close(soft_span_mask(x, torch.tensor(2.0), 4), expected)


# ---------------------------------------------------------------------------------------------- the model
def naive_first_layer_weights(model, input_ids):
    """softmax without the span, times m_z(x), renormalised: the paper's definition, on the first layer."""
    config = model.config
    plain_config = tiny_config(
        "txv_adaptive_span", **TINY_OVERRIDES, **span_off("txv_adaptive_span"), adapt_span_enabled=False
    )
    plain = AdaptiveSpanForCausalLM(plain_config).eval()
    plain.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        weights = plain(input_ids, output_attentions=True).attentions[0]  # [B, H, Q, K]
    length = input_ids.shape[1]
    distances = (torch.arange(length)[:, None] - torch.arange(length)[None, :]).clamp(min=0).float()
    spans = model.get_spans()[0]
    mask = soft_span_mask(distances[None, None], spans[None, :, None, None], config.adapt_span_ramp)
    masked = weights * mask
    return masked / masked.sum(-1, keepdim=True)


@pytest.mark.parametrize("cache", [False, True])
def test_weights_are_the_masked_and_renormalised_softmax(cache):
    model = build(adapt_span_cache=cache)
    with torch.no_grad():
        model.transformer.layers[0].attn.adaptive_span.current_val.copy_(torch.tensor([0.1, 0.3]))
        tokens = ids(2, 10)
        weights = model(tokens, output_attentions=True).attentions[0]
    expected = naive_first_layer_weights(model, tokens)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)


def test_trimming_changes_only_the_work_done():
    """With short learned spans, trimming keeps a shorter memory and fewer keys and gives the same outputs."""
    trimmed, untrimmed = build(attn_span=24, adapt_span_cache=True), build(attn_span=24, adapt_span_cache=False)
    for model in (trimmed, untrimmed):
        with torch.no_grad():
            for layer, values in zip(model.transformer.layers, ([0.1, 0.05], [0.2, 0.0])):
                layer.attn.adaptive_span.current_val.copy_(torch.tensor(values))
    cache_t = cache_u = None
    for segment in range(5):
        tokens = ids(2, 6, seed=segment)
        with torch.no_grad():
            out_t = trimmed(tokens, cache=cache_t)
            out_u = untrimmed(tokens, cache=cache_u)
        cache_t, cache_u = output_cache(out_t), output_cache(out_u)
        torch.testing.assert_close(out_t.logits, out_u.logits, atol=ATOL, rtol=0)
    # spans 0.2 * 24 = 4.8 -> keys at distances < ceil(4.8) + 3 = 8 -> 7 memory slots are enough
    assert cache_t.memory_length == 7 and cache_u.memory_length == 23
    keys_t = trimmed.transformer(ids(2, 6), cache=cache_t).attended_keys
    assert keys_t == (6 + 5, 6 + 7)  # layer 0: ceil(2.4) + 3 - 1 = 5 memory slots; layer 1: 7


def test_span_penalty_is_added_to_the_loss_and_reaches_the_spans():
    model = build(adapt_span_loss=0.5).train()
    tokens = ids(2, 8)
    output = model(tokens, labels=tokens)
    spans = model.get_spans()
    torch.testing.assert_close(output.span_penalty, spans.mean(-1).sum())
    torch.testing.assert_close(output.loss, output.lm_loss + 0.5 * output.span_penalty)
    output.loss.backward()
    for layer in model.transformer.layers:
        assert layer.attn.adaptive_span.current_val.grad.abs().sum() > 0


def test_spans_stay_inside_zero_and_max_span():
    model = build()
    span = model.transformer.layers[0].attn.adaptive_span
    with torch.no_grad():
        span.current_val.copy_(torch.tensor([-0.5, 1.7]))
    torch.testing.assert_close(model.get_spans()[0], torch.tensor([0.0, 12.0]))
    model.clamp_spans_()
    torch.testing.assert_close(span.current_val.detach(), torch.tensor([0.0, 1.0]))
    dynamic = build(adapt_span_dynamic=True)
    hidden = torch.randn(2, 5, 16) * 100
    spans = dynamic.transformer.layers[0].attn.adaptive_span.spans(hidden)
    assert spans.shape == (2, 5, 2) and spans.min() >= 0 and spans.max() <= 12


def test_dynamic_span_formula():
    """z_t = S * sigmoid(v . x_t + b) per head."""
    model = build(adapt_span_dynamic=True)
    module = model.transformer.layers[0].attn.adaptive_span
    hidden = torch.randn(1, 4, 16)
    expected = 12 * torch.sigmoid(hidden @ module.span_predictor.weight.T + module.span_predictor.bias)
    torch.testing.assert_close(module.spans(hidden), expected)


def test_training_shortens_spans_under_a_strong_penalty():
    model = build(adapt_span_loss=0.05, adapt_span_init=0.5).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    start = model.get_spans().mean()
    tokens = ids(4, 12)
    for _ in range(10):
        loss = model(tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        model.clamp_spans_()
    assert model.get_spans().mean() < start


@pytest.mark.exact
def test_left_padded_generation_equals_rows_alone():
    model = build()
    rows = [torch.tensor([[5, 6, 7, 8]]), torch.tensor([[9, 10]])]
    kwargs = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    alone = [model.generate(r, **kwargs)[0, -3:] for r in rows]
    batch = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    together = model.generate(batch, attention_mask=mask, **kwargs)
    assert torch.equal(together[0, -3:], alone[0]) and torch.equal(together[1, -3:], alone[1])


def test_auto_class_and_original_names():
    config = AdaptiveSpanConfig(hid_sz=8, nheads=2, inner_hid_sz=16, nlayers=1, vocab_size=11, attn_span=10)
    assert (config.hidden_size, config.num_hidden_layers, config.mem_len) == (8, 1, 9)
    assert isinstance(AutoModelForCausalLM.from_config(config), AdaptiveSpanForCausalLM)


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("attn_span", {"attn_span": 0}),
        ("adapt_span_ramp", {"adapt_span_ramp": 0}),
        ("adapt_span_init", {"adapt_span_init": 1.5}),
        ("memory_init", {"memory_init": "random"}),
        ("num_attention_heads", {"d_model": 16, "n_head": 3}),
    ],
)
def test_bad_config_names_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_adaptive_span", **kwargs)


def test_bad_input_names_the_tensor():
    model = build()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="the cache must be the MemoryCache"):
        model(torch.tensor([[1, 2]]), cache=object())
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(2, 2))


@pytest.mark.slow  # tokenises the embedded corpus
def test_plot_example_trains_and_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from plot_adaptive_span import plot_spans, train_adaptive_span

    model, _, log = train_adaptive_span(steps=2, attn_span=16, seg_len=8, batch_size=2, log_every=1)
    assert len(log) == 2 and model.get_spans().shape == (3, 4)
    plot_spans(model.get_spans(), 16, tmp_path / "spans.png")
    assert (tmp_path / "spans.png").read_bytes()[:4] == b"\x89PNG"
