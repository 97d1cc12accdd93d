"""hf_txvariants.rl.sb3: `MemoryPPO`, GTrXL / TrXL-I / GRU in Stable-Baselines3 as SB3 users drive PPO and
sb3-contrib's RecurrentPPO (learn with callbacks, predict with state and episode_start, save / load, DummyVecEnv and
SubprocVecEnv, SB3's logger and TensorBoard, evaluate_policy), learning on stored segments as `train_ppo`, saving in
MemoryPolicy's format, and refusing by name what it cannot take."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")
pytest.importorskip("stable_baselines3")

from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402
from stable_baselines3.common.vec_env import SubprocVecEnv  # noqa: E402

from hf_txvariants.rl import MemoryPolicy, PPOSettings, make_env, make_policy, make_vector_env, train_ppo  # noqa: E402
from hf_txvariants.rl.sb3 import MemoryPPO, ppo_arguments  # noqa: E402
from tiny_configs import tiny_policy_gtrxl_fields  # noqa: E402

TINY_GTRXL = tiny_policy_gtrxl_fields()
TASK = "txv/ProofOfMemory-v0"
SMALL = dict(n_steps=16, segment_length=8, batch_size=16, n_epochs=2, device="cpu", seed=0)


def proof_of_memory():
    return make_env(TASK)


def vec_env(n_envs=2, seed=0):
    return make_vec_env(proof_of_memory, n_envs=n_envs, seed=seed)


def tiny_model(agent="gtrxl", env=None, **kwargs) -> MemoryPPO:
    return MemoryPPO(
        agent, env if env is not None else vec_env(), policy_kwargs=dict(TINY_GTRXL), **{**SMALL, **kwargs}
    )


def weights(module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def assert_same_weights(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


class CountSteps(BaseCallback):
    """Counts the callback's calls and stops training after `stop_after` steps when given."""

    def __init__(self, stop_after=None):
        super().__init__()
        self.calls, self.rollouts, self.stop_after = 0, 0, stop_after

    def _on_step(self) -> bool:
        self.calls += 1
        return self.stop_after is None or self.calls < self.stop_after

    def _on_rollout_end(self) -> None:
        self.rollouts += 1


@pytest.mark.parametrize("agent", ["gtrxl", "trxl_i", "gru"])
def test_learn_with_a_callback_moves_the_weights_of_each_body(agent):
    """learn() runs SB3's loop with the body of `make_policy(agent)`: the callback is called at every vector step and
    at every rollout's end, num_timesteps counts every env's steps, and the update moves the weights."""
    model = tiny_model(agent)
    assert model.memory_policy.body.kind == ("gru" if agent == "gru" else "gtrxl")
    before = weights(model.memory_policy)
    callback = CountSteps()
    model.learn(64, callback=callback)
    assert model.num_timesteps == 64 and callback.calls == 32 and callback.rollouts == 2
    after = weights(model.memory_policy)
    assert max(float((before[name] - after[name]).abs().max()) for name in before) > 1e-4
    assert model.history.steps == [32, 64] and len(model.history.epochs_run) == 2


def test_a_callback_returning_false_stops_learning():
    model = tiny_model()
    callback = CountSteps(stop_after=5)
    model.learn(1_000, callback=callback)
    assert callback.calls == 5 and model.num_timesteps == 10


@pytest.mark.parametrize("agent", ["gtrxl", "gru"])
def test_learning_on_a_stored_segment_sees_what_acting_saw(agent):
    """After a rollout, each stored segment re-run from the snapshot taken when acting reached it (episode starts
    inside it included) gives the log-probabilities and values computed while acting, one step at a time."""
    model = tiny_model(agent, env=vec_env(3))
    _, callback = model._setup_learn(48)
    assert model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)
    buffer = model.rollout_buffer
    assert buffer.episode_starts[1:].any()  # episodes end inside the rollout (proof of memory: at most 16 steps)
    segments = buffer.segments(model.segment_length)
    policy = model.memory_policy
    policy.eval()
    state = policy.restore(
        {name[len("snapshot:") :]: v for name, v in segments.items() if name.startswith("snapshot:")}
    )
    with torch.no_grad():
        log_probs, _, values = policy.evaluate_actions(
            segments["observations"], state, segments["episode_starts"], segments["actions"]
        )
    torch.testing.assert_close(log_probs, segments["log_probs"], atol=1e-5, rtol=1e-5)
    stored_values = torch.as_tensor(buffer.values).reshape(2, 8, 3).transpose(1, 2).reshape(6, 8)
    torch.testing.assert_close(values, stored_values, atol=1e-5, rtol=1e-5)


