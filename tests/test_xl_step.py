"""The one-step path of an acting agent (`txv_xl_step`): the same outputs and memory as the general XL backbone, step
by step, for every residual form and gate, across episode starts, weight changes and the window's moves back to the
front of its buffers; the general path takes over where the step path cannot run.

Tolerance: both paths compute the same maths with the float operations in another order (the 1 / sqrt(head_dim)
scale and the position term folded into the query's weights, the scores accumulated in another order), so they differ
by float32 rounding: about 4e-7 on these outputs of order 1. 1e-5 leaves a wide margin for other CPU
kernels (AVX2, AVX-512 or none) and still fails on any real difference (a wrong distance, mask or weight moves the
outputs by more than 1e-3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from hf_txvariants.rl import MemoryPolicy  # noqa: E402
from hf_txvariants.txv_xl_memory import MemoryCache  # noqa: E402
from hf_txvariants.txv_xl_step import step_support  # noqa: E402
from tiny_configs import tiny_policy_gtrxl  # noqa: E402

TOLERANCE = dict(atol=1e-5, rtol=1e-5)
RESIDUAL_FORMS = [
    dict(gate_type="gru"),
    dict(gate_type="gru", gate_bias=0.0),
    dict(gate_type="trxl_i"),
    dict(gate_type="output"),
    dict(gate_type="highway"),
    dict(gate_type="input"),
    dict(gate_type="sigmoid_tanh"),
    dict(gate_type="trxl"),  # post-norm: no norm before the attention
    dict(gate_type="trxl", pre_lnorm=True),
    dict(gate_type="gru", attn_span=3),  # a window shorter than the memory: the step attends its last 3 keys
]


def tiny_policy(**fields) -> MemoryPolicy:
    torch.manual_seed(0)
    space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    policy = MemoryPolicy.gtrxl(space, gym.spaces.Discrete(3), config=tiny_policy_gtrxl(**fields)).eval()
    with torch.no_grad():  # biases away from their zero init, so a mix-up of u and v, or a lost bias, shows
        for name, parameter in policy.named_parameters():
            if "bias" in name:
                parameter.normal_(0.0, 0.3)
    return policy


def general_step(body, inputs, state, starts):
    """One step through the general backbone (autograd on: the step path is for inference only)."""
    with torch.enable_grad():
        hidden, state = body(inputs, state, starts)
    return hidden.detach(), state


def fast_step(body, inputs, state, starts):
    """One step that must go through the model's door into the one-position step (`forward_step`): the general
    backbone (`forward_segment`) must not run."""
    segment_pass = body.model.forward_segment
    body.model.forward_segment = lambda *args, **kwargs: pytest.fail("the step took the general backbone")
    try:
        with torch.no_grad():
            hidden, state = body(inputs, state, starts)
    finally:
        body.model.forward_segment = segment_pass
    return hidden, state


@pytest.mark.exact  # the memory masks (bool) are compared exactly; the floats within TOLERANCE
@pytest.mark.parametrize("fields", RESIDUAL_FORMS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("memory_init", ["empty", "zeros"])
def test_the_step_path_equals_the_general_backbone_step_by_step(fields, memory_init):
    policy = tiny_policy(memory_init=memory_init, **fields)
    body = policy.body
    assert step_support(body.model) is None
    generator = torch.Generator().manual_seed(1)
    rows, steps = 4, 3 * body.mem_len + 2  # the window moves back to the front of its buffers twice
    fast_state, general_state = policy.initial_state(rows), policy.initial_state(rows)
    for t in range(steps):
        inputs = torch.randn(rows, 1, body.hidden_size, generator=generator)
        starts = torch.rand(rows, 1, generator=generator) < 0.2
        starts[:, 0] |= t == 0
        fast, fast_state = fast_step(body, inputs, fast_state, starts)
        general, general_state = general_step(body, inputs, general_state, starts)
        assert isinstance(fast_state, MemoryCache) and isinstance(general_state, MemoryCache)
        torch.testing.assert_close(fast, general, **TOLERANCE)
        fast_snapshot, general_snapshot = body.snapshot(fast_state), body.snapshot(general_state)
        assert torch.equal(fast_snapshot["memory_mask"], general_snapshot["memory_mask"])
        torch.testing.assert_close(fast_snapshot["memory"], general_snapshot["memory"], **TOLERANCE)
        if t == body.mem_len:  # an optimiser-like in-place change: the step path must use the new weights
            with torch.no_grad():
                for parameter in body.parameters():
                    parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


def test_a_state_from_the_step_path_continues_in_the_general_path():
    """A state the step path advanced (its memory in the step's layout), handed to a pass the step path does not take
    (several steps, autograd), is the same memory."""
    policy = tiny_policy()
    body = policy.body
    generator = torch.Generator().manual_seed(2)
    rows = 3
    fast_state, general_state = policy.initial_state(rows), policy.initial_state(rows)
    for t in range(7):
        inputs = torch.randn(rows, 1, body.hidden_size, generator=generator)
        starts = torch.full((rows, 1), t == 0)
        _, fast_state = fast_step(body, inputs, fast_state, starts)
        _, general_state = general_step(body, inputs, general_state, starts)
    segment = torch.randn(rows, 4, body.hidden_size, generator=generator)
    starts = torch.zeros(rows, 4, dtype=torch.bool)
    from_fast, _ = body(segment, fast_state, starts)
    from_general, _ = body(segment, general_state, starts)
    torch.testing.assert_close(from_fast, from_general, **TOLERANCE)
    from_fast.sum().backward()  # the general path's graph, through the restored memory's keys
    assert body.model.layers[0].attention.qkv_net.weight.grad is not None


def test_the_step_path_names_what_it_cannot_run_and_the_general_path_acts_instead():
    policy = tiny_policy(adapt_span_enabled=True, attn_span=6)
    assert "adaptive span" in step_support(policy.body.model)
    state = policy.initial_state(2)
    step = policy.act(torch.zeros(2, 3), state, torch.ones(2, dtype=torch.bool))
    assert isinstance(step.state, MemoryCache)


def test_a_state_for_other_envs_is_refused_by_count():
    policy = tiny_policy()
    step = policy.act(torch.zeros(3, 3), policy.initial_state(3), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="memory of 3 envs, but 2 observations"):
        policy.act(torch.zeros(2, 3), step.state, torch.zeros(2, dtype=torch.bool))


def test_a_state_made_under_inference_mode_goes_on_outside_it():
    policy = tiny_policy()
    observations, starts = torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool)
    with torch.inference_mode():
        state = policy.act(observations, policy.initial_state(2), ~starts).state
    expected = policy.act(observations, policy.restore(policy.snapshot(state)), starts)
    step = policy.act(observations, state, starts)
    torch.testing.assert_close(step.values, expected.values, **TOLERANCE)


def test_what_acting_returns_is_ordinary_tensors_autograd_can_use():
    """The step runs in inference mode; its tensors must not leak into what a user or PPO's learning pass reads."""
    policy = tiny_policy()
    step = policy.act(torch.zeros(2, 3), policy.initial_state(2), torch.ones(2, dtype=torch.bool))
    snapshot = policy.snapshot(step.state)
    returned = {"actions": step.actions, "log_probs": step.log_probs, "values": step.values, **snapshot}
    assert not any(tensor.is_inference() for tensor in returned.values())
    weight = torch.ones(2, requires_grad=True)
    (weight * step.values * step.log_probs).sum().backward()  # saves both for backward: refused for inference ones
    torch.testing.assert_close(weight.grad, step.values * step.log_probs, **TOLERANCE)
    policy.train()  # learning starts from the snapshot, through the general path
    hidden, _ = policy.body(
        torch.zeros(2, 1, policy.body.hidden_size), policy.restore(snapshot), torch.zeros(2, 1).bool()
    )
    hidden.sum().backward()


def test_moving_or_switching_mode_forgets_what_the_step_path_kept():
    policy = tiny_policy()
    state = policy.initial_state(2)
    policy.act(torch.zeros(2, 3), state, torch.ones(2, dtype=torch.bool))
    assert policy.body.model._step_weights is not None
    policy.train()
    assert policy.body.model._step_weights is None and policy.body.model._step_support is None
    policy.eval().act(torch.zeros(2, 3), policy.initial_state(2), torch.ones(2, dtype=torch.bool))
    policy.to(torch.float64)  # (a cast or a move replaces every parameter's storage)
    assert policy.body.model._step_weights is None and policy.body.model._step_parameters is None


def test_a_window_changed_in_the_config_takes_effect_on_the_next_step():
    """The step weights are kept per setting of the fields they depend on (`STEP_SETTING_FIELDS`), not only per weight
    version: a window narrowed between two steps (`attn_span`, with the weights unchanged) is the one the next step
    attends, as on the general path."""
    policy = tiny_policy()
    body = policy.body
    generator = torch.Generator().manual_seed(3)
    rows = 3
    fast_state, general_state = policy.initial_state(rows), policy.initial_state(rows)
    for t in range(2 * body.mem_len):
        if t == body.mem_len:
            body.model.config.attn_span = 3
        inputs = torch.randn(rows, 1, body.hidden_size, generator=generator)
        starts = torch.full((rows, 1), t == 0)
        fast, fast_state = fast_step(body, inputs, fast_state, starts)
        general, general_state = general_step(body, inputs, general_state, starts)
        torch.testing.assert_close(fast, general, **TOLERANCE)
