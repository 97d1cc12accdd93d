"""Transformer-XL's relative attention through FlexAttention (`attn_implementation="flex_attention"`,
`txv_relative_attention.flex_relative_attention`): the position term read at the relative shift's index inside the
kernel gives the scores of the shifted, masked matrix, forward and backward, alone and in the XL-family models with
their memory.

Tolerance 1e-5 (relative and absolute) in float32: FlexAttention's reference adds the position term to each score
and normalises with its own log-sum-exp, SDPA's fused CPU kernel or the eager reference add a shifted bias matrix and
softmax; the same sums in another order differ by a few float32 ulps (measured: at most 3e-7 on these tiny models).

torch 2.13 runs FlexAttention's backward on CPU only past a device check (`_validate_device`) in front of its
device-independent reference backward: the gradient tests step past that check, so they test the score_mod's
gradients (the position term, the span bias, q, k, v) with torch's reference; the fused kernels' backward runs on a
GPU (`tests/test_cuda.py`)."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from hf_txvariants.txv_attention import causal_allowed
from hf_txvariants.txv_relative_attention import flex_relative_attention, relative_shift
from tiny_configs import model_class, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOLERANCE = dict(rtol=1e-5, atol=1e-5)
MODELS = {
    "transfo-xl": ("transfo-xl", {}),
    # same_length: a window of mem_len keys (a block mask that is not causal only); clamp_len: a clamped table
    "transfo-xl-same-length-clamp-len": ("transfo-xl", dict(same_length=True, clamp_len=3)),
    "txv_gtrxl": ("txv_gtrxl", {}),
    "txv_adaptive_span": ("txv_adaptive_span", {}),  # the span's log mask: an additive term of the score_mod
}


@pytest.fixture
def cpu_flex_backward(monkeypatch):
    """Lets torch run FlexAttention's reference backward on CPU (see the module's docstring)."""
    import torch.nn.attention.flex_attention as flex

    monkeypatch.setattr(flex, "_validate_device", lambda *tensors: None)


def reference_attention(content_query, key, value, position_scores, allowed, scaling, attention_bias=None):
    """The eager definition: scores = scaling q k^T + relative_shift(position term) (+ bias), masked, softmax."""
    key_length = key.shape[2]
    scores = scaling * content_query @ key.transpose(-1, -2) + relative_shift(position_scores, key_length)
    if attention_bias is not None:
        scores = scores + attention_bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)


def attention_inputs(batch=2, heads=2, query_length=6, memory_length=5, head_dim=8, batched_mask=False, span=False):
    generator = torch.Generator().manual_seed(0)
    key_length = memory_length + query_length

    def random(*shape):
        return torch.randn(*shape, generator=generator).requires_grad_()

    allowed = causal_allowed(query_length, memory_length, "cpu")[None, None]
    if batched_mask:  # row 1 does not see its first three memory slots (padding)
        allowed = allowed.expand(batch, 1, -1, -1).clone()
        allowed[1, :, :, :3] = False
    inputs = dict(
        content_query=random(batch, heads, query_length, head_dim),
        key=random(batch, heads, key_length, head_dim),
        value=random(batch, heads, key_length, head_dim),
        position_scores=random(batch, heads, query_length, key_length + 1),
        allowed=allowed,
        scaling=head_dim**-0.5,
    )
    if span:
        inputs["attention_bias"] = random(1, heads, query_length, key_length)
    return inputs


@pytest.mark.parametrize("batched_mask", [False, True], ids=["causal", "padded-rows"])
@pytest.mark.parametrize("span", [False, True], ids=["", "span-bias"])
def test_flex_relative_attention_equals_the_shifted_scores_forward_and_backward(cpu_flex_backward, batched_mask, span):
    inputs = attention_inputs(batched_mask=batched_mask, span=span)
    leaves = [value for value in inputs.values() if isinstance(value, torch.Tensor) and value.requires_grad]
    expected = reference_attention(**inputs)
    actual = flex_relative_attention(**inputs)
    torch.testing.assert_close(actual, expected, **TOLERANCE)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected_grads = torch.autograd.grad((expected * weights).sum(), leaves)
    actual_grads = torch.autograd.grad((actual * weights).sum(), leaves)
    for expected_grad, actual_grad in zip(expected_grads, actual_grads):
        torch.testing.assert_close(actual_grad, expected_grad, **TOLERANCE)


def test_small_heads_are_padded_exactly():
    inputs = attention_inputs(head_dim=4)  # below FlexAttention's 16
    with torch.no_grad():
        torch.testing.assert_close(flex_relative_attention(**inputs), reference_attention(**inputs), **TOLERANCE)


def _models(name: str, **config_overrides):
    model_type, overrides = MODELS[name]
    config = tiny_config(model_type, **overrides, **config_overrides)
    torch.manual_seed(0)
    default = model_class(model_type, "AutoModelForCausalLM")(config)
    flex = copy.deepcopy(default)
    flex.set_attn_implementation("flex_attention")
    return config, default, flex


def _segments(vocab_size: int, count=3):
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(1, vocab_size, (2, 8), generator=generator) for _ in range(count)]


@pytest.mark.parametrize("name", MODELS)
def test_flex_attention_model_equals_the_default_with_memory(name):
    """Three segments in evaluation, the memory carried: the same logits and memory as the default (SDPA)."""
    config, default, flex = _models(name)
    default.eval(), flex.eval()
    caches = [None, None]
    with torch.no_grad():
        for input_ids in _segments(config.vocab_size):
            outputs = [model(input_ids=input_ids, cache=cache) for model, cache in zip((default, flex), caches)]
            torch.testing.assert_close(outputs[1].logits, outputs[0].logits, **TOLERANCE)
            caches = [output.cache for output in outputs]
            for expected, actual in zip(caches[0].memories, caches[1].memories):
                torch.testing.assert_close(actual, expected, **TOLERANCE)


@pytest.mark.parametrize("name", MODELS)
def test_flex_attention_model_trains_as_the_default(cpu_flex_backward, name):
    """Two training segments (dropout 0), the memory carried: the same losses and every parameter's gradient."""
    config, default, flex = _models(name, dropout=0.0)
    default.train(), flex.train()
    caches = [None, None]
    for input_ids in _segments(config.vocab_size, count=2):
        outputs = [model(input_ids=input_ids, labels=input_ids, cache=c) for model, c in zip((default, flex), caches)]
        torch.testing.assert_close(outputs[1].loss, outputs[0].loss, **TOLERANCE)
        for output in outputs:
            output.loss.backward()
        for (parameter_name, expected), actual in zip(default.named_parameters(), flex.parameters()):
            if expected.grad is not None:
                torch.testing.assert_close(actual.grad, expected.grad, **TOLERANCE, msg=parameter_name)
        caches = [output.cache for output in outputs]
        default.zero_grad(), flex.zero_grad()


