"""The one XL backbone (txv_xl) and the mechanisms that compose on it: every XL-family config takes gating and
adaptive span; a composed model passes the shared tester (train, memory, save/load, remote code) and equals the
single-mechanism model when the other mechanism is neutral. Also the XL family's shared contract: the memory as a
transformers Cache (layers, continuing generate, assisted decoding refused), loss kwargs, caches of another model,
left padding under memory_init="zeros", torch.export / torch.compile."""

from __future__ import annotations

import re

import pytest
import torch

from hf_txvariants import (
    AdaptiveSpanForCausalLM,
    AdaptiveSpanModel,
    GTrXLForCausalLM,
    GTrXLModel,
    MemoryCache,
    TransfoXLLMHeadModel,
    TransfoXLModel,
    txv_relative_attention,
)
from hf_txvariants.txv_adaptive_span import AdaptiveSpan
from hf_txvariants.txv_compat import cache_field, output_cache
from hf_txvariants.txv_gates import GRUGate
from tiny_configs import DEFAULT, TINY_CONFIGS, general_path_only, tiny_config
from txv_tester import ATOL, TxvModelTesterMixin

# this file's XL-family models: each variant's tiny config with these overrides. Transformer-XL without a window (each
# query sees its whole memory) and without clamping (every distance its own position embedding, so that a wrong
# distance in the memory's positions shows); weights drawn at 0.2 instead of the default 0.02 as these tests were
# written with
TRANSFO_XL = dict(same_length=False, clamp_len=DEFAULT, init_std=0.2)
ADAPTIVE_SPAN = dict(initializer_range=0.2)
# adaptive span composed on a model without it: a largest span S = 20, longer than every window here (mem_len + 1 <= 9;
# test_gtrxl_with_a_full_span_equals_gtrxl needs S >= mem_len + 1)
SPAN = dict(adapt_span_enabled=True, attn_span=20, adapt_span_ramp=3, adapt_span_init=0.4)
# token ids valid in every model of this file (below the smallest tiny vocabulary)
VOCAB_SIZE = min(
    TINY_CONFIGS[model_type]["vocab_size"] for model_type in ("transfo-xl", "txv_gtrxl", "txv_adaptive_span")
)


# ------------------------------------------------------------------------------------------ composed models, tested
class TestGTrXLWithAdaptiveSpan(TxvModelTesterMixin):
    model_type = "txv_gtrxl"
    config_overrides = SPAN
    model_classes = (GTrXLModel, GTrXLForCausalLM)
    causal_lm_class = GTrXLForCausalLM
    has_memory = True
    memory_test_config_kwargs = {"mem_len": 7}  # a memory as long as the tester's segment (seq_length)


class TestTransfoXLGatedWithAdaptiveSpan(TxvModelTesterMixin):
    model_type = "transfo-xl"
    config_overrides = {**TRANSFO_XL, "gate_type": "gru", **SPAN}
    model_classes = (TransfoXLModel, TransfoXLLMHeadModel)
    causal_lm_class = TransfoXLLMHeadModel
    has_memory = True
    memory_test_config_kwargs = {"memory_init": "empty", "mem_len": 7}


class TestAdaptiveSpanGated(TxvModelTesterMixin):
    model_type = "txv_adaptive_span"
    config_overrides = {**ADAPTIVE_SPAN, "gate_type": "gru", "adapt_span_dynamic": True}
    model_classes = (AdaptiveSpanModel, AdaptiveSpanForCausalLM)
    causal_lm_class = AdaptiveSpanForCausalLM
    has_memory = True
    memory_test_config_kwargs = dict(attn_span=20, adapt_span_init=0.4)


def test_composed_models_have_both_mechanisms():
    for model in (
        GTrXLModel(tiny_config("txv_gtrxl", **SPAN)),
        TransfoXLModel(tiny_config("transfo-xl", **TRANSFO_XL, gate_type="gru", **SPAN)),
        AdaptiveSpanModel(tiny_config("txv_adaptive_span", **ADAPTIVE_SPAN, gate_type="gru")),
    ):
        modules, layers = list(model.modules()), model.config.num_hidden_layers
        assert sum(isinstance(m, GRUGate) for m in modules) == 2 * layers, type(model)
        assert sum(isinstance(m, AdaptiveSpan) for m in modules) == layers, type(model)


