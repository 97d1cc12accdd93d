"""hf_txvariants.rl policies in users' hands: save_pretrained / from_pretrained / push_to_hub (JSON config with the
spaces, safetensors weights, never a pickle), predict() one step at a time from numpy, and the evaluation script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")

from hf_txvariants.rl import (  # noqa: E402
    MemoryPolicy,
    PPOSettings,
    ProofOfMemoryEnv,
    make_vector_env,
    space_from_dict,
    space_to_dict,
    train_ppo,
)
from hf_txvariants.rl.evaluate import evaluate_policy  # noqa: E402
from tiny_configs import tiny_policy_gtrxl  # noqa: E402

BOX_OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
ACTION_SPACES = {
    "discrete": gym.spaces.Discrete(3, start=1),
    "multi_discrete": gym.spaces.MultiDiscrete([3, 2], start=[1, 0]),
    "box": gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, np.inf], np.float32)),
}


def build(kind, observation_space, action_space):
    """A tiny policy of `kind`, with an episode clock if `kind` ends in "+clock"."""
    clock = kind.endswith("+clock")
    kind = kind.removesuffix("+clock")
    if kind in ("gtrxl", "trxl_i", "gtrxl_no_memory"):
        fields = {"gate_type": "trxl_i" if kind == "trxl_i" else "gru"}
        if kind == "gtrxl_no_memory":
            fields["mem_len"] = 0
        return MemoryPolicy.gtrxl(observation_space, action_space, tiny_policy_gtrxl(**fields), episode_clock=clock)
    return getattr(MemoryPolicy, kind)(observation_space, action_space, 16, episode_clock=clock)


def perturb(policy):
    """Moves every parameter off its initial value (zero biases, log-std...), so a lost tensor would show."""
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return policy


def run_steps(policy, observations, starts):
    """Acts through `observations [steps, envs, ...]` from a fresh state; returns every step's outputs."""
    state, outputs = policy.initial_state(observations.shape[1]), []
    for t in range(observations.shape[0]):
        torch.manual_seed(t)  # the same sampling noise for both policies
        step = policy.act(observations[t], state, starts[t])
        outputs.append((step.actions, step.log_probs, step.values))
        state = step.state
    return outputs, policy.snapshot(state)


@pytest.mark.exact
@pytest.mark.parametrize("action", sorted(ACTION_SPACES))
@pytest.mark.parametrize("kind", ["gtrxl", "trxl_i", "gtrxl_no_memory", "gru", "mlp", "gtrxl+clock", "gru+clock"])
def test_saved_policy_reloads_and_acts_identically(kind, action, tmp_path):
    torch.manual_seed(0)
    policy = perturb(build(kind, BOX_OBS, ACTION_SPACES[action])).eval()
    files = policy.save_pretrained(tmp_path / "policy")
    assert files == ["config.json", "model.safetensors"]
    loaded = MemoryPolicy.from_pretrained(tmp_path / "policy").eval()
    assert loaded.observation_space == policy.observation_space and loaded.action_space == policy.action_space
    assert loaded.state_dict().keys() == policy.state_dict().keys()
    observations = torch.randn(9, 2, 3)
    starts = torch.zeros(9, 2, dtype=torch.bool)
    starts[0], starts[5, 1] = True, True
    expected, expected_state = run_steps(policy, observations, starts)
    got, got_state = run_steps(loaded, observations, starts)
    for (actions, log_probs, values), (actions_2, log_probs_2, values_2) in zip(expected, got):
        assert torch.equal(actions, actions_2) and torch.equal(log_probs, log_probs_2) and torch.equal(values, values_2)
    assert expected_state.keys() == got_state.keys()
    assert all(torch.equal(expected_state[k], got_state[k]) for k in expected_state)


def test_config_json_holds_the_body_and_the_spaces_and_weights_are_safetensors(tmp_path):
    policy = build("trxl_i", gym.spaces.MultiDiscrete([2, 3]), ACTION_SPACES["box"])
    policy.save_pretrained(tmp_path / "policy")
    config = json.loads((tmp_path / "policy" / "config.json").read_text())
    assert config["format"] == "hf_txvariants.rl.MemoryPolicy" and config["format_version"] == 1
    assert config["body"]["kind"] == "gtrxl" and config["body"]["config"]["gate_type"] == "trxl_i"
    assert config["body"]["config"]["mem_len"] == 6
    assert config["observation_space"] == {"type": "MultiDiscrete", "nvec": [2, 3], "start": [0, 0], "dtype": "int64"}
    assert config["action_space"]["high"] == [1.0, "inf"]  # JSON has no infinity: written as a string
    from safetensors import safe_open

    with safe_open(str(tmp_path / "policy" / "model.safetensors"), "pt") as weights:
        assert set(weights.keys()) == set(policy.state_dict())


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(5, start=-2),
        gym.spaces.MultiDiscrete([4, 2, 7], start=[1, 0, -3]),
        gym.spaces.Box(-np.inf, np.inf, shape=(2, 3), dtype=np.float64),
        gym.spaces.Box(np.array([0.0, -0.5], np.float32), np.array([1.0, np.inf], np.float32)),
        gym.spaces.Box(0, 255, shape=(4,), dtype=np.uint8),
    ],
    ids=str,
)
def test_spaces_survive_json(space):
    data = json.loads(json.dumps(space_to_dict(space), allow_nan=False))  # strict JSON
    restored = space_from_dict(data)
    assert restored == space and type(restored) is type(space) and restored.dtype == space.dtype


