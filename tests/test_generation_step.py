"""One position at a time against the memory (issue 26): the cached step (the memory's keys and values, the relative
position table and its projections kept in the `MemoryCache`, the one-query attention, the adaptive softmax of a
few rows) equals recomputation, for every XL-family variant, with the memory trimmed to mem_len, episode resets and
left padding.

Recomputation from scratch is possible where every query sees a bounded window (`same_length`, a hard `attn_span`):
a query then sees exactly the positions it would see stepping with a memory of mem_len, so one forward pass over the
whole sequence (the multi-query path, no memory carried) gives every step's logits. Without a window, the reference
steps with every cached tensor dropped before each step (the keys and values recomputed from the memory)."""

from __future__ import annotations

import pytest
import torch

from hf_txvariants import AdaptiveSpanForCausalLM, GTrXLForCausalLM, GTrXLModel, TransfoXLLMHeadModel
from hf_txvariants.txv_attention import causal_allowed
from hf_txvariants.txv_compat import output_cache
from hf_txvariants.txv_relative_attention import RelativePositionAttention, relative_position_embeddings
from tiny_configs import TINY_CONFIGS, general_path_only, tiny_config

# weights drawn at 0.2 instead of the default 0.02: logits of order 1 (GTrXL's spread ~0.1 at 0.02), so that a wrong key
# or position moves them far past the tolerances below
XL = dict(init_std=0.2, proj_init_std=0.2)
WIDE = dict(initializer_range=0.2)
# token ids valid in every model of this file (below the smallest tiny vocabulary)
VOCAB_SIZE = min(
    TINY_CONFIGS[model_type]["vocab_size"] for model_type in ("transfo-xl", "txv_gtrxl", "txv_adaptive_span")
)

# every variant with a window of mem_len (+ 1) keys: stepping with the trimmed memory == one pass from scratch
WINDOWED = {
    "transfo-xl (adaptive softmax, zero memory)": lambda: TransfoXLLMHeadModel(
        tiny_config("transfo-xl", **XL, same_length=True, same_length_extra_key=True, memory_init="zeros")
    ),
    "transfo-xl pre_lnorm, shared biases": lambda: TransfoXLLMHeadModel(
        tiny_config("transfo-xl", **XL, same_length=True, pre_lnorm=True, untie_r=False, memory_init="empty")
    ),
    "gtrxl": lambda: GTrXLForCausalLM(tiny_config("txv_gtrxl", **WIDE)),
    "gtrxl with adaptive softmax": lambda: GTrXLForCausalLM(
        tiny_config("txv_gtrxl", adaptive=True, cutoffs=[10, 20], div_val=2, **WIDE)
    ),
    "adaptive span": lambda: AdaptiveSpanForCausalLM(tiny_config("txv_adaptive_span", **WIDE)),
    "adaptive span, dynamic": lambda: AdaptiveSpanForCausalLM(
        tiny_config("txv_adaptive_span", adapt_span_dynamic=True, **WIDE)
    ),
}


def _model(name: str):
    torch.manual_seed(0)
    return WINDOWED[name]().eval()