# ------------------------------------------------------------------------------------------ neutral mechanism
def _copy_weights(source, target, renames=()):
    """Loads `source`'s tensors into `target` under the target's names; returns the target's keys left untouched."""
    state = {}
    for name, tensor in source.state_dict().items():
        for pattern, replacement in renames:
            name = re.sub(pattern, replacement, name)
        state[name] = tensor
    result = target.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    return result.missing_keys


def _ids(batch=2, length=9, seed=0):
    return torch.randint(0, VOCAB_SIZE, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("gate_type", ["gru", "trxl_i", "trxl"])
def test_gtrxl_with_a_full_span_equals_gtrxl(gate_type):
    """A span that covers every key the window allows (z = S >= mem_len + 1) gives the soft mask m = 1 everywhere:
    the composed model is the gated model, over two segments with memory."""
    torch.manual_seed(0)
    gated = GTrXLForCausalLM(tiny_config("txv_gtrxl", gate_type=gate_type, initializer_range=0.3)).eval()
    composed = GTrXLForCausalLM(
        tiny_config("txv_gtrxl", gate_type=gate_type, initializer_range=0.3, **{**SPAN, "adapt_span_init": 1.0})
    ).eval()
    missing = _copy_weights(gated, composed)
    assert missing and all(".adaptive_span." in name for name in missing)
    ids = _ids()
    with torch.no_grad():
        first, first_composed = gated(ids[:, :5]), composed(ids[:, :5])
        second = gated(ids[:, 5:], cache=output_cache(first)).logits
        second_composed = composed(ids[:, 5:], cache=output_cache(first_composed)).logits
    torch.testing.assert_close(first_composed.logits, first.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(second_composed, second, atol=1e-6, rtol=0)
    assert first_composed.span_penalty is not None and first.span_penalty is None


def test_adaptive_span_with_a_gate_equals_gtrxl_with_adaptive_span():
    """The same mechanisms in two variants' files (their own parameter names): txv_adaptive_span with gate_type="gru"
    and txv_gtrxl with adaptive span compute the same function with the same weights (same window: the span S)."""
    torch.manual_seed(0)
    span_config = tiny_config(
        "txv_adaptive_span", **{**ADAPTIVE_SPAN, "adapt_span_init": 0.3}, gate_type="gru", gate_bias=0.5
    )
    same = ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "mem_len")
    same += ("final_layer_norm", "gate_type", "gate_bias", "attn_span", "adapt_span_ramp", "adapt_span_init")
    gtrxl_config = tiny_config(
        "txv_gtrxl", same_length=False, adapt_span_enabled=True, **{name: getattr(span_config, name) for name in same}
    )
    adaptive_span = AdaptiveSpanForCausalLM(span_config).eval()
    gtrxl = GTrXLForCausalLM(gtrxl_config).eval()
    renames = (
        (r"^transformer\.", "model."),
        (r"\.attn\.layer_norm\.", ".attention_norm."),
        (r"\.attn\.", ".attention."),
        (r"\.pos_ff\.layer_norm\.", ".feed_forward_norm."),
        (r"\.pos_ff\.", ".feed_forward."),
    )
    assert _copy_weights(adaptive_span, gtrxl, renames) == []
    ids = _ids(length=16)
    with torch.no_grad():
        expected = adaptive_span(ids[:, :8])
        out = gtrxl(ids[:, :8])
        torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.span_penalty, expected.span_penalty)
        following = gtrxl(ids[:, 8:], cache=output_cache(out)).logits
        expected_following = adaptive_span(ids[:, 8:], cache=output_cache(expected)).logits
    torch.testing.assert_close(following, expected_following, atol=1e-5, rtol=0)


def test_span_penalty_is_in_every_composed_loss():
    for model in (
        GTrXLForCausalLM(tiny_config("txv_gtrxl", **SPAN, adapt_span_loss=0.5)),
        TransfoXLLMHeadModel(tiny_config("transfo-xl", **TRANSFO_XL, **SPAN, adapt_span_loss=0.5)),
    ):
        model.eval()
        ids = _ids()
        output = model(ids, labels=ids)
        span_penalty = model.base_model(ids).span_penalty
        lm_loss = output.lm_loss if hasattr(output, "lm_loss") else output.losses.sum() / output.losses.numel()
        torch.testing.assert_close(output.loss, lm_loss + 0.5 * span_penalty)
        output.loss.backward()
        assert all(m.current_val.grad is not None for m in model.modules() if isinstance(m, AdaptiveSpan))