def test_bad_spaces_and_configs_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"cannot save a Dict space .*supported: Discrete, MultiDiscrete, Box"):
        space_to_dict(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}))
    with pytest.raises(ValueError, match="cannot read a saved 'Tuple' space"):
        space_from_dict({"type": "Tuple"})
    with pytest.raises(ValueError, match="the saved Discrete space has no 'start' field"):
        space_from_dict({"type": "Discrete", "n": 3})
    with pytest.raises(ValueError, match="space dtype 'object' is not supported"):
        space_from_dict({"type": "Box", "shape": [1], "dtype": "object", "low": [0], "high": [1]})
    with pytest.raises(ValueError, match="'high' holds 1 values, expected 2"):
        space_from_dict({"type": "Box", "shape": [2], "dtype": "float32", "low": [0, 0], "high": [1]})
    with pytest.raises(ValueError, match="holds 'nan'"):
        space_from_dict({"type": "Box", "shape": [1], "dtype": "float32", "low": ["nan"], "high": [1]})
    folder = tmp_path / "policy"
    build("gru", BOX_OBS, ACTION_SPACES["discrete"]).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "body": {"kind": "lstm"}}))
    with pytest.raises(ValueError, match="the saved body must name one of gtrxl, gru, mlp as its 'kind'"):
        MemoryPolicy.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "txv_gtrxl"}))
    with pytest.raises(ValueError, match="not a saved MemoryPolicy config"):
        MemoryPolicy.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no model.safetensors"):
        MemoryPolicy.from_pretrained(folder)


def test_a_failed_save_leaves_no_half_written_folder(tmp_path):
    policy = build("gru", BOX_OBS, ACTION_SPACES["discrete"])
    with mock.patch("safetensors.torch.save_file", side_effect=OSError("disk full")), pytest.raises(OSError):
        policy.save_pretrained(tmp_path / "new")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling
    policy.save_pretrained(tmp_path / "old")
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}
    other = build("gru", BOX_OBS, ACTION_SPACES["box"])
    with mock.patch("safetensors.torch.save_file", side_effect=OSError("disk full")), pytest.raises(OSError):
        other.save_pretrained(tmp_path / "old")
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["old"]


def test_a_policy_refuses_an_environment_with_other_spaces(tmp_path):
    build("gru", gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32), gym.spaces.Discrete(2)).save_pretrained(
        tmp_path / "policy"
    )
    policy = MemoryPolicy.from_pretrained(tmp_path / "policy")
    envs = make_vector_env("txv/ProofOfMemory-v0", 2, seed=0)
    both = (
        r"built for observation space Box\(-1.0, 1.0, \(4,\), float32\) and action space Discrete\(2\), but the "
        r"environment has observation space Box\(-1.0, 1.0, \(3,\), float32\) and action space Discrete\(2\)"
    )
    with pytest.raises(ValueError, match=both):
        train_ppo(policy, envs, PPOSettings(total_steps=64, rollout_steps=16, segment_length=8, minibatches=1))
    with pytest.raises(ValueError, match=both):
        evaluate_policy(policy, envs, episodes=2)


def test_predict_steps_like_act_from_numpy_and_leaves_the_given_state_alone():
    torch.manual_seed(0)
    policy = perturb(build("gtrxl", BOX_OBS, ACTION_SPACES["box"])).eval()
    observations = np.random.default_rng(0).standard_normal((6, 2, 3)).astype(np.float32)
    starts = np.zeros((6, 2), dtype=bool)
    starts[3, 0] = True
    state, memory = None, policy.initial_state(2)
    for t in range(6):
        actions, new_state = policy.predict(observations[t], state, None if t == 0 else starts[t], deterministic=True)
        step = policy.act(observations[t], memory, np.ones(2, bool) if t == 0 else starts[t], greedy=True)
        memory = step.state
        assert isinstance(actions, np.ndarray) and all(isinstance(v, np.ndarray) for v in new_state.values())
        # not bit for bit: predict's memory is restored from a stacked copy, whose layout may change the kernels' order
        np.testing.assert_allclose(actions, np.clip(step.actions.numpy(), [-1.0, 0.0], [1.0, np.inf]), atol=1e-6)
        assert actions.dtype == np.float32
        reference = policy.snapshot(memory)
        for name in reference:
            np.testing.assert_allclose(new_state[name], reference[name].numpy(), atol=1e-6)
        if state is not None:
            copy = {k: v.copy() for k, v in state.items()}
            policy.predict(observations[t], state, starts[t])
            assert all(np.array_equal(copy[k], state[k]) for k in copy)  # the state passed in is not modified
        state = new_state
    single, single_state = policy.predict(observations[0, 0], deterministic=True)
    assert single.shape == (2,) and single_state["memory"].shape[0] == 1
    with pytest.raises(ValueError, match=r"state\['memory'\] has shape \(2, 2, 6, 16\), expected 3 envs first"):
        policy.predict(np.zeros((3, 3), np.float32), state)
    with pytest.raises(ValueError, match="episode_start has 3 entries for 2 observations"):
        policy.predict(observations[0], state, np.ones(3, bool))


