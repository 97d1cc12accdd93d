"""txv_relative_attention: the relative shift against its definition, and the Transformer-XL attention and model
under torch.compile (fullgraph) against eager."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from hf_txvariants.txv_attention import causal_allowed, eager_attention_forward
from hf_txvariants.txv_compat import output_cache
from hf_txvariants.txv_relative_attention import (
    KEY_ALIGNMENT,
    RelativePositionAttention,
    biased_attention_with_bias_gradient,
    query_blocks,
    relative_position_embeddings,
    relative_shift,
)
from tiny_configs import tiny_config

XL_OVERRIDES = dict(same_length=True, dropout=0.0, dropatt=0.0)  # tiny_config("transfo-xl") with these
# the files that make up the relative-attention layer stack and the adaptive head (this scope)
LAYER_STACK_FILES = {"txv_relative_attention.py", "txv_adaptive_softmax.py", "txv_attention.py", "txv_positions.py"}


@pytest.mark.exact
@pytest.mark.parametrize("with_distance_minus_one", [True, False])
def test_relative_shift_puts_distance_m_plus_i_minus_j_at_key_j(with_distance_minus_one):
    """shifted[i, j] = scores[i, m] with m the row of distance M + i - j (rows: K - 1, ..., 0[, -1]), for every
    key j that query i may see (j <= M + i)."""
    memory, query = 3, 4
    key = memory + query
    rows = key + 1 if with_distance_minus_one else key
    scores = torch.randn(2, 3, query, rows)
    shifted = relative_shift(scores, key)
    for i in range(query):
        for j in range(memory + i + 1):
            distance = memory + i - j
            # exact: the shift only moves elements
            torch.testing.assert_close(shifted[..., i, j], scores[..., i, key - 1 - distance], atol=0, rtol=0)


def test_relative_shift_rejects_a_wrong_table():
    with pytest.raises(ValueError, match="distances"):
        relative_shift(torch.randn(1, 1, 2, 9), 5)


def attention_inputs(config, memory_length=3, query_length=4):
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, query_length, config.hidden_size, generator=generator, requires_grad=True)
    memory = torch.randn(2, memory_length, config.hidden_size, generator=generator)
    table = relative_position_embeddings(memory_length + query_length, config.hidden_size, 0, torch.float32, "cpu")
    allowed = causal_allowed(query_length, memory_length, "cpu")[None, None]
    return hidden, table, allowed, memory


@pytest.mark.slow
def test_relative_attention_compiles_fullgraph_to_the_eager_result():
    config = tiny_config("transfo-xl", **XL_OVERRIDES, attn_implementation="sdpa")
    torch.manual_seed(0)
    attention = RelativePositionAttention(config)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0, 0.3)
    hidden, table, allowed, memory = attention_inputs(config)
    expected = attention(hidden, table, allowed, memory=memory)[0]
    (expected_gradient,) = torch.autograd.grad(expected.square().sum(), hidden)
    compiled = torch.compile(attention, fullgraph=True)
    output = compiled(hidden, table, allowed, memory=memory)[0]
    (gradient,) = torch.autograd.grad(output.square().sum(), hidden)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gradient, expected_gradient, atol=1e-5, rtol=1e-5)


def graph_break_outside_layer_stack(error: Exception) -> str | None:
    """`file:line` of the project code where dynamo stopped, when that file is not part of the layer stack."""
    message = str(error)
    caused_by = re.search(r"# hf_txvariants/(\w+\.py):(\d+)", message)
    user_frames = re.findall(r'hf_txvariants/(\w+\.py)", line (\d+)', message)
    location = caused_by.groups() if caused_by else (user_frames[-1] if user_frames else None)
    if location is None or location[0] in LAYER_STACK_FILES:
        return None
    return ":".join(location)


@pytest.mark.slow
def test_torch_compile_transfo_xl_gives_the_eager_outputs():
    """`torch.compile(model)` (the compiled path) equals eager with memory and labels; fullgraph=True as well, except
    where a graph break comes from outside the layer stack (then the test reports that location as an expected
    failure: the cache / loss checks belong to issue 13)."""
    config = tiny_config("transfo-xl", **XL_OVERRIDES)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = model(ids)
        expected = model(ids, labels=ids, cache=output_cache(first).clone())
        expected_logits = model(ids, cache=output_cache(first).clone()).logits
        compiled = torch.compile(model)
        output = compiled(ids, labels=ids, cache=output_cache(first).clone())
        logits = compiled(ids, cache=output_cache(first).clone()).logits
    torch.testing.assert_close(output.losses, expected.losses, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            full = torch.compile(model, fullgraph=True)(ids, labels=ids, cache=output_cache(first).clone())
    except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as error:
        location = graph_break_outside_layer_stack(error)
        if location is None:
            raise
        pytest.xfail(f"fullgraph: graph break outside the layer stack at {location}")
    torch.testing.assert_close(full.losses, expected.losses, atol=1e-5, rtol=1e-5)


def random_attention(config, block_size):
    torch.manual_seed(0)
    attention = RelativePositionAttention(config)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0, 0.3)
    attention.query_block_size = block_size
    return attention


@pytest.mark.parametrize("window", [None, 4, 9])
def test_query_blocks_hold_every_key_their_queries_may_see(window):
    """Every key a query may see (causal, within the window) lies in its block's key range, and the range starts at
    a multiple of KEY_ALIGNMENT."""
    for memory_length, query_length, block_size in [(0, 7, 3), (5, 7, 2), (40, 70, 32), (64, 1, 32)]:
        allowed = causal_allowed(query_length, memory_length, "cpu", window)
        blocks = query_blocks(query_length, memory_length + query_length, window, block_size)
        assert [first for first, *_ in blocks] == list(range(0, query_length, block_size))
        assert blocks[-1][1] == query_length
        for first_query, end_query, first_key, end_key in blocks:
            assert first_key % KEY_ALIGNMENT == 0
            outside = allowed[first_query:end_query].clone()
            outside[:, first_key:end_key] = False
            assert not outside.any()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("with_span_bias", [False, True])
def test_attention_in_query_blocks_equals_one_block(implementation, window, with_span_bias):
    """Blocks of queries attending only to their key range give the output and gradients of one block over all keys
    (windowed and causal masks, a padding key, an extra additive bias such as adaptive span's, memory)."""
    config = tiny_config("transfo-xl", **XL_OVERRIDES, attn_implementation=implementation)
    memory_length, query_length = 37, 29
    hidden, table, allowed, memory = attention_inputs(config, memory_length, query_length)
    allowed = causal_allowed(query_length, memory_length, "cpu", window)[None, None].repeat(2, 1, 1, 1)
    allowed[1, ..., 40] = False  # a padding key in the second row
    span_bias = None
    if with_span_bias:
        span_bias = -torch.rand(1, config.num_attention_heads, query_length, memory_length + query_length) * 3
    results = []
    for block_size in (query_length, 8):
        attention = random_attention(config, block_size)
        output = attention(hidden, table, allowed, memory=memory, attention_bias=span_bias, key_window=window)[0]
        gradients = torch.autograd.grad(output.square().sum(), [hidden, *attention.parameters()])
        results.append((output, gradients))
    (one_block, one_block_gradients), (blocks, block_gradients) = results
    torch.testing.assert_close(blocks, one_block, atol=1e-6, rtol=1e-6)
    for gradient, expected in zip(block_gradients, one_block_gradients):  # sums over blocks: another order
        torch.testing.assert_close(gradient, expected, atol=1e-6 * expected.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_backward_computes_no_input_gradient_for_the_detached_memory(pre_norm):
    """The memory is detached: its rows of the key and value projections need only the weight gradient. Counted
    with torch's FLOP counter against the same pass where the memory requires a gradient, the difference is exactly
    the memory's input gradient (2 * B * M * hidden * 2 * inner FLOPs), unless a pre-norm's parameters need it."""
    from torch.utils.flop_counter import FlopCounterMode

    config = tiny_config("transfo-xl", **XL_OVERRIDES)
    attention = random_attention(config, block_size=4)
    norm = torch.nn.LayerNorm(config.hidden_size) if pre_norm else None
    hidden, table, allowed, memory = attention_inputs(config, memory_length=6, query_length=5)
    flops = []
    for memory_needs_gradient in (False, True):
        memory = memory.detach().requires_grad_(memory_needs_gradient)
        with FlopCounterMode(display=False) as counter:
            attention(hidden, table, allowed, memory=memory, context_norm=norm)[0].sum().backward()
        flops.append(counter.get_total_flops())
    inner = config.num_attention_heads * config.head_dim
    memory_input_gradient = 2 * memory.shape[0] * memory.shape[1] * config.hidden_size * 2 * inner
    assert flops[1] - flops[0] == (0 if pre_norm else memory_input_gradient)


@pytest.mark.parametrize("broadcast_mask", [False, True])
def test_biased_attention_with_bias_gradient_equals_eager(broadcast_mask):
    """The training path for SDPA on CPU (the product accumulated into the bias in place) gives eager attention's
    output and the gradients of query, key, value and bias."""
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(2, 3, 5, 4, generator=generator, requires_grad=True)
    key_value_shape = (2, 3, 7, 4)
    key = torch.randn(key_value_shape, generator=generator, requires_grad=True)
    value = torch.randn(key_value_shape, generator=generator, requires_grad=True)
    bias_shape = (1, 1, 5, 7) if broadcast_mask else (2, 3, 5, 7)
    masked = torch.rand(bias_shape, generator=generator) < 0.3
    bias = torch.randn(bias_shape, generator=generator).masked_fill(masked, torch.finfo(torch.float32).min)
    bias.requires_grad_(True)
    module = torch.nn.Module()
    results = []
    for function in (eager_attention_forward, biased_attention_with_bias_gradient):
        output = function(module, query, key, value, bias * 1.0, scaling=0.5)[0]
        results.append((output, torch.autograd.grad(output.square().sum(), [query, key, value, bias])))
    (expected, expected_gradients), (output, gradients) = results
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=1e-6)
    for gradient, expected_gradient in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected_gradient, atol=1e-6, rtol=1e-6)