# ------------------------------------------------------------------------------------------ config checks
@pytest.mark.parametrize(
    "model_type, base", [("transfo-xl", TRANSFO_XL), ("txv_gtrxl", {}), ("txv_adaptive_span", ADAPTIVE_SPAN)]
)
@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"gate_type": "lstm"}, "gate_type"),
        ({"gate_bias": float("nan")}, "gate_bias"),
        ({"attn_span": 0}, "attn_span"),
        ({"adapt_span_enabled": True, "attn_span": None}, "attn_span"),
        ({"adapt_span_ramp": 0}, "adapt_span_ramp"),
        ({"adapt_span_init": 1.5}, "adapt_span_init"),
        ({"adapt_span_loss": -1.0}, "adapt_span_loss"),
        ({"adapt_span_dynamic": True, "adapt_span_enabled": False}, "adapt_span_dynamic"),
    ],
)
def test_every_xl_config_checks_the_mechanism_fields(model_type, base, overrides, field):
    if model_type == "txv_adaptive_span" and field == "attn_span" and overrides.get("attn_span") is None:
        overrides = {**overrides, "mem_len": 4}
    with pytest.raises(ValueError, match=field):
        tiny_config(model_type, **{**base, **overrides})


def test_transfo_xl_pre_lnorm_with_a_gate_is_refused():
    with pytest.raises(ValueError, match="pre_lnorm"):
        tiny_config("transfo-xl", **TRANSFO_XL, pre_lnorm=True, gate_type="gru")


# ------------------------------------------------------------------------------------------ the memory as a Cache
def _causal_lms():
    torch.manual_seed(0)
    return {
        "transfo-xl": TransfoXLLMHeadModel(tiny_config("transfo-xl", **TRANSFO_XL)).eval(),
        "gtrxl": GTrXLForCausalLM(tiny_config("txv_gtrxl")).eval(),
        "adaptive_span": AdaptiveSpanForCausalLM(tiny_config("txv_adaptive_span", **ADAPTIVE_SPAN)).eval(),
    }


@pytest.mark.exact
@pytest.mark.parametrize("name", ["transfo-xl", "gtrxl", "adaptive_span"])
def test_generate_continues_from_past_key_values(name):
    """As transformers' test_generate_continue_from_past_key_values: the memory returned by generate() continues
    the generation exactly; the cache has one layer object per layer (`len(cache) == len(cache.layers)`)."""
    model = _causal_lms()[name]
    prompt = _ids(2, 4)
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    first = model.generate(prompt, max_new_tokens=3, return_dict_in_generate=True, **kwargs)
    cache = output_cache(first)
    assert isinstance(cache, MemoryCache) and len(cache) == len(cache.layers) == model.config.num_hidden_layers
    assert torch.equal(cache.layers[1].keys, cache.memories[1])
    continued = model.generate(first.sequences, **cache_field(cache), max_new_tokens=3, **kwargs)
    assert torch.equal(continued, model.generate(prompt, max_new_tokens=6, **kwargs))


@pytest.mark.parametrize("name", ["transfo-xl", "gtrxl", "adaptive_span"])
def test_assisted_decoding_is_refused_by_transformers(name):
    model = _causal_lms()[name]
    with pytest.raises(ValueError, match="stateful"):
        model.generate(_ids(1, 4), assistant_model=model, max_new_tokens=2, pad_token_id=0)


def test_memory_of_another_variant_or_layout_is_a_clear_error():
    models = _causal_lms()
    ids = _ids(2, 4)
    gtrxl_memory = output_cache(models["gtrxl"](ids))
    with pytest.raises(ValueError, match="txv_gtrxl"):
        models["transfo-xl"](ids, cache=gtrxl_memory)
    with pytest.raises(ValueError, match="transfo-xl"):
        models["gtrxl"](ids, cache=output_cache(models["transfo-xl"](ids)))
    deeper = GTrXLForCausalLM(tiny_config("txv_gtrxl", num_hidden_layers=3)).eval()
    with pytest.raises(ValueError, match="layers"):
        deeper(ids, cache=gtrxl_memory)
    wider = GTrXLForCausalLM(tiny_config("txv_gtrxl", hidden_size=32)).eval()
    with pytest.raises(ValueError, match="hidden size"):
        wider(ids, cache=gtrxl_memory)