@pytest.mark.exact
def test_push_to_hub_uploads_config_weights_and_card_without_network(tmp_path):
    policy = build("gtrxl", BOX_OBS, ACTION_SPACES["discrete"])
    uploaded = {}

    def upload_folder(*, repo_id, folder_path, repo_type, commit_message, revision=None, create_pr=False):
        uploaded["files"] = sorted(p.name for p in Path(folder_path).iterdir())
        uploaded["card"] = (Path(folder_path) / "README.md").read_text()
        uploaded["loaded"] = MemoryPolicy.from_pretrained(folder_path)
        return "https://huggingface.co/me/gtrxl-pom/commit/0"

    api = mock.Mock()
    api.upload_folder.side_effect = upload_folder
    result = policy.push_to_hub("me/gtrxl-pom", task="txv/ProofOfMemory-v0", mean_return=0.97, api=api)
    api.create_repo.assert_called_once_with("me/gtrxl-pom", private=False, exist_ok=True, repo_type="model")
    assert result.endswith("/commit/0")
    assert uploaded["files"] == ["README.md", "config.json", "model.safetensors"]
    from huggingface_hub import ModelCard

    card = ModelCard(uploaded["card"])
    assert "reinforcement-learning" in card.data.tags and "gtrxl" in card.data.tags
    assert card.data.library_name == "hf-txvariants"
    assert card.data.eval_results[0].metric_type == "mean_reward" and card.data.eval_results[0].metric_value == 0.97
    assert 'MemoryPolicy.from_pretrained("me/gtrxl-pom")' in card.text
    assert all(
        torch.equal(a, b) for a, b in zip(uploaded["loaded"].state_dict().values(), policy.state_dict().values())
    )


@pytest.mark.exact
def test_from_pretrained_by_repo_id_from_the_hub_cache_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from hf_txvariants.hub import snapshot_into_cache

    policy = build("gru", BOX_OBS, ACTION_SPACES["multi_discrete"])
    policy.save_pretrained(tmp_path / "repo")
    snapshot_into_cache(tmp_path / "repo", "me/gru-policy", tmp_path / "cache")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    loaded = MemoryPolicy.from_pretrained("me/gru-policy", cache_dir=tmp_path / "cache")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), policy.state_dict().values()))


def test_evaluate_policy_counts_each_envs_share_of_episodes():
    """A policy that always goes right on the proof-of-memory task: +1 when the goal is right, -1 otherwise."""
    envs = make_vector_env("txv/ProofOfMemory-v0", 3, seed=0)
    policy = build("mlp", envs.single_observation_space, envs.single_action_space)
    with torch.no_grad():
        policy.policy_head.weight.zero_()
        policy.policy_head.bias.copy_(torch.tensor([0.0, 10.0]))
    returns = evaluate_policy(policy, envs, episodes=10, seed=0)
    assert len(returns) == 10 and set(returns) <= {-1.0, 1.0} and len(set(returns)) == 2
    expected = []  # the same episodes played one env at a time (env i plays (10 + i) // 3 of them)
    for i, count in enumerate((10 + i) // 3 for i in range(3)):
        env = ProofOfMemoryEnv()
        env.reset(seed=i)  # SyncVectorEnv seeds env i with seed + i
        for _ in range(count):
            expected.append(1.0 if env.goal_is_right else -1.0)
            env.reset()
    assert sorted(returns) == sorted(expected)


@pytest.mark.slow  # the evaluation script in a subprocess
def test_evaluate_script_prints_the_mean_return(tmp_path):
    envs = make_vector_env("txv/ProofOfMemory-v0", 4, seed=0)
    policy = build("gru", envs.single_observation_space, envs.single_action_space)
    policy.save_pretrained(tmp_path / "policy")
    expected = np.mean(evaluate_policy(MemoryPolicy.from_pretrained(tmp_path / "policy"), envs, episodes=12, seed=3))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_txvariants.rl.evaluate",
            "--policy",
            str(tmp_path / "policy"),
            "--task",
            "txv/ProofOfMemory-v0",
            "--episodes",
            "12",
            "--num-envs",
            "4",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"txv/ProofOfMemory-v0: mean return {expected:.4f}" in result.stdout
    assert "over 12 episodes (greedy actions)" in result.stdout
    pytest.importorskip("popgym")
    from hf_txvariants.rl.evaluate import main

    with pytest.raises(SystemExit, match="^error: the policy was built for observation space"):
        main(["--policy", str(tmp_path / "policy"), "--task", "RepeatFirstEasy", "--episodes", "2"])
    with pytest.raises(SystemExit, match="^error: .* has no config.json"):
        main(["--policy", str(tmp_path), "--task", "RepeatFirstEasy", "--episodes", "2"])