def test_predict_carries_the_memory_in_its_state_and_forgets_it_at_an_episode_start():
    """predict(obs, state, episode_start, deterministic) steps as MemoryPolicy.act with the memory carried: the state
    it returns, passed back, continues the memory; episode_start=True (or state=None) starts it afresh."""
    model = tiny_model()
    policy = model.memory_policy
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    policy.eval()
    observations = np.random.default_rng(0).uniform(-1, 1, size=(5, 2, 3)).astype(np.float32)
    state, memory = None, policy.initial_state(2)
    starts = torch.ones(2, dtype=torch.bool)
    for t in range(5):
        actions, state = model.predict(observations[t], state, np.array([t == 0] * 2), deterministic=True)
        step = policy.act(observations[t], memory, starts, greedy=True)
        memory, starts = step.state, torch.zeros(2, dtype=torch.bool)
        np.testing.assert_array_equal(actions, step.actions.numpy())
    assert set(state) == {"memory", "memory_mask"} and state["memory"].shape[0] == 2
    _, carried = model.predict(observations[0], state, np.array([False, False]), deterministic=True)
    _, fresh = model.predict(observations[0], state, np.array([True, True]), deterministic=True)
    _, none = model.predict(observations[0], None, None, deterministic=True)

    def next_values(state):  # what the memory in `state` makes of the next observation
        memory = policy.restore({name: torch.as_tensor(value) for name, value in state.items()})
        return policy.act(observations[1], memory, torch.zeros(2, dtype=torch.bool)).values

    torch.testing.assert_close(next_values(fresh), next_values(none), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(next_values(carried), next_values(fresh), atol=1e-4)


def test_save_and_load_round_trip_and_learning_goes_on(tmp_path):
    """save() writes SB3's file; load() gives back the weights, the optimiser's state, the counters and the
    settings, predicts the same, and learns on with reset_num_timesteps=False."""
    model = tiny_model()
    model.learn(32)
    model.save(tmp_path / "model.zip")
    loaded = MemoryPPO.load(tmp_path / "model.zip", env=vec_env(), device="cpu")
    assert_same_weights(weights(model.policy), weights(loaded.policy))
    assert loaded.num_timesteps == 32 and loaded.segment_length == 8 and loaded.batch_size == 16
    assert loaded.policy.optimizer.state_dict()["state"].keys() == model.policy.optimizer.state_dict()["state"].keys()
    observations = np.zeros((2, 3), np.float32)
    np.testing.assert_array_equal(
        model.predict(observations, deterministic=True)[0], loaded.predict(observations, deterministic=True)[0]
    )
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.num_timesteps == 64


def test_the_saved_policy_is_memory_policys_format_both_ways(tmp_path):
    """save_pretrained() writes MemoryPolicy's format (from_pretrained gives back every weight), and a MemoryPolicy
    saved after train_ppo loads into MemoryPPO (as a folder, through load(), or as the policy itself) without
    conversion, trains on and saves again."""
    model = tiny_model()
    model.learn(32)
    assert model.save_pretrained(tmp_path / "sb3") == ["config.json", "model.safetensors"]
    assert_same_weights(weights(model.memory_policy), weights(MemoryPolicy.from_pretrained(tmp_path / "sb3")))

    envs = make_vector_env(TASK, 2, seed=0)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space, **TINY_GTRXL)
    train_ppo(policy, envs, PPOSettings(total_steps=64, rollout_steps=16, segment_length=8, minibatches=2), seed=0)
    policy.save_pretrained(tmp_path / "train_ppo")
    trained = weights(policy)
    for loaded in (
        MemoryPPO(tmp_path / "train_ppo", vec_env(), **SMALL),
        MemoryPPO.load(tmp_path / "train_ppo", env=vec_env(), **SMALL),
        MemoryPPO.from_pretrained(tmp_path / "train_ppo", vec_env(), **SMALL),
        MemoryPPO(policy, vec_env(), **SMALL),
    ):
        assert_same_weights(trained, weights(loaded.memory_policy))
    loaded.learn(32)
    loaded.save_pretrained(tmp_path / "again")
    assert MemoryPolicy.from_pretrained(tmp_path / "again").to_config() == policy.to_config()


