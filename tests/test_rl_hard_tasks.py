"""POPGym's hard memory tasks through `make_vector_env` (issue 30): RepeatPrevious Medium / Hard, Autoencode Easy /
Medium, CountRecall Easy / Medium, with and without POPGym's `PreviousAction` wrapper. Scripted agents that remember
everything reach the maximum return 1.0 through the flattened observations (so the observation conventions are read
right), and repeating the previous action scores chance on RepeatPrevious (so the wrapper gives nothing away)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("popgym")

from hf_txvariants.rl import POPGYM_TASKS, make_env, make_vector_env  # noqa: E402

# flattened observation layout: the one-hot blocks in order, without / with the previous action
LAYOUTS = {
    "RepeatPreviousMedium": ([4, 2], [4, 4, 2]),  # suit, first-step flag / suit, previous action, flag
    "RepeatPreviousHard": ([4, 2], [4, 4, 2]),
    "AutoencodeEasy": ([2, 4, 2], [2, 4, 4, 2]),  # mode (1: watch, 0: play), suit, flag / ..., previous action, flag
    "AutoencodeMedium": ([2, 4, 2], [2, 4, 4, 2]),
    "CountRecallEasy": ([2, 2, 2], [2, 2, 27, 2]),  # dealt colour, queried colour, flag / ..., previous count, flag
    "CountRecallMedium": ([4, 4, 2], [4, 4, 27, 2]),  # dealt suit, queried suit, flag / ..., previous count, flag
}
ACTIONS = {
    "RepeatPreviousMedium": 4,
    "RepeatPreviousHard": 4,
    "AutoencodeEasy": 4,
    "AutoencodeMedium": 4,
    "CountRecallEasy": 27,
    "CountRecallMedium": 27,
}


def decode(observation, sizes) -> list[int]:
    """The index of the hot entry of each one-hot block."""
    blocks = np.split(np.asarray(observation), np.cumsum(sizes)[:-1])
    assert all(block.sum() == 1 for block in blocks), observation
    return [int(np.argmax(block)) for block in blocks]


def episode_return(env, choose, seed) -> float:
    observation, _ = env.reset(seed=seed)
    choose.reset() if hasattr(choose, "reset") else None
    total, done = 0.0, False
    while not done:
        observation, reward, terminated, truncated, _ = env.step(choose(observation))
        total, done = total + reward, terminated or truncated
    return total


@pytest.mark.parametrize("previous_action", [False, True])
@pytest.mark.parametrize("task", sorted(LAYOUTS))
def test_hard_tasks_build_as_vector_envs_with_popgym_conventions(task, previous_action):
    assert task in POPGYM_TASKS
    envs = make_vector_env(task, 3, seed=0, previous_action=previous_action)
    sizes = LAYOUTS[task][previous_action]
    assert envs.single_observation_space.shape == (sum(sizes),)
    assert envs.single_action_space.n == ACTIONS[task]
    observations, _ = envs.reset(seed=0)
    assert observations.shape == (3, sum(sizes))
    for row in observations:
        codes = decode(row, sizes)
        assert codes[-1] == 1  # Antialias: the first observation is flagged
        if previous_action:
            assert codes[-2] == 0  # POPGym's null action before the first step
    observations, *_ = envs.step(np.array([1, 2, 3]) % ACTIONS[task])
    for row, action in zip(observations, np.array([1, 2, 3]) % ACTIONS[task]):
        codes = decode(row, sizes)
        assert codes[-1] == 0
        if previous_action:
            assert codes[-2] == action
    envs.close()


def test_previous_action_is_refused_for_a_task_that_is_not_popgym():
    with pytest.raises(ValueError, match="previous_action is for the POPGym tasks"):
        make_vector_env("txv/ProofOfMemory-v0", 2, previous_action=True)


class RepeatPreviousOracle:
    """Remembers every suit; answers the suit dealt `k - 1` steps before the current card (POPGym's k counts the
    current card as 1 back)."""

    def __init__(self, k):
        self.k = k

    def reset(self):
        self.suits = []

    def __call__(self, observation):
        self.suits.append(decode(observation, [4, 2])[0])
        return self.suits[-self.k] if len(self.suits) >= self.k else 0


class AutoencodeOracle:
    """Stacks the suits while watching (mode 1, and the first play observation, which shows the last card), then
    pops them."""

    def reset(self):
        self.stack, self.playing = [], False

    def __call__(self, observation):
        mode, suit, _ = decode(observation, [2, 4, 2])
        if not self.playing:
            self.stack.append(suit)
            self.playing = mode == 0
        return self.stack.pop() if self.playing else 0


class CountRecallOracle:
    """Counts every dealt card; answers how many of the queried kind were dealt so far, the card shown now included."""

    def __init__(self, kinds):
        self.kinds = kinds

    def reset(self):
        self.counts = np.zeros(self.kinds, dtype=int)

    def __call__(self, observation):
        dealt, queried, _ = decode(observation, [self.kinds, self.kinds, 2])
        self.counts[dealt] += 1
        return int(self.counts[queried])


@pytest.mark.parametrize(
    "task, oracle",
    [
        ("RepeatPreviousMedium", RepeatPreviousOracle(32)),
        ("RepeatPreviousHard", RepeatPreviousOracle(64)),
        ("AutoencodeEasy", AutoencodeOracle()),
        ("AutoencodeMedium", AutoencodeOracle()),
        ("CountRecallEasy", CountRecallOracle(2)),
        ("CountRecallMedium", CountRecallOracle(4)),
    ],
)
def test_an_agent_that_remembers_everything_scores_the_maximum(task, oracle):
    env = make_env(task)
    assert [round(episode_return(env, oracle, seed), 6) for seed in range(2)] == [1.0, 1.0]


def test_with_the_previous_action_repeat_previous_still_needs_memory():
    """Unlike RepeatFirst (one answer for the whole episode, so "repeat your previous action" is perfect), the answer
    to RepeatPrevious changes every step: the previous action is the answer about the card before, which matches the
    one asked now only by chance (one suit in four: mean return -0.5). The best the current observation alone can do
    is also chance: the current card says nothing of the card 32 steps back."""
    env = make_env("RepeatPreviousMedium", previous_action=True)

    def repeat_previous_action(observation):
        return decode(observation, [4, 4, 2])[1]

    returns = [episode_return(env, repeat_previous_action, seed) for seed in range(30)]
    assert abs(np.mean(returns) + 0.5) < 0.1, np.mean(returns)
