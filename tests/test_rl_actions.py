"""hf_txvariants.rl action spaces beyond Discrete (Box: diagonal Gaussian; MultiDiscrete: independent categoricals)
and PPO's learning-rate and entropy annealing."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from hf_txvariants.rl import MemoryPolicy, PPOSettings, linear_schedule, train_ppo  # noqa: E402
from hf_txvariants.rl import ppo as ppo_module  # noqa: E402
from tiny_configs import tiny_policy_gtrxl  # noqa: E402

BOX = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
MULTI = gym.spaces.MultiDiscrete([3, 2], start=[1, 0])


class TargetEnv(gym.Env):
    """One-step episodes: the observation is a target, the reward says how well the action matched it.

    Box: target in [-0.8, 0.8]^2, reward -|action - target|^2. MultiDiscrete([3, 3]): target t in {0, 1, 2}, reward
    the mean of [action[0] == t, action[1] == (t + 1) % 3] (1.0 at best, 1/3 by chance)."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind == "box":
            self.observation_space, self.action_space = BOX, BOX
        else:
            self.observation_space, self.action_space = gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([3, 3])
        self.target = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.kind == "box":
            self.target = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        else:
            self.target = int(self.np_random.integers(3))
        return self.target, {}

    def step(self, action):
        if self.kind == "box":
            assert self.action_space.contains(action), action  # train_ppo steps the env with clipped actions
            reward = -float(np.sum((action - self.target) ** 2))
        else:
            reward = (float(action[0] == self.target) + float(action[1] == (self.target + 1) % 3)) / 2
        return self.target, reward, True, False, {}


