"""hf_txvariants.rl: the memory policies (GTrXL, TrXL-I, GRU, MLP), the segment PPO loop and the memory tasks."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from hf_txvariants.rl import (  # noqa: E402
    RL_GATE_BIAS,
    MemoryPolicy,
    PPOSettings,
    ProofOfMemoryEnv,
    generalised_advantages,
    make_policy,
    make_vector_env,
    parameter_matched_hidden_size,
    popgym_env,
    train_ppo,
)
from tiny_configs import tiny_policy_gtrxl, tiny_policy_gtrxl_fields  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BODIES = ["gtrxl", "trxl_i", "gru", "mlp"]


def build(kind, observation_space, action_space, **fields):
    """A tiny policy of `kind` (one of BODIES), with an episode clock if `kind` ends in "+clock"."""
    clock = kind.endswith("+clock")
    kind = kind.removesuffix("+clock")
    if kind in ("gtrxl", "trxl_i"):
        return MemoryPolicy.gtrxl(
            observation_space,
            action_space,
            tiny_policy_gtrxl(**{"gate_type": "gru" if kind == "gtrxl" else "trxl_i", **fields}),
            episode_clock=clock,
        )
    return getattr(MemoryPolicy, kind)(observation_space, action_space, 16, episode_clock=clock)


def short_episodes_env(num_envs=3, seed=0):
    """Proof-of-memory episodes of 3 to 6 steps, so that several start within one segment."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: ProofOfMemoryEnv(cue_steps=1, steps_to_end=2, max_steps=5) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs.action_space.seed(seed)
    return envs