def test_subproc_vec_env_trains():
    envs = SubprocVecEnv([proof_of_memory, proof_of_memory], start_method="fork")
    try:
        model = tiny_model(env=envs)
        model.learn(32)
        assert model.num_timesteps == 32 and model.n_envs == 2
    finally:
        envs.close()


def test_the_logger_records_ppos_keys_and_writes_tensorboard(tmp_path):
    """SB3's logger gets PPO's keys (rollout/, time/, train/) and the MMER once the window of returns is full;
    tensorboard_log writes an event file."""
    model = tiny_model(stats_window_size=2, tensorboard_log=str(tmp_path / "tb"))
    model.learn(64, tb_log_name="run")
    assert list((tmp_path / "tb").glob("run_1/events.out.tfevents.*"))
    model = tiny_model(stats_window_size=2)
    logger = configure(None, ["csv"])
    model.set_logger(logger)
    recorded = {}
    original = logger.record

    def record(key, value, exclude=None):
        recorded[key] = value
        original(key, value, exclude)

    logger.record = record
    model.learn(64)
    expected = {
        "rollout/ep_rew_mean", "rollout/ep_len_mean", "rollout/mmer", "time/fps", "time/total_timesteps",
        "train/entropy_loss", "train/policy_gradient_loss", "train/value_loss", "train/approx_kl",
        "train/clip_fraction", "train/loss", "train/explained_variance", "train/learning_rate", "train/n_updates",
        "train/clip_range",
    }  # fmt: skip
    assert expected <= set(recorded), expected - set(recorded)
    assert recorded["rollout/mmer"] == model.history.mmer


def test_evaluate_policy_runs_the_model_with_its_memory():
    model = tiny_model()
    mean, std = evaluate_policy(model, vec_env(2, seed=1), n_eval_episodes=4, deterministic=True)
    assert -1.0 <= mean <= 1.0 and std >= 0


def test_ppo_arguments_carry_train_ppos_settings():
    settings = PPOSettings(rollout_steps=128, segment_length=64, minibatches=4, final_learning_rate=0.0)
    arguments = ppo_arguments(settings, num_envs=16)
    assert arguments["n_steps"] == 128 and arguments["segment_length"] == 64 and arguments["batch_size"] == 512
    assert arguments["learning_rate"](1.0) == settings.learning_rate and arguments["learning_rate"](0.0) == 0.0
    assert arguments["ent_coef"] == settings.entropy_coef
    model = MemoryPPO("gru", vec_env(), policy_kwargs=dict(TINY_GTRXL), device="cpu", **ppo_arguments(
        PPOSettings(rollout_steps=16, segment_length=8, minibatches=2), num_envs=2))  # fmt: skip
    assert model.batch_size == 16 and model.n_epochs == settings.epochs


def test_spaces_and_settings_it_cannot_take_are_refused_by_name():
    class MultiBinaryActions(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        action_space = gym.spaces.MultiBinary(2)

    class DictObservations(gym.Env):
        observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)})
        action_space = gym.spaces.Discrete(2)

    with pytest.raises(ValueError, match="action_space .*MultiBinary.* not taken by MemoryPPO"):
        MemoryPPO("gtrxl", MultiBinaryActions(), device="cpu")
    with pytest.raises(ValueError, match="observation_space .*Dict.* not taken by MemoryPPO"):
        MemoryPPO("gtrxl", DictObservations(), device="cpu")
    with pytest.raises(ValueError, match="n_steps .* multiple of segment_length"):
        tiny_model(n_steps=12)
    with pytest.raises(ValueError, match="batch_size .* multiple of segment_length"):
        tiny_model(batch_size=12)
    with pytest.raises(ValueError, match="policy must be one of gtrxl, trxl_i, gru, mlp"):
        MemoryPPO("MlpLstmPolicy", vec_env(), device="cpu")
    with pytest.raises(ValueError, match="policy_kwargs .* would not be read"):
        MemoryPPO(tiny_model().memory_policy, vec_env(), policy_kwargs={"mem_len": 4}, device="cpu")


