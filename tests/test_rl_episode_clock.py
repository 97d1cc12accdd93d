"""hf_txvariants.rl's episode clock (`EpisodeClock`, `MemoryPolicy(..., episode_clock=...)`): the step within the
episode, counted from the agent's own episode starts, as sin / cos features added to the encoded observations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from hf_txvariants.rl import (  # noqa: E402
    EPISODE_CLOCK_PERIODS,
    ClockedState,
    EpisodeClock,
    MemoryPolicy,
    make_policy,
)
from tiny_configs import tiny_policy_gtrxl, tiny_policy_gtrxl_fields  # noqa: E402

BOX_OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)


def steps_by_loop(episode_starts: torch.Tensor, steps_before: torch.Tensor) -> torch.Tensor:
    """The definition, one position at a time: 0 at a start, else one more than the position before."""
    envs, steps = episode_starts.shape
    out = torch.empty(envs, steps, dtype=torch.long)
    for env in range(envs):
        step = int(steps_before[env])
        for t in range(steps):
            step = 0 if episode_starts[env, t] else (step if t == 0 else step + 1)
            out[env, t] = step
    return out


@pytest.mark.exact  # integer step counts
@pytest.mark.parametrize("steps", [1, 2, 7, 40])
def test_episode_steps_count_from_each_episode_start_as_a_loop_does(steps):
    generator = torch.Generator().manual_seed(steps)
    starts = torch.rand(5, steps, generator=generator) < 0.2
    starts[0] = False  # one env with no start in the call: it goes on counting
    steps_before = torch.randint(0, 300, (5,), generator=generator)
    assert torch.equal(EpisodeClock.episode_steps(starts, steps_before), steps_by_loop(starts, steps_before))


def test_the_clock_features_are_sin_and_cos_of_the_step_over_each_period():
    periods = [4.0, 10.0, 512.0]
    clock = EpisodeClock(periods, hidden_size=6)
    with torch.no_grad():
        clock.projection.weight.copy_(torch.eye(6))  # read the features themselves
    steps = torch.tensor([[0, 1, 3, 1000, 123_457]])
    features = clock(steps, torch.float32)
    angles = [[2 * math.pi * s / p for p in periods] for s in steps[0].tolist()]
    expected = torch.tensor([[math.sin(a) for a in row] + [math.cos(a) for a in row] for row in angles])
    # float64 angles rounded once to float32: within float32's rounding of numbers in [-1, 1]
    torch.testing.assert_close(features[0], expected, atol=1e-7, rtol=0)


@pytest.mark.exact  # integer step counts
def test_the_clock_tells_apart_steps_whose_observations_are_equal_and_restarts_with_the_episode():
    """A memoryless policy with a clock sees the same observation differently at different steps of an episode,
    and a row that starts an episode acts as a fresh row does, whatever its clock read before."""
    torch.manual_seed(0)
    policy = MemoryPolicy.mlp(BOX_OBS, gym.spaces.Discrete(2), 16, episode_clock=True).eval()
    same = torch.ones(1, 5, 3)
    starts = torch.zeros(1, 5, dtype=torch.bool)
    starts[0, 0] = True
    with torch.no_grad():
        out = policy(same, policy.initial_state(1), starts)
        assert torch.equal(out.state.episode_steps, torch.tensor([5]))
        assert (out.logits[0, 0] - out.logits[0, 3]).abs().max() > 1e-3
        restarted = policy(same[:, :1], out.state, torch.ones(1, 1, dtype=torch.bool))
        carried = policy(same[:, :1], out.state, torch.zeros(1, 1, dtype=torch.bool))
    # one position against the first of five: the same maths, products of other shapes (rounding may differ)
    torch.testing.assert_close(restarted.logits[0, 0], out.logits[0, 0], atol=1e-6, rtol=1e-6)
    assert (carried.logits[0, 0] - out.logits[0, 0]).abs().max() > 1e-3


def test_predict_carries_the_episode_steps_in_its_state():
    torch.manual_seed(0)
    policy = MemoryPolicy.gtrxl(BOX_OBS, gym.spaces.Discrete(2), tiny_policy_gtrxl(), episode_clock=True).eval()
    observations = np.zeros((4, 2, 3), np.float32)
    state = None
    for t in range(4):
        _, state = policy.predict(observations[t], state, np.array([t == 0, t in (0, 2)]))
    assert state["episode_steps"].tolist() == [4, 2]  # the second env restarted at step 2
    assert {"memory", "memory_mask", "episode_steps"} == set(state)


def test_a_clocked_policy_saves_its_periods_and_a_plain_one_stays_format_1(tmp_path):
    clocked = MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8, episode_clock=[3.0, 50.0])
    clocked.save_pretrained(tmp_path / "clocked")
    config = json.loads((tmp_path / "clocked" / "config.json").read_text())
    assert config["format_version"] == 2 and config["episode_clock"] == [3.0, 50.0]
    assert MemoryPolicy.from_pretrained(tmp_path / "clocked").clock.periods == [3.0, 50.0]
    MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8).save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["format_version"] == 1 and "episode_clock" not in config
    assert MemoryPolicy.from_pretrained(tmp_path / "plain").clock is None
    assert list(EPISODE_CLOCK_PERIODS) == [4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0]
    assert MemoryPolicy.mlp(BOX_OBS, gym.spaces.Discrete(2), 8, episode_clock=True).clock.periods == list(
        EPISODE_CLOCK_PERIODS
    )


def test_make_policy_matches_the_gru_to_the_clocked_gtrxl():
    space, actions = gym.spaces.Box(0, 1, shape=(10,)), gym.spaces.Discrete(4)
    shape = tiny_policy_gtrxl_fields()
    gtrxl = make_policy("gtrxl", space, actions, episode_clock=True, **shape)
    gru = make_policy("gru", space, actions, episode_clock=True, **shape)
    assert gtrxl.clock is not None and gru.clock is not None
    width = gru.body.hidden_size
    gaps = {
        h: abs(MemoryPolicy.gru(space, actions, h, episode_clock=True).num_parameters - gtrxl.num_parameters)
        for h in (width - 1, width, width + 1)
    }
    assert gaps[width] == min(gaps.values())


def test_bad_clock_input_is_refused_by_name():
    with pytest.raises(ValueError, match="episode_clock periods must be positive finite numbers"):
        MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8, episode_clock=[4.0, 0.0])
    with pytest.raises(ValueError, match="episode_clock periods must be positive finite numbers"):
        MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8, episode_clock=[])
    for malformed in ("4, 8", "48", 5, [4.0, "x"]):  # e.g. a hand-edited config.json
        with pytest.raises(ValueError, match="episode_clock periods must be positive finite numbers .*got "):
            MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8, episode_clock=malformed)
    policy = MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8, episode_clock=True)
    with pytest.raises(ValueError, match=r"the state needs 'episode_steps', got \['hidden'\]"):
        policy.restore({"hidden": torch.zeros(2, 8)})
    plain_state = MemoryPolicy.gru(BOX_OBS, gym.spaces.Discrete(2), 8).initial_state(2)
    with pytest.raises(ValueError, match="its state is a ClockedState .* got Tensor"):
        policy.act(np.zeros((2, 3), np.float32), plain_state, np.ones(2, bool))
    with pytest.raises(ValueError, match="its state is a ClockedState .* got Tensor"):
        policy.snapshot(plain_state)
    assert isinstance(policy.initial_state(2), ClockedState)


def test_the_model_card_names_the_clock_and_its_periods():
    from hf_txvariants.rl.card import build_policy_card

    clocked = MemoryPolicy.gtrxl(BOX_OBS, gym.spaces.Discrete(2), tiny_policy_gtrxl(), episode_clock=True)
    card = build_policy_card(clocked, "someone/clocked", "AutoencodeEasy", 0.99).content
    assert "with an episode clock (the step within the episode, periods 4, 8, 16, 32, 64, 128, 256, 512)" in card
    plain = MemoryPolicy.gtrxl(BOX_OBS, gym.spaces.Discrete(2), tiny_policy_gtrxl())
    assert "with an episode clock" not in build_policy_card(plain, "someone/plain").content