@pytest.mark.parametrize("kind", BODIES + ["gtrxl+clock", "gru+clock", "mlp+clock"])
def test_learning_from_a_stored_segment_sees_what_acting_saw(kind):
    """Acting one step at a time, then re-running each stored segment from its snapshot (as PPO learns) gives the
    same log-probabilities and values, across episode starts inside the segments and memories longer than mem_len
    (with an episode clock: the steps counted across segments and restarted at each episode start)."""
    torch.manual_seed(0)
    envs = short_episodes_env()
    policy = build(kind, envs.single_observation_space, envs.single_action_space).eval()
    observations, _ = envs.reset(seed=0)
    state, starts = policy.initial_state(envs.num_envs), torch.ones(envs.num_envs, dtype=torch.bool)
    segment_length, recorded = 8, []
    for t in range(24):
        if t % segment_length == 0:
            recorded.append({"snapshot": policy.snapshot(state), "steps": []})
        step = policy.act(observations, state, starts)
        recorded[-1]["steps"].append((torch.as_tensor(observations), starts, step))
        observations, _, terminated, truncated, _ = envs.step(step.actions.numpy())
        state, starts = step.state, torch.as_tensor(terminated | truncated)
    assert any(bool(s.any()) for segment in recorded for _, s, _ in segment["steps"][1:]), (
        "no episode start mid-segment"
    )
    for segment in recorded:
        obs, seg_starts, steps = zip(*segment["steps"])
        with torch.no_grad():
            log_probs, _, values = policy.evaluate_actions(
                torch.stack(obs, 1),
                policy.restore(segment["snapshot"]),
                torch.stack(seg_starts, 1),
                torch.stack([s.actions for s in steps], 1),
            )
        torch.testing.assert_close(log_probs, torch.stack([s.log_probs for s in steps], 1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(values, torch.stack([s.values for s in steps], 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["gtrxl", "trxl_i", "gru", "gtrxl+clock"])
def test_episode_start_forgets_the_past_and_memory_carries_it_otherwise(kind):
    """A row that starts an episode acts exactly like a fresh row whatever came before; without the start, what it
    saw earlier changes its output (the memory works)."""
    torch.manual_seed(0)
    space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    policy = build(kind, space, gym.spaces.Discrete(2)).eval()
    history = torch.randn(2, 4, 3)
    history[1] = -history[0]  # two different pasts
    state = policy.initial_state(2)
    with torch.no_grad():
        out = policy(history, state, torch.zeros(2, 4, dtype=torch.bool))
        now = torch.randn(1, 1, 3).expand(2, 1, 3)
        carried = policy(now, policy.restore(policy.snapshot(out.state)), torch.zeros(2, 1, dtype=torch.bool))
        restarted = policy(now, policy.restore(policy.snapshot(out.state)), torch.ones(2, 1, dtype=torch.bool))
        fresh = policy(now[:1], policy.initial_state(1), torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(restarted.logits, fresh.logits.expand(2, 1, 2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(restarted.values, fresh.values.expand(2, 1), atol=1e-5, rtol=1e-5)
    assert (
        carried.logits[0] - carried.logits[1]
    ).abs().max() > 1e-6  # float noise is ~1e-7; GTrXL starts near identity


def test_the_memoryless_policy_ignores_the_past():
    space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    policy = build("mlp", space, gym.spaces.Discrete(2)).eval()
    with torch.no_grad():
        out = policy(torch.randn(2, 5, 3), policy.initial_state(2), torch.zeros(2, 5, dtype=torch.bool))
        now = torch.randn(1, 1, 3).expand(2, 1, 3)
        after = policy(now, out.state, torch.zeros(2, 1, dtype=torch.bool))
    torch.testing.assert_close(after.logits[0], after.logits[1])


def test_observation_encoder_codes_each_space():
    action_space = gym.spaces.Discrete(3, start=1)
    discrete = build("mlp", gym.spaces.Discrete(4, start=2), action_space)
    torch.testing.assert_close(discrete.encoder.features(torch.tensor([2, 5])), torch.eye(4)[[0, 3]])
    multi = build("mlp", gym.spaces.MultiDiscrete([2, 3]), action_space)
    torch.testing.assert_close(multi.encoder.features(torch.tensor([[1, 2]])), torch.tensor([[0.0, 1, 0, 0, 1]]))
    box = build("mlp", gym.spaces.Box(0, 1, shape=(2, 3)), action_space)
    assert box.encoder.features(torch.ones(5, 7, 2, 3)).shape == (5, 7, 6)
    step = discrete.act(np.array([2, 3]), None, np.array([True, True]))
    assert set(step.actions.tolist()) <= {1, 2, 3}  # actions in the action space's own numbering
    with pytest.raises(ValueError, match="outside the observation space"):
        discrete.encoder.features(torch.tensor([6]))


def test_unsupported_spaces_are_refused_by_name():
    with pytest.raises(ValueError, match="observation_space must be Discrete, MultiDiscrete or Box, got Dict"):
        build("gru", gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2))
    with pytest.raises(
        ValueError,
        match=r"action_space must be Discrete, MultiDiscrete \(one-dimensional nvec\) or Box "
        r"\(floating point\), got Tuple",
    ):
        build("gru", gym.spaces.Discrete(2), gym.spaces.Tuple([gym.spaces.Discrete(2)]))
    with pytest.raises(ValueError, match=r"got Box\(0, 3, \(1,\), int64\)"):
        build("gru", gym.spaces.Discrete(2), gym.spaces.Box(0, 3, shape=(1,), dtype=np.int64))
    with pytest.raises(ValueError, match=r"got MultiDiscrete\(\[\[2 2\]\]\)"):
        build("gru", gym.spaces.Discrete(2), gym.spaces.MultiDiscrete([[2, 2]]))
    policy = build("gru", gym.spaces.Discrete(2), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match=r"episode_starts has shape \(2, 3\), expected \[envs, steps\] = \(2, 4\)"):
        policy(torch.zeros(2, 4, dtype=torch.long), policy.initial_state(2), torch.zeros(2, 3, dtype=torch.bool))


def test_parameter_matched_baseline_is_the_closest_width():
    space, actions = gym.spaces.Box(0, 1, shape=(10,)), gym.spaces.Discrete(4)
    target = build("gtrxl", space, actions).num_parameters
    width = parameter_matched_hidden_size(lambda h: MemoryPolicy.gru(space, actions, h), target)
    gap = abs(MemoryPolicy.gru(space, actions, width).num_parameters - target)
    for neighbour in (width - 1, width + 1):
        assert gap <= abs(MemoryPolicy.gru(space, actions, neighbour).num_parameters - target)


def test_make_policy_gates_start_at_the_rl_gate_bias_unless_given():
    space, actions = gym.spaces.Box(0, 1, shape=(10,)), gym.spaces.Discrete(4)
    shape = tiny_policy_gtrxl_fields()

    def gate_biases(policy):
        return {float(v) for name, p in policy.named_parameters() if name.endswith("gate_bias") for v in p.flatten()}

    assert gate_biases(make_policy("gtrxl", space, actions, **shape)) == {RL_GATE_BIAS} == {0.0}
    assert gate_biases(make_policy("gtrxl", space, actions, gate_bias=2.0, **shape)) == {2.0}  # the paper's
    assert gate_biases(make_policy("trxl_i", space, actions, **shape)) == set()  # no gates, no gate_bias passed


def test_generalised_advantages_equal_the_sum_of_discounted_errors():
    """Against the definition A_t = sum_k (gamma lambda)^k delta_{t+k}, cut at the episode's end."""
    torch.manual_seed(0)
    steps, envs, gamma, lam = 7, 3, 0.9, 0.8
    rewards, values, next_value = torch.randn(steps, envs), torch.randn(steps, envs), torch.randn(envs)
    dones = (torch.rand(steps, envs) < 0.3).float()
    advantages, returns = generalised_advantages(rewards, values, dones, next_value, gamma, lam)
    following = torch.cat([values[1:], next_value[None]])
    deltas = rewards + gamma * following * (1 - dones) - values
    for e in range(envs):
        for t in range(steps):
            expected, weight = 0.0, 1.0
            for k in range(t, steps):
                expected += weight * deltas[k, e]
                if dones[k, e]:
                    break
                weight *= gamma * lam
            assert abs(advantages[t, e] - expected) < 1e-5
    torch.testing.assert_close(returns, advantages + values)


def test_proof_of_memory_rewards_the_cued_end_only():
    env = ProofOfMemoryEnv()
    for seed in range(6):
        observation, _ = env.reset(seed=seed)
        goal_is_right = observation[2] == 1.0
        assert observation[0] + observation[2] == 1.0 and observation[1] == 0.0
        observation, *_ = env.step(0 if goal_is_right else 1)  # frozen while the cue shows: the move is ignored
        assert observation[1] == 0.0 and observation[0] + observation[2] == 1.0
        observation, *_ = env.step(1)
        assert observation[0] == observation[2] == 0.0 and observation[1] == 0.0  # the cue is gone, still frozen
        rewards = []
        for _ in range(4):
            observation, reward, terminated, truncated, _ = env.step(1 if goal_is_right else 0)
            rewards.append(reward)
        assert terminated and not truncated and rewards == [0.0, 0.0, 0.0, 1.0]
        env.reset(seed=seed)
        for _ in range(6):
            _, reward, terminated, _, _ = env.step(0 if goal_is_right else 1)
        assert terminated and reward == -1.0
    env.reset(seed=0)
    for t in range(16):  # dithering times out with 0
        _, reward, terminated, truncated, _ = env.step(t % 2)
    assert truncated and not terminated and reward == 0.0
    with pytest.raises(ValueError, match="max_steps"):
        ProofOfMemoryEnv(max_steps=5)


def test_popgym_tasks_flag_the_first_step():
    pytest.importorskip("popgym")
    env = popgym_env("RepeatFirstEasy")
    assert env.observation_space.shape == (6,)  # one-hot: card suit 4, first-step flag 2
    observation, _ = env.reset(seed=0)
    assert observation[-1] == 1  # Antialias: the first observation is flagged
    observation, *_ = env.step(0)
    assert observation[-1] == 0
    with pytest.raises(ValueError, match="unknown POPGym task 'RepeatLast'"):
        popgym_env("RepeatLast")


def scripted_return(env, choose, seed) -> float:
    observation, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        observation, reward, terminated, truncated, _ = env.step(choose(observation))
        total, done = total + reward, terminated or truncated
    return total


def test_with_the_previous_action_repeat_first_needs_no_memory():
    """Why `previous_action` is off by default: a policy that looks only at the current observation (the first card
    at the flagged first step, then its own previous action) scores the maximum on RepeatFirst."""
    pytest.importorskip("popgym")
    env = popgym_env("RepeatFirstEasy", previous_action=True)
    assert env.observation_space.shape == (10,)  # one-hot: card suit 4, previous action 4, first-step flag 2

    def reactive(observation):
        return int(np.argmax(observation[:4])) if observation[-1] == 1 else int(np.argmax(observation[4:8]))

    assert [round(scripted_return(env, reactive, seed), 6) for seed in range(3)] == [1.0, 1.0, 1.0]


def test_train_ppo_runs_and_refuses_what_it_cannot_use():
    envs = make_vector_env("txv/ProofOfMemory-v0", 4, seed=0)
    policy = build("gtrxl", envs.single_observation_space, envs.single_action_space)
    settings = PPOSettings(total_steps=256, rollout_steps=32, segment_length=8, minibatches=2, return_window=5)
    history = train_ppo(policy, envs, settings, seed=0)
    assert history.steps == [128, 256] and history.episodes >= 5 and np.isfinite(history.mmer)
    with pytest.raises(ValueError, match="rollout_steps \\(30\\) must be a multiple of segment_length \\(8\\)"):
        train_ppo(policy, envs, PPOSettings(rollout_steps=30, segment_length=8), seed=0)
    next_step = gym.vector.SyncVectorEnv([ProofOfMemoryEnv])
    with pytest.raises(ValueError, match="autoreset_mode=AutoresetMode.SAME_STEP"):
        train_ppo(policy, next_step, settings, seed=0)


def test_target_kl_stops_an_update_after_the_epoch_that_passes_it():
    """`target_kl` (CleanRL's): once the approximate KL of an epoch's last minibatch exceeds it, the update's other
    epochs are skipped. With two minibatches the first epoch's second one already sees a moved policy, so a tiny target
    stops every update after one epoch; without a target every update runs all its epochs."""
    envs = make_vector_env("txv/ProofOfMemory-v0", 4, seed=0)
    policy = build("gtrxl", envs.single_observation_space, envs.single_action_space)
    settings = PPOSettings(total_steps=256, rollout_steps=32, segment_length=8, epochs=3, minibatches=2)
    assert train_ppo(policy, envs, settings, seed=0).epochs_run == [3, 3]
    stopped = train_ppo(policy, envs, dataclasses.replace(settings, target_kl=1e-12), seed=0)
    assert stopped.epochs_run == [1, 1]
    with pytest.raises(ValueError, match="PPOSettings.target_kl must be > 0 or None, got 0"):
        train_ppo(policy, envs, dataclasses.replace(settings, target_kl=0), seed=0)


@pytest.mark.slow  # the example script in a subprocess
def test_example_runs_from_the_command_line(tmp_path):
    pytest.importorskip("popgym")
    output = tmp_path / "curves.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "rl_memory.py"),
            "--tasks",
            "txv/ProofOfMemory-v0",
            "RepeatFirstEasy",
            "--agents",
            "gtrxl",
            "gru",
            "--total-steps",
            "512",
            "--num-envs",
            "4",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| RepeatFirstEasy | gtrxl |" in result.stdout and output.exists()