def _ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, VOCAB_SIZE, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.exact
@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_generate_past_mem_len_equals_recomputing_from_scratch(name):
    """Greedy `generate()` (one token per step against the trimmed memory, everything cached) gives the tokens of
    recomputing the whole sequence at every step, and logits within 1e-5 of that recomputation."""
    model = _model(name)
    prompt = _ids(2, 4)
    new_tokens = 3 * model.config.mem_len  # far past mem_len: the memory is trimmed at every step
    output = model.generate(
        prompt,
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        recomputed = model(output.sequences[:, :-1]).logits[:, prompt.shape[1] - 1 :]
    step_logits = torch.stack(output.logits, dim=1)
    torch.testing.assert_close(step_logits, recomputed, atol=1e-5, rtol=1e-5)
    assert torch.equal(output.sequences[:, prompt.shape[1] :], recomputed.argmax(-1))


UNWINDOWED = {
    "transfo-xl": lambda: TransfoXLLMHeadModel(tiny_config("transfo-xl", **XL, same_length=False)),
    "gtrxl": lambda: GTrXLForCausalLM(tiny_config("txv_gtrxl", same_length=False, **WIDE)),
}


@pytest.mark.parametrize("name", sorted(UNWINDOWED))
def test_cached_steps_equal_steps_that_recompute_from_the_memory(name):
    """Without a window (a step sees its whole memory): stepping with every cached tensor reused, by the general
    backbone and by the one-position step (`txv_xl_step`, which a one-token call takes by default), gives the logits
    of stepping with the memory's keys and values, the position table and its projections recomputed at every step.
    The step path computes the same maths with the float operations in another order (folded weights): 1e-5."""
    ids = _ids(3, 20)
    logits = {}
    for mode in ("step path", "general, cached", "general, recomputed"):
        torch.manual_seed(0)
        model = UNWINDOWED[name]().eval()
        if mode != "step path":
            general_path_only(model)
        cache, steps = None, []
        with torch.no_grad():
            for t in range(ids.shape[1]):
                if cache is not None and mode == "general, recomputed":
                    cache.forget_key_values()
                output = model(ids[:, t : t + 1], cache=cache)
                cache = output_cache(output)
                steps.append(output.logits[:, -1])
        logits[mode] = torch.stack(steps, 1)
        if mode == "general, cached":
            assert cache.reuse.memory_keys is not None and cache.reuse.table is not None
        if mode == "step path":  # the step ran (its weights were made), and the cache is one MemoryCache throughout
            assert model.base_model._step_weights is not None and type(cache).__name__ == "MemoryCache"
    torch.testing.assert_close(logits["general, cached"], logits["general, recomputed"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits["step path"], logits["general, recomputed"], atol=1e-5, rtol=1e-5)


@pytest.mark.exact  # the tokens are compared exactly; the scores within 1e-5 (the two paths round differently)
@pytest.mark.parametrize("name", ["transfo-xl (adaptive softmax, zero memory)", "gtrxl"])
def test_beam_search_with_the_step_path_equals_the_general_path(name):
    """Beam search reorders the rows at every step: the step's buffers in the cache follow them
    (`MemoryCache._map_rows`, `StepMemory.map_rows`)."""
    prompt = _ids(2, 3)
    outputs = {}
    for step_path in (True, False):
        model = _model(name)
        if not step_path:
            general_path_only(model)
        outputs[step_path] = model.generate(
            prompt,
            max_new_tokens=2 * model.config.mem_len,
            num_beams=3,
            num_return_sequences=2,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert torch.equal(outputs[True].sequences, outputs[False].sequences)
    torch.testing.assert_close(outputs[True].sequences_scores, outputs[False].sequences_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.exact
@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_left_padded_batch_past_mem_len_generates_like_each_row_alone(name):
    model = _model(name)
    rows = [_ids(1, n, seed=n) for n in (5, 2)]
    padded = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.zeros(2, 5, dtype=torch.long)
    for i, row in enumerate(rows):
        padded[i, 5 - row.shape[1] :] = row
        mask[i, 5 - row.shape[1] :] = 1
    kwargs = dict(max_new_tokens=2 * model.config.mem_len, do_sample=False, pad_token_id=0, eos_token_id=None)
    batched = model.generate(padded, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        alone = model.generate(row, **kwargs)
        assert torch.equal(batched[i, 5:], alone[0, row.shape[1] :]), i


@pytest.mark.parametrize("adaptive_span", [False, True])
def test_acting_one_step_per_call_with_episode_resets_equals_the_whole_rollout(adaptive_span):
    """GTrXL as an agent: 16 environments acting one step per call for 4 x mem_len steps (memory trimmed), episodes
    ending at random steps (`episode_starts`, and `reset_rows` between calls for some), give the hidden states of
    one pass over the whole rollout with the same episode starts."""
    torch.manual_seed(0)
    span = dict(adapt_span_enabled=True, attn_span=7, adapt_span_ramp=2, adapt_span_init=0.5) if adaptive_span else {}
    model = GTrXLModel(tiny_config("txv_gtrxl", **WIDE, **span)).eval()
    envs, steps = 16, 4 * model.config.mem_len
    generator = torch.Generator().manual_seed(3)
    observations = torch.randn(envs, steps, model.config.hidden_size, generator=generator)
    starts = torch.rand(envs, steps, generator=generator) < 0.1
    reset_between_calls = torch.rand(envs, steps, generator=generator) < 0.05
    starts = starts | reset_between_calls
    memory, acted = None, []
    with torch.no_grad():
        for t in range(steps):
            episode_starts = starts[:, t : t + 1] & ~reset_between_calls[:, t : t + 1]
            if memory is not None:
                memory.reset_rows(reset_between_calls[:, t])
            output = model(inputs_embeds=observations[:, t : t + 1], cache=memory, episode_starts=episode_starts)
            memory = output_cache(output)
            acted.append(output.last_hidden_state)
        whole = model(inputs_embeds=observations, episode_starts=starts).last_hidden_state
    torch.testing.assert_close(torch.cat(acted, 1), whole, atol=1e-5, rtol=1e-5)


def _attention(implementation: str) -> RelativePositionAttention:
    config = tiny_config("txv_gtrxl", attn_implementation=implementation)
    torch.manual_seed(0)
    attention = RelativePositionAttention(config)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_(0, 0.3)
    return attention


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("with_span_bias", [False, True])
def test_one_query_attention_equals_the_last_query_of_the_block_path(implementation, window, with_span_bias):
    """The one-query path (no relative shift, the position keys shared by the batch) against the multi-query path:
    the second query of a two-query segment over memory M sees the keys that one query sees over the memory
    [M; first position], at the same distances (window, a padding key, an additive span term, gradients too)."""
    attention = _attention(implementation)
    hidden_size, heads = attention.config.hidden_size, attention.config.num_attention_heads
    generator = torch.Generator().manual_seed(4)
    memory = torch.randn(3, 7, hidden_size, generator=generator)
    segment = torch.randn(3, 2, hidden_size, generator=generator, requires_grad=True)
    key_length = memory.shape[1] + 2
    allowed = causal_allowed(2, memory.shape[1], "cpu", window)[None, None].repeat(3, 1, 1, 1)
    allowed[1, ..., 3] = False  # a padding key in the second row
    span_bias = -torch.rand(1, heads, 2, key_length, generator=generator) * 3
    span_bias = span_bias if with_span_bias else None
    table = relative_position_embeddings(key_length, hidden_size, 0, torch.float32, "cpu")
    two = attention(segment, table, allowed, memory=memory, attention_bias=span_bias, key_window=window)[0][:, 1:]
    one = attention(
        segment[:, 1:],
        table,
        allowed[..., 1:, :],
        memory=torch.cat([memory, segment[:, :1].detach()], 1),
        attention_bias=None if span_bias is None else span_bias[..., 1:, :],
        key_window=window,
    )[0]
    torch.testing.assert_close(one, two, atol=1e-6, rtol=1e-6)
    (one_gradient,) = torch.autograd.grad(one.square().sum(), segment)
    (two_gradient,) = torch.autograd.grad(two.square().sum(), segment)
    # gradient entries reach ~7 here, and each path is ~3e-6 from the float64 gradient (float32 rounding of sums in
    # different orders, deterministic with one thread): 1e-6 absolute was tighter than float32 allows at that scale
    torch.testing.assert_close(one_gradient[:, 1], two_gradient[:, 1], atol=1e-5, rtol=1e-5)


def test_a_cached_step_projects_no_row_of_the_position_table():
    """Against a full memory, a cached step applies the position projection W_r to no row of the table (it reuses
    the projection kept in the cache), where the recomputing step projects the whole table."""
    torch.manual_seed(0)
    model = general_path_only(TransfoXLLMHeadModel(tiny_config("transfo-xl", **XL, same_length=False)).eval())
    ids = _ids(2, 12)
    projected_rows = []
    hooks = [
        module.register_forward_pre_hook(lambda module, args: projected_rows.append(args[0].shape[-2]))
        for name, module in model.named_modules()
        if name.endswith("r_net")
    ]
    with torch.no_grad():
        cache = output_cache(model(ids[:, :8]))
        projected_rows.clear()
        model(ids[:, 8:9], cache=cache)
        cached_step = list(projected_rows)
        projected_rows.clear()
        cache.forget_key_values()
        model(ids[:, 9:10], cache=cache)
        recomputing_step = list(projected_rows)
    for hook in hooks:
        hook.remove()
    assert cached_step == []
    # the recomputing step projects the whole table: the full memory and the step
    assert recomputing_step and all(rows >= model.config.mem_len + 1 for rows in recomputing_step)


@pytest.mark.exact
def test_append_buffers_equal_concatenation_and_never_change_a_tensor_handed_out():
    """`AppendBuffers.append` is `torch.cat`: in place after the window it handed out last (no copy of the window),
    through refills of a full buffer; every window handed out keeps its values; a tensor it did not hand out (here a
    view of its own buffer that is not the kept window) is copied, never written after."""
    from hf_txvariants.txv_xl_reuse import AppendBuffers

    buffers, generator = AppendBuffers(), torch.Generator().manual_seed(0)
    window = torch.randn(2, 3, 4, generator=generator)
    expected, handed_out = window.clone(), []
    for step in range(12):  # a buffer holds 3 + 1 + 3 positions: refilled every few steps
        new = torch.randn(2, 1, 4, generator=generator)
        extended = buffers.append("memory", window, new, 1)
        expected = torch.cat([expected, new], 1)
        torch.testing.assert_close(extended, expected, atol=0, rtol=0)
        if step > 0:
            assert extended._base is not None  # a view of the buffer, not a copy
        expected = expected[:, -3:]
        window = extended[:, -3:]
        buffers.keep("memory", window)
        handed_out.append((window, window.clone()))
    for tensor, values in handed_out:
        assert torch.equal(tensor, values)
    stale = handed_out[-2][0]  # an older window: not the kept one
    appended = buffers.append("memory", stale, torch.zeros(2, 1, 4), 1)
    assert appended._base is not window._base
    for tensor, values in handed_out:
        assert torch.equal(tensor, values)


@pytest.mark.exact
def test_append_buffers_keep_no_room_after_a_segment():
    """A segment's append (more than a step) allocates `[window; new]` exactly, as `torch.cat` does, so evaluation
    holds one segment's memory, keys and values per layer, not twice that; a step's append keeps room."""
    from hf_txvariants.txv_xl_reuse import AppendBuffers

    buffers = AppendBuffers()
    window, segment = torch.randn(2, 16, 4), torch.randn(2, 16, 4)
    extended = buffers.append("memory", window, segment, 1)
    assert torch.equal(extended, torch.cat([window, segment], 1))
    assert extended._base.shape[1] == 32  # no room
    stepped = buffers.append("step", window, segment[:, :1], 1)
    assert torch.equal(stepped, torch.cat([window, segment[:, :1]], 1))
    assert stepped._base.shape[1] == 16 + 1 + 16  # room for as many steps as the window is long


def test_acting_steps_equal_recomputing_with_and_without_in_place_memory():
    """One step at a time without autograd (the memory and keys/values appended in place) gives the hidden states
    of the same steps with autograd on (concatenated copies), past mem_len and through episode starts."""
    torch.manual_seed(0)
    model = GTrXLModel(tiny_config("txv_gtrxl", **WIDE)).eval()
    generator = torch.Generator().manual_seed(3)
    inputs = torch.randn(3, 14, model.config.hidden_size, generator=generator)
    starts = torch.rand(3, 14, generator=generator) < 0.15
    outputs = {}
    for grad in (False, True):
        cache, steps = None, []
        with torch.set_grad_enabled(grad):
            for t in range(inputs.shape[1]):
                out = model(
                    inputs_embeds=inputs[:, t : t + 1], cache=cache, episode_starts=starts[:, t : t + 1], use_cache=True
                )
                cache = out.cache
                steps.append(out.last_hidden_state.detach())
        outputs[grad] = torch.cat(steps, 1)
    torch.testing.assert_close(outputs[False], outputs[True], atol=1e-5, rtol=1e-5)