def target_envs(kind, num_envs=8):
    return gym.vector.SyncVectorEnv(
        [lambda: TargetEnv(kind) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


@pytest.mark.parametrize("action_space", [BOX, MULTI], ids=["box", "multi_discrete"])
@pytest.mark.parametrize("kind", ["gtrxl", "gru"])
def test_segment_rerun_gives_the_log_probs_acting_gave(kind, action_space):
    """As PPO learns: acting step by step, then evaluating the stored actions over the segment from its snapshot,
    gives the same log-probabilities and values (with an episode start inside the segment)."""
    torch.manual_seed(0)
    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    if kind == "gtrxl":
        policy = MemoryPolicy.gtrxl(observation_space, action_space, config=tiny_policy_gtrxl()).eval()
    else:
        policy = MemoryPolicy.gru(observation_space, action_space, 16).eval()
    observations = torch.randn(3, 5, 3)
    starts = torch.zeros(3, 5, dtype=torch.bool)
    starts[:, 0], starts[1, 3] = True, True
    state = policy.initial_state(3)
    snapshot = policy.snapshot(state)
    steps = []
    for t in range(5):
        step = policy.act(observations[:, t], state, starts[:, t])
        steps.append(step)
        state = step.state
    with torch.no_grad():
        log_probs, _, values = policy.evaluate_actions(
            observations, policy.restore(snapshot), starts, torch.stack([s.actions for s in steps], 1)
        )
    torch.testing.assert_close(log_probs, torch.stack([s.log_probs for s in steps], 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values, torch.stack([s.values for s in steps], 1), atol=1e-5, rtol=1e-5)


def test_box_actions_are_unclipped_gaussian_samples_clipped_only_to_step_the_env():
    torch.manual_seed(0)
    policy = MemoryPolicy.mlp(BOX, BOX, 8)
    with torch.no_grad():
        policy.log_std.fill_(1.0)  # std e: most samples leave [-1, 1]
    observations = torch.rand(64, 2) * 2 - 1
    step = policy.act(observations, None, torch.ones(64, dtype=torch.bool))
    assert step.actions.shape == (64, 2) and step.actions.abs().max() > 1.5  # the samples themselves are kept
    out = policy(observations[:, None], None, torch.ones(64, 1, dtype=torch.bool))
    reference = torch.distributions.Normal(out.logits[:, 0], torch.full((2,), np.e)).log_prob(step.actions).sum(-1)
    torch.testing.assert_close(step.log_probs, reference)  # the log-prob of the unclipped sample
    stepped = policy.env_actions(step.actions)
    np.testing.assert_array_equal(stepped, np.clip(step.actions.numpy(), -1.0, 1.0))
    assert stepped.dtype == np.float32 and BOX.contains(stepped[0])
    greedy = policy.act(observations, None, torch.ones(64, dtype=torch.bool), greedy=True)
    torch.testing.assert_close(greedy.actions, out.logits[:, 0])  # the mean
    _, entropy, _ = policy.evaluate_actions(
        observations[:, None], None, torch.ones(64, 1, dtype=torch.bool), step.actions[:, None]
    )
    torch.testing.assert_close(entropy, torch.full((64, 1), 2 * (0.5 + 0.5 * np.log(2 * np.pi) + 1.0)))


def test_multi_discrete_log_probs_and_entropies_are_sums_over_independent_categoricals():
    torch.manual_seed(0)
    policy = MemoryPolicy.mlp(gym.spaces.Discrete(4), MULTI, 8)
    observations = torch.tensor([0, 1, 2, 3])
    step = policy.act(observations, None, torch.ones(4, dtype=torch.bool))
    assert step.actions.shape == (4, 2) and all(MULTI.contains(a) for a in policy.env_actions(step.actions))
    logits = policy(observations[:, None], None, torch.ones(4, 1, dtype=torch.bool)).logits[:, 0]
    first, second = (
        torch.distributions.Categorical(logits=logits[:, :3]),
        torch.distributions.Categorical(logits=logits[:, 3:]),
    )
    codes = step.actions - torch.tensor([1, 0])  # MULTI's start
    torch.testing.assert_close(step.log_probs, first.log_prob(codes[:, 0]) + second.log_prob(codes[:, 1]))
    _, entropy, _ = policy.evaluate_actions(
        observations[:, None], None, torch.ones(4, 1, dtype=torch.bool), step.actions[:, None]
    )
    torch.testing.assert_close(entropy[:, 0], first.entropy() + second.entropy())
    greedy = policy.act(observations, None, torch.ones(4, dtype=torch.bool), greedy=True).actions
    torch.testing.assert_close(greedy, torch.stack([logits[:, :3].argmax(-1) + 1, logits[:, 3:].argmax(-1)], -1))


@pytest.mark.slow  # PPO trains until the action is learnt
def test_ppo_learns_a_box_action_that_matches_the_target():
    """From about -1.2 (random Gaussian actions) to a greedy action within reach of the target, in 4096 steps."""
    torch.manual_seed(0)
    envs = target_envs("box")
    policy = MemoryPolicy.gru(BOX, BOX, 16)
    settings = PPOSettings(
        total_steps=4096, rollout_steps=16, segment_length=8, minibatches=4, learning_rate=3e-3, return_window=64
    )
    history = train_ppo(policy, envs, settings, seed=0)
    scored = [r for r in history.mean_returns if r is not None]
    assert scored[0] < -0.8 and history.final_mean_return > -0.3, scored
    assert policy.log_std.max() < -0.3  # the exploration noise shrank (state-independent log-std is learned)
    targets = np.random.default_rng(1).uniform(-0.8, 0.8, (32, 2)).astype(np.float32)
    actions, _ = policy.predict(targets, deterministic=True)
    assert np.abs(actions - targets).mean() < 0.15


@pytest.mark.slow  # PPO trains until the action is learnt
def test_ppo_learns_a_multi_discrete_action():
    """Both parts of the action must match their target: 1/3 by chance, 1.0 learned, in 4096 steps."""
    torch.manual_seed(0)
    envs = target_envs("multi_discrete")
    policy = MemoryPolicy.gru(envs.single_observation_space, envs.single_action_space, 16)
    settings = PPOSettings(
        total_steps=4096, rollout_steps=16, segment_length=8, minibatches=4, learning_rate=3e-3, return_window=64
    )
    history = train_ppo(policy, envs, settings, seed=0)
    assert history.final_mean_return > 0.9, history.mean_returns
    actions, _ = policy.predict(np.array([0, 1, 2]), deterministic=True)
    np.testing.assert_array_equal(actions, [[0, 1], [1, 2], [2, 0]])


def test_linear_schedule_reaches_the_final_value_after_the_last_update():
    settings = PPOSettings(learning_rate=1e-3, final_learning_rate=0.0, entropy_coef=0.02, final_entropy_coef=0.005)
    # CleanRL's anneal_lr: frac = 1 - (iteration - 1) / num_iterations; lr = frac * learning_rate (iteration from 1)
    assert [settings.learning_rate_at(u, 4) for u in range(4)] == pytest.approx([(1 - u / 4) * 1e-3 for u in range(4)])
    assert settings.entropy_coef_at(0, 4) == 0.02 and settings.entropy_coef_at(4, 4) == pytest.approx(0.005)
    assert PPOSettings(learning_rate=1e-3).learning_rate_at(3, 4) == 1e-3  # no final value: constant
    assert linear_schedule(1.0, 3.0, 1, 4) == 1.5
    with pytest.raises(ValueError, match="PPOSettings.final_learning_rate must be >= 0, got -0.1"):
        PPOSettings(final_learning_rate=-0.1).check(4)


def test_train_ppo_anneals_what_the_optimizer_and_the_loss_use():
    """Every optimizer step of update u runs at learning_rate_at(u), and the loss of update u weighs the entropy by
    entropy_coef_at(u)."""
    envs = target_envs("multi_discrete", num_envs=4)
    policy = MemoryPolicy.mlp(envs.single_observation_space, envs.single_action_space, 8)
    settings = PPOSettings(
        total_steps=4 * 8 * 4,
        rollout_steps=8,
        segment_length=4,
        epochs=2,
        minibatches=2,
        learning_rate=1e-3,
        final_learning_rate=0.0,
        entropy_coef=0.02,
        final_entropy_coef=0.0,
    )
    step_rates, update_entropy_coefs = [], []
    adam_step, update = torch.optim.Adam.step, ppo_module._update

    def recording_step(optimizer, *args, **kwargs):
        step_rates.append(optimizer.param_groups[0]["lr"])
        return adam_step(optimizer, *args, **kwargs)

    def recording_update(*args):
        update_entropy_coefs.append(args[-1])
        return update(*args)

    with (
        mock.patch.object(torch.optim.Adam, "step", recording_step),
        mock.patch.object(ppo_module, "_update", recording_update),
    ):
        history = train_ppo(policy, envs, settings, seed=0)
    updates = 4
    expected_rates = [settings.learning_rate_at(u, updates) for u in range(updates)]
    assert history.learning_rates == expected_rates and expected_rates[0] == 1e-3 and expected_rates[-1] > 0
    assert step_rates == [rate for rate in expected_rates for _ in range(2 * 2)]  # epochs x minibatches steps each
    assert update_entropy_coefs == history.entropy_coefs == [settings.entropy_coef_at(u, updates) for u in range(4)]
    assert history.entropy_coefs[0] == 0.02 and history.entropy_coefs[-1] == pytest.approx(0.005)


@pytest.mark.parametrize("name, value", [("gamma", 1.5), ("gamma", -0.1), ("gae_lambda", 2.0), ("gamma", float("nan"))])
def test_a_discount_or_gae_lambda_outside_zero_to_one_is_refused_by_name(name, value):
    with pytest.raises(ValueError, match=f"PPOSettings.{name} must be in \\[0, 1\\], got {value}"):
        PPOSettings(**{name: value}).check(4)
    PPOSettings(gamma=0.0, gae_lambda=1.0).check(4)  # the ends are allowed (gamma 0: CountRecall in RESULTS)
