"""Adaptive Computation Time: the halting arithmetic against hand-computed examples (Graves 2016, section 2)."""

import math

import pytest
import torch

from hf_txvariants.txv_act import AdaptiveComputationTime, act_halting_step, add_ponder_cost


def logit(p):
    return math.log(p / (1 - p))


def make_act(max_steps, threshold=0.99):
    """An ACT block whose halting unit reads feature 0 of the step input: h = sigmoid(x_0)."""
    act = AdaptiveComputationTime(hidden_size=2, max_steps=max_steps, threshold=threshold)
    with torch.no_grad():
        act.halting.weight.copy_(torch.tensor([[1.0, 0.0]]))
        act.halting.bias.zero_()
    return act


def run_act(act, state, step_fn, position_mask=None, return_step_states=False):
    """The ACT loop as a model writes it around its step (`step_fn(state, step) -> (step_input, step_output)`)."""
    ponder = act.start(state, position_mask, return_step_states=return_step_states)
    for step in range(act.max_steps):
        ponder.update(*step_fn(ponder.state, step))
        if ponder.halted:
            break
    return ponder.result()


def scripted_step_fn(halting_per_step, outputs_per_step):
    """step_fn whose step input makes the halting unit emit halting_per_step[n][pos], and whose step output at
    position pos is outputs_per_step[n][pos] in feature 1 (feature 0 zero)."""

    def step_fn(state, step):
        h = torch.tensor([halting_per_step[step]])  # [1, length]
        step_input = torch.stack([torch.logit(h.double()).float(), torch.zeros_like(h)], dim=-1)
        y = torch.tensor([outputs_per_step[step]])
        step_output = torch.stack([torch.zeros_like(y), y], dim=-1)
        return step_input, step_output

    return step_fn


def test_halting_step_arithmetic():
    # h^1 = 0.3, h^2 = 0.5, h^3 = 0.4, threshold 0.99: 0.3 < .99, 0.8 < .99, 1.2 >= .99 -> N = 3, R = 1 - 0.8 = 0.2
    cumulative = torch.zeros(1)
    running = torch.ones(1, dtype=torch.bool)
    ps = []
    for n, h in enumerate([0.3, 0.5, 0.4]):
        p, cumulative, running, halts = act_halting_step(torch.tensor([h]), cumulative, running, 0.99, False)
        ps.append(float(p))
        assert bool(halts) == (n == 2)
    assert ps == pytest.approx([0.3, 0.5, 0.2])
    assert not bool(running)


def test_act_hand_computed_example():
    # Position 0: h = 0.3, 0.5, 0.4 -> N = 3, R = 0.2, p = (0.3, 0.5, 0.2), ponder 3.2
    # Position 1: h = 0.995 -> N = 1, R = 1 (nothing accumulated before), p = (1,), ponder 2.0
    # Position 2: h = 0.1, 0.1, 0.1, 0.1 with max_steps 4 -> forced halt at 4, R = 1 - 0.3 = 0.7, ponder 4.7
    halting = [[0.3, 0.995, 0.1], [0.5, 0.9, 0.1], [0.4, 0.9, 0.1], [0.9, 0.9, 0.1]]
    outputs = [[1.0, 2.0, 1.0], [10.0, 20.0, 2.0], [100.0, 200.0, 3.0], [1000.0, 2000.0, 4.0]]
    act = make_act(max_steps=4)
    result = run_act(act, torch.zeros(1, 3, 2), scripted_step_fn(halting, outputs), return_step_states=True)
    expected_y = [0.3 * 1 + 0.5 * 10 + 0.2 * 100, 2.0, 0.1 * 1 + 0.1 * 2 + 0.1 * 3 + 0.7 * 4]
    torch.testing.assert_close(result.output[0, :, 1], torch.tensor(expected_y))
    torch.testing.assert_close(result.n_updates[0], torch.tensor([3.0, 1.0, 4.0]))
    torch.testing.assert_close(result.remainders[0], torch.tensor([0.2, 1.0, 0.7]))
    torch.testing.assert_close(result.ponder_cost[0], torch.tensor([3.2, 2.0, 4.7]))
    assert result.num_steps == 4


def test_max_steps_forces_remainder():
    # h = 0.3, 0.5 with max_steps 2: forced halt at step 2 with R = 1 - 0.3 = 0.7
    act = make_act(max_steps=2)
    result = run_act(act, torch.zeros(1, 1, 2), scripted_step_fn([[0.3], [0.5]], [[1.0], [10.0]]))
    torch.testing.assert_close(result.output[0, 0, 1], torch.tensor(0.3 * 1 + 0.7 * 10))
    torch.testing.assert_close(result.ponder_cost[0], torch.tensor([2.7]))


def test_loop_stops_when_all_halted_and_halted_positions_are_copied():
    halting = [[0.995, 0.2], [0.9, 0.3], [0.9, 0.9], [0.9, 0.9]]
    outputs = [[5.0, 1.0], [7.0, 2.0], [9.0, 3.0], [11.0, 4.0]]
    act = make_act(max_steps=4)
    result = run_act(act, torch.zeros(1, 2, 2), scripted_step_fn(halting, outputs), return_step_states=True)
    assert result.num_steps == 3  # position 1 halts at step 3 (0.2 + 0.3 + 0.9 >= 0.99)
    # position 0 halted at step 1: its state is frozen at its output from then on
    for state in result.step_states:
        torch.testing.assert_close(state[0, 0], torch.tensor([0.0, 5.0]))
    # position 1 keeps its raw step output while running
    torch.testing.assert_close(result.step_states[1][0, 1], torch.tensor([0.0, 2.0]))
    torch.testing.assert_close(result.output[0, 1, 1], torch.tensor(0.2 * 1 + 0.3 * 2 + 0.5 * 3))


def test_remainder_gradient_reaches_halting_unit():
    act = AdaptiveComputationTime(hidden_size=4, max_steps=3)
    state = torch.randn(2, 5, 4)
    result = run_act(act, state, lambda s, n: (s, torch.tanh(s + 1)))
    result.ponder_cost.sum().backward()
    assert act.halting.weight.grad is not None and act.halting.weight.grad.abs().sum() > 0


def test_padding_positions_halt_at_once():
    act = AdaptiveComputationTime(hidden_size=4, max_steps=5, halting_bias_init=-5.0)
    with torch.no_grad():
        act.halting.bias.fill_(-5.0)
    mask = torch.tensor([[True, True, False]])
    result = run_act(act, torch.randn(1, 3, 4), lambda s, n: (s, s + 1), position_mask=mask)
    assert result.n_updates[0].tolist() == [5.0, 5.0, 1.0]
    assert result.ponder_cost[0, 2] == 0  # padding costs nothing
    # the loss term: weight * mean of N + R over the real positions only
    loss = add_ponder_cost(torch.tensor(1.0), result.ponder_cost, 0.5, mask.long())
    torch.testing.assert_close(loss, 1.0 + 0.5 * result.ponder_cost[0, :2].mean())


@pytest.mark.parametrize(
    "field,kwargs", [("max_steps", {"max_steps": 0}), ("threshold", {"max_steps": 2, "threshold": 1.5})]
)
def test_bad_arguments(field, kwargs):
    with pytest.raises(ValueError, match=field):
        AdaptiveComputationTime(hidden_size=4, **kwargs)