# ------------------------------------------------------------------------------------------ losses
@pytest.mark.parametrize("name", ["transfo-xl", "gtrxl", "adaptive_span"])
def test_shift_labels_give_the_loss_of_labels(name):
    model = _causal_lms()[name]
    ids = _ids(2, 6)
    labels = ids.clone()
    labels[0, 2] = -100
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        expected = model(ids, labels=labels).loss
        given = model(ids, shift_labels=shifted).loss
        other = model(ids, labels=labels, shift_labels=torch.roll(shifted, 1, dims=1)).loss
    torch.testing.assert_close(given, expected)
    assert not torch.allclose(other, expected)  # shift_labels wins over labels


@pytest.mark.parametrize("name", ["transfo-xl", "gtrxl", "adaptive_span"])
def test_every_label_ignored_gives_zero_loss(name):
    model = _causal_lms()[name]
    ids = _ids(2, 5)
    output = model(ids, labels=torch.full_like(ids, -100))
    lm_loss = getattr(output, "lm_loss", output.loss)  # adaptive span adds its (finite) span penalty to the loss
    assert lm_loss.item() == 0.0 and torch.isfinite(output.loss)


# ------------------------------------------------------------------------------------------ left padding, zeros
@pytest.mark.exact
@pytest.mark.parametrize(
    "model_type, model_class, base",
    [
        ("transfo-xl", TransfoXLLMHeadModel, {**TRANSFO_XL, "same_length": True}),
        ("transfo-xl", TransfoXLLMHeadModel, TRANSFO_XL),
        ("txv_adaptive_span", AdaptiveSpanForCausalLM, {**ADAPTIVE_SPAN, "memory_init": "zeros"}),
    ],
)
def test_left_padding_under_zero_memory_equals_each_row_alone(model_type, model_class, base):
    """With memory_init="zeros" a row alone starts with mem_len zeros before its first token; a left-padded row
    sees exactly that (its leading padding stands for the zeros), so logits and generated tokens equal the row's."""
    torch.manual_seed(0)
    model = model_class(tiny_config(model_type, **base)).eval()
    assert model.config.memory_init == "zeros"
    rows = [_ids(1, n, seed=n) for n in (6, 3, 1)]
    padded = torch.zeros(3, 6, dtype=torch.long)
    mask = torch.zeros(3, 6, dtype=torch.long)
    for i, row in enumerate(rows):
        padded[i, 6 - row.shape[1] :], mask[i, 6 - row.shape[1] :] = row, 1
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        logits = model(padded, attention_mask=mask).logits
    batched = model.generate(padded, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        with torch.no_grad():
            alone = model(row).logits
        torch.testing.assert_close(logits[i, 6 - row.shape[1] :], alone[0], atol=ATOL, rtol=0)
        assert torch.equal(batched[i, 6:], model.generate(row, **kwargs)[0, row.shape[1] :]), i


# ------------------------------------------------------------------------------------------ memory keys and values
KEY_VALUE_MODELS = {
    "transfo-xl": lambda: TransfoXLLMHeadModel(tiny_config("transfo-xl", **TRANSFO_XL, dropout=0.0)),
    "transfo-xl same_length": lambda: TransfoXLLMHeadModel(
        tiny_config("transfo-xl", **{**TRANSFO_XL, "same_length": True})
    ),
    "transfo-xl pre_lnorm": lambda: TransfoXLLMHeadModel(
        tiny_config("transfo-xl", **TRANSFO_XL, pre_lnorm=True, dropout=0.0)
    ),
    "gtrxl": lambda: GTrXLForCausalLM(tiny_config("txv_gtrxl", dropout=0.0)),
    "gtrxl with adaptive span": lambda: GTrXLForCausalLM(tiny_config("txv_gtrxl", **SPAN, dropout=0.0)),
    "adaptive_span": lambda: AdaptiveSpanForCausalLM(tiny_config("txv_adaptive_span", **ADAPTIVE_SPAN, dropout=0.0)),
}


def _segment_logits(model, ids, segment, recompute, resets=None):
    """Logits of `ids` fed segment by segment with the memory. recompute: the memory's cached keys and values are
    dropped before every segment (the recomputing path). resets: {segment index: rows reset before it}."""
    cache, logits = None, []
    with torch.no_grad():
        for index, start in enumerate(range(0, ids.shape[1], segment)):
            if cache is not None and recompute:
                cache.forget_key_values()
            if resets and index in resets:
                cache.reset_rows(resets[index])
            output = model(ids[:, start : start + segment], cache=cache)
            cache = output_cache(output)
            logits.append(output.logits)
    return logits, cache


def _record_key_projections(model, monkeypatch):
    """The number of positions each query/key/value projection of the attentions is applied to (the recomputing
    path projects [memory; segment] to keys and values, the reusing path the segment alone)."""
    storages = {
        module.qkv_net.weight.untyped_storage().data_ptr()
        for module in model.modules()
        if isinstance(module, txv_relative_attention.RelativePositionAttention)
    }
    projected, linear = [], torch.nn.functional.linear

    def recording_linear(inputs, weight, *args, **kwargs):
        if weight.untyped_storage().data_ptr() in storages:
            projected.append(inputs.shape[1])
        return linear(inputs, weight, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", recording_linear)
    return projected


@pytest.mark.parametrize("name", sorted(KEY_VALUE_MODELS))
@pytest.mark.parametrize("segment", [3, 5, 9])
def test_evaluation_reuses_the_memory_keys_and_values_exactly(name, segment, monkeypatch):
    """Over several segments (the memory filling up and trimmed to mem_len, a row reset in between), reusing the
    keys and values cached with the memory gives the logits of recomputing them from the memory (to float32 rounding:
    1e-6 absolute and relative, the projections' sums being grouped differently), and the reusing path really
    projects only the segment."""
    torch.manual_seed(0)
    model = general_path_only(KEY_VALUE_MODELS[name]().eval())  # (its last segment, one token, would step)
    ids = _ids(2, 4 * segment + 1)
    resets = {2: torch.tensor([True, False])}
    expected, _ = _segment_logits(model, ids, segment, recompute=True, resets=resets)
    recomputing_projections = _record_key_projections(model, monkeypatch)
    _segment_logits(model, ids, segment, recompute=True, resets=resets)
    reusing_projections = _record_key_projections(model, monkeypatch)
    reused, cache = _segment_logits(model, ids, segment, recompute=False, resets=resets)
    for index, (actual, wanted) in enumerate(zip(reused, expected)):
        torch.testing.assert_close(actual, wanted, atol=1e-6, rtol=1e-6, msg=f"segment {index}")
    # the memory is projected again only where the cache could not serve it (the first segment's zero memory, a
    # reset of zero memory, a layer that trimmed its memory to its span)
    assert sum(reusing_projections) < sum(recomputing_projections), (reusing_projections, recomputing_projections)
    assert cache.reuse.memory_keys is not None
    heads, head_dim = model.config.num_attention_heads, model.config.head_dim
    for memory, key, value in zip(cache.memories, cache.reuse.memory_keys, cache.reuse.memory_values):
        if key is not None:  # (a layer that trimmed its memory to its span keeps no keys)
            assert key.shape == value.shape == (2, heads, memory.shape[1], head_dim)


@pytest.mark.exact
def test_memory_keys_and_values_follow_beam_reordering():
    torch.manual_seed(0)
    model = KEY_VALUE_MODELS["transfo-xl"]().eval()
    ids = _ids(3, 8)
    with torch.no_grad():
        cache = output_cache(model(ids[:, :4]))
        order = torch.tensor([2, 0, 0])
        reordered = cache.clone()
        reordered.reorder_cache(order)
        assert torch.equal(reordered.reuse.memory_keys[0], cache.reuse.memory_keys[0][order])
        recomputed = reordered.clone()
        recomputed.forget_key_values()
        next_ids = ids[order, 4:]
        actual = model(next_ids, cache=reordered).logits
        expected = model(next_ids, cache=recomputed).logits
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


def test_changed_weights_never_use_stale_keys_and_values():
    """An in-place weight change (an optimiser step) between two evaluation segments: the cached keys and values were
    made with the old weights, so they are recomputed."""
    torch.manual_seed(0)
    model = KEY_VALUE_MODELS["transfo-xl"]().eval()
    ids = _ids(2, 10)
    with torch.no_grad():
        cache = output_cache(model(ids[:, :5]))
        assert cache.reuse.memory_keys is not None
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
        recomputed = cache.clone()
        recomputed.forget_key_values()
        actual = model(ids[:, 5:], cache=cache).logits
        expected = model(ids[:, 5:], cache=recomputed).logits
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", ["train", "eval with autograd"])
def test_a_pass_with_gradients_never_uses_cached_keys_and_values(mode):
    """Training (and any pass that records gradients) recomputes the memory's keys and values: the gradient of the
    key/value projection includes the memory positions, as in the recomputing path, and the cache drops them."""
    torch.manual_seed(0)
    model = KEY_VALUE_MODELS["transfo-xl"]()
    ids = _ids(2, 10)
    model.eval()
    with torch.no_grad():
        cache = output_cache(model(ids[:, :5]))
    assert cache.reuse.memory_keys is not None
    recomputed = cache.clone()
    recomputed.forget_key_values()
    model.train(mode == "train")
    gradients = []
    for memory in (cache, recomputed):
        model.zero_grad()
        model(ids[:, 5:], labels=ids[:, 5:], cache=memory).loss.backward()
        gradients.append(model.transformer.layers[0].dec_attn.qkv_net.weight.grad.clone())
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-6, rtol=0)
    assert cache.reuse.memory_keys is None


# ------------------------------------------------------------------------------------------ export and compile
@pytest.mark.parametrize("name", ["transfo-xl", "gtrxl", "adaptive_span"])
@pytest.mark.slow  # torch.export
def test_torch_export_traces_the_xl_variants(name):
    model = _causal_lms()[name]
    ids = _ids(2, 5)
    with torch.no_grad():
        expected = model(ids)
    exported = torch.export.export(model, (ids,))
    output = exported.module()(ids)
    torch.testing.assert_close(output.logits, expected.logits, atol=ATOL, rtol=0)
    assert isinstance(output_cache(output), MemoryCache)
    torch.testing.assert_close(output_cache(output).memories[0], output_cache(expected).memories[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transfo-xl", "gtrxl", "adaptive_span"])
@pytest.mark.parametrize("phase", ["first segment", "evaluation with memory", "training step"])
def test_torch_compile_fullgraph_traces_the_xl_backbone(name, phase):
    """`torch.compile(model, fullgraph=True)` (no graph break) through the backbone, the layers, the relative shift, the
    mechanisms and the memory: a first segment, a segment with the memory in evaluation, and a training step with the
    memory (loss and the gradients of every parameter equal eager's)."""
    model = _causal_lms()[name]
    ids = _ids(2, 10)
    with torch.no_grad():
        memory = output_cache(model(ids[:, :5]))
    inputs = {"input_ids": ids[:, 5:]}
    if phase != "first segment":
        inputs["cache"] = memory
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    if phase != "training step":
        with torch.no_grad():
            expected = model(**{**inputs, **_fresh_memory(inputs)}).logits
            actual = compiled(**{**inputs, **_fresh_memory(inputs)}).logits
        torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
        return
    model.train()
    model.config.dropout = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    gradients = []
    for run in (model, compiled):
        model.zero_grad()
        loss = run(**{**inputs, **_fresh_memory(inputs)}, labels=ids[:, 5:]).loss
        loss.backward()
        grads = {parameter_name: p.grad.clone() for parameter_name, p in model.named_parameters() if p.grad is not None}
        gradients.append((loss.detach(), grads))
    (expected_loss, expected_grads), (loss, grads) = gradients
    torch.testing.assert_close(loss, expected_loss, atol=ATOL, rtol=0)
    assert grads.keys() == expected_grads.keys() and grads
    for parameter_name, gradient in grads.items():
        torch.testing.assert_close(gradient, expected_grads[parameter_name], atol=ATOL, rtol=1e-4, msg=parameter_name)


def _fresh_memory(inputs):
    """A copy of the memory in `inputs` (a forward updates the memory it is given in place)."""
    return {"cache": inputs["cache"].clone()} if "cache" in inputs else {}