def test_only_rl_sb3_imports_stable_baselines3_and_nothing_imports_it():
    package = Path(__file__).resolve().parents[1] / "hf_txvariants"
    sb3 = package / "rl" / "sb3.py"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                third_party = name.split(".")[0] in ("stable_baselines3", "sb3_contrib")
                if (third_party and path != sb3) or name.split(".")[-1] == "sb3":
                    offenders.append(f"{path.relative_to(package)}: {name}")
    assert offenders == []


class CueEnv(gym.Env):
    """A tiny env of any action space: a cue on the first step, rewarded at the end for the first action's sign."""

    def __init__(self, action_space, observation_space=None):
        self.action_space = action_space
        self.observation_space = observation_space or gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.t = 0

    def _observation(self):
        return self.observation_space.sample() if self.t else self.observation_space.sample() * 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, dtype=self.action_space.dtype)), action
        self.t += 1
        return self._observation(), float(np.sum(action)), self.t >= 5, False, {}


@pytest.mark.parametrize(
    "action_space, observation_space",
    [
        (gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32)), None),
        (gym.spaces.MultiDiscrete([3, 2], start=[1, 0]), gym.spaces.Discrete(4)),
        (gym.spaces.Discrete(3, start=2), gym.spaces.MultiDiscrete([2, 3])),
    ],
    ids=["box", "multi_discrete+discrete_obs", "discrete_from_2+multi_discrete_obs"],
)
def test_every_space_of_memory_policy_learns_and_predicts(action_space, observation_space):
    """MemoryPolicy's other spaces through SB3's buffer: Box actions (stepped clipped, stored unclipped),
    MultiDiscrete and Discrete actions not counted from 0, Discrete and MultiDiscrete observations."""
    env = make_vec_env(lambda: CueEnv(action_space, observation_space), n_envs=2, seed=0)
    model = MemoryPPO("gtrxl", env, policy_kwargs=dict(TINY_GTRXL, episode_clock=True), **SMALL)
    model.learn(32)
    actions, state = model.predict(env.reset(), deterministic=True)
    assert all(action_space.contains(np.asarray(a, dtype=action_space.dtype)) for a in actions)
    assert "episode_steps" in state and model.num_timesteps == 32


@pytest.mark.exact
def test_memory_ppo_is_train_ppo_update_for_update():
    """The same PPO maths, the same draws: from the same initial weights, on the same envs and seed, with torch seeded
    before `learn` as `train_ppo` seeds it, MemoryPPO ends with exactly the weights train_ppo ends with, and the same
    episodes and mean returns (two updates of two epochs over minibatches of stored segments, episodes ending inside
    them)."""
    import copy

    settings = PPOSettings(
        total_steps=128, rollout_steps=32, segment_length=16, minibatches=2, epochs=2, return_window=4
    )
    envs = make_vector_env(TASK, 2, seed=0)
    torch.manual_seed(0)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space, **TINY_GTRXL)
    start = copy.deepcopy(policy)
    history = train_ppo(policy, envs, settings, seed=0)
    model = MemoryPPO(start, vec_env(2, seed=0), seed=0, device="cpu", **ppo_arguments(settings, num_envs=2))
    torch.manual_seed(0)
    model.learn(settings.total_steps)
    assert_same_weights(weights(policy), weights(model.memory_policy))
    assert not torch.equal(weights(start)["policy_head.weight"], weights(policy)["policy_head.weight"])
    assert model.history.steps == history.steps and model.history.episodes == history.episodes > 0
    assert model.history.mean_returns == history.mean_returns