def test_flex_attention_says_what_trains_on_cpu_and_refuses_attention_dropout():
    config, _, flex = _models("transfo-xl", dropout=0.0)
    input_ids = _segments(config.vocab_size, count=1)[0]
    cpu_training = "no backward on CPU in torch 2.13: train on CPU with attn_implementation='sdpa'"
    with pytest.raises(ValueError, match=cpu_training):
        flex.train()(input_ids=input_ids, labels=input_ids)
    config, _, flex = _models("transfo-xl", dropout=0.0, dropatt=0.1)
    with pytest.raises(ValueError, match="no attention dropout \\(attention_dropout 0.1 in training\\)"):
        flex.train()(input_ids=input_ids, labels=input_ids)
    with torch.no_grad():  # evaluation has no dropout
        flex.eval()(input_ids=input_ids)


@pytest.mark.slow  # compiles for seconds
def test_a_compiled_flex_attention_model_equals_the_default_and_keeps_its_memory():
    """In a compiled model FlexAttention runs outside the model's graph (one graph break per layer: see
    `_flex_relative_attention_outside_the_graph`); the logits and the memory carried over three segments are the
    default model's."""
    from torch._dynamo.utils import counters

    config, default, flex = _models("transfo-xl")
    default.eval(), flex.eval()
    compiled = torch.compile(flex, backend="aot_eager")
    counters.clear()
    caches = [None, None]
    with torch.no_grad():
        for input_ids in _segments(config.vocab_size):
            outputs = [model(input_ids=input_ids, cache=c) for model, c in zip((default, compiled), caches)]
            torch.testing.assert_close(outputs[1].logits, outputs[0].logits, **TOLERANCE)
            caches = [output.cache for output in outputs]
            for expected, actual in zip(caches[0].memories, caches[1].memories):
                torch.testing.assert_close(actual, expected, **TOLERANCE)
    assert any("flex_relative_attention" in reason for reason in counters["graph_break"])


def test_torch_still_drops_mutations_after_a_compiled_flex_attention():
    """Why FlexAttention runs outside a compiled model's graph: TorchDynamo (torch 2.13) drops the assignments made
    after a flex_attention call to an object assigned before it. When this test fails, torch has fixed it and
    `_flex_relative_attention_outside_the_graph` can go."""
    from torch.nn.attention.flex_attention import flex_attention

    class Box:
        before = after = 0

    def assign_around_flex_attention(query, box):
        box.before = 1
        output = flex_attention(query, query, query)
        box.after = 1
        return output

    box = Box()
    with torch.no_grad():
        torch.compile(assign_around_flex_attention, fullgraph=True, backend="eager")(torch.randn(1, 1, 8, 16), box)
    assert (box.before, box.after) == (1, 0)
