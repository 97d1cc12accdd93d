"""hf_txvariants.rl.rllib: GTrXL, TrXL-I and the GRU as the memory of an RLlib PPO agent (RLModule, Learner,
EnvRunner), acting as RLlib drives it, learning on stored segments, trained by RLlib's PPO, and refusing what it cannot
take by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")
pytest.importorskip("ray.rllib")

from ray.rllib.core.columns import Columns  # noqa: E402

from hf_txvariants.rl import MemoryPolicy, PPOSettings, make_policy  # noqa: E402
from hf_txvariants.rl.rllib import (  # noqa: E402
    CarriedMemory,
    MemoryRLModule,
    check_model_config,
    memory_module_spec,
    ppo_training_settings,
)
from tiny_configs import tiny_policy_gtrxl_fields  # noqa: E402

TINY_GTRXL = tiny_policy_gtrxl_fields()
BOX_OBS = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
ACTIONS = {"discrete": gym.spaces.Discrete(3), "multi_discrete": gym.spaces.MultiDiscrete([3, 2])}


def build_module(kind, action_space=ACTIONS["discrete"], observation_space=BOX_OBS, **config) -> MemoryRLModule:
    """A tiny module of `kind` ("gtrxl", "trxl_i", "gru", "+clock" for an episode clock), weights moved off their
    initial values (zero biases would hide a lost tensor)."""
    body = kind.removesuffix("+clock")
    fields = {**TINY_GTRXL, "episode_clock": kind.endswith("+clock"), **config}
    module = memory_module_spec(body, observation_space, action_space, **fields).build()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return module


def batch_of(states: list[dict]) -> dict[str, torch.Tensor]:
    """Per-row states (numpy arrays, as RLlib keeps them in its episodes) stacked into a STATE_IN batch."""
    return {name: torch.as_tensor(np.stack([state[name] for state in states])) for name in states[0]}


def act_as_rllib(module, observations, episode_starts):
    """Acts through `observations [steps, rows, ...]` as RLlib's env runner does: one call per step, each row's
    STATE_IN its last STATE_OUT (kept as numpy arrays), or `get_initial_state()` where an episode starts. Returns the
    distribution inputs `[rows, steps, ...]` and every step's per-row STATE_IN."""
    steps, rows = episode_starts.shape
    states, outputs, states_in = [None] * rows, [], []
    for t in range(steps):
        for row in range(rows):
            if episode_starts[t, row]:
                states[row] = module.get_initial_state()
        states_in.append(list(states))
        out = module.forward_exploration({Columns.OBS: observations[t][:, None], Columns.STATE_IN: batch_of(states)})
        outputs.append(out[Columns.ACTION_DIST_INPUTS][:, 0])
        state_out = {name: value.numpy() for name, value in out[Columns.STATE_OUT].items()}
        states = [{name: value[row].copy() for name, value in state_out.items()} for row in range(rows)]
    return torch.stack(outputs, 1), states_in


@pytest.mark.parametrize(
    "kind, action",
    [(kind, "discrete") for kind in ("gtrxl", "trxl_i", "gru", "gtrxl+clock", "gru+clock")]
    + [("gtrxl", "multi_discrete")],
)
def test_learning_on_a_stored_segment_sees_what_acting_saw(kind, action):
    """RLlib's Learner re-runs each segment of an episode (at most max_seq_len steps, zero-padded) from the STATE_OUT
    stored when acting reached its start (the initial state at an episode's first step): the distribution inputs equal
    those computed while acting, one step per call, across calls whose memory the module carried (`CarriedMemory`)
    and calls whose memory it rebuilt from STATE_IN."""
    torch.manual_seed(0)
    module = build_module(kind, ACTIONS[action])
    steps, rows = 14, 2
    observations = torch.rand(steps, rows, 3) * 2 - 1
    starts = torch.zeros(steps, rows, dtype=torch.bool)
    starts[0] = True
    starts[5, 0] = True  # row 0: episodes of 5 and 9 steps; row 1: one episode, beyond mem_len (6)
    resumed, resume = [], module.carried.resume
    module.carried.resume = lambda *args: resumed.append(resume(*args)) or resumed[-1]
    carried, states_in = act_as_rllib(module, observations, starts)
    # every call after the first went on from the carried memory, row 0 starting its second episode at step 5
    assert resumed[0] is None and all(r is not None for r in resumed[1:])
    assert [r[1].tolist() for r in resumed[1:]] == [[t == 5, False] for t in range(1, steps)]
    rebuilt = []
    for t in range(steps):  # the same calls, the carried memory forgotten before each
        module.carried = CarriedMemory()
        batch = {Columns.OBS: observations[t][:, None], Columns.STATE_IN: batch_of(states_in[t])}
        rebuilt.append(module.forward_exploration(batch)[Columns.ACTION_DIST_INPUTS][:, 0])
    torch.testing.assert_close(carried, torch.stack(rebuilt, 1), atol=1e-5, rtol=1e-5)

    # learning segments of max_seq_len 4 as RLlib cuts them: (row, first step, steps), within one episode each
    segments = [(0, 0, 4), (0, 4, 1), (0, 5, 4), (0, 9, 4), (0, 13, 1), (1, 0, 4), (1, 4, 4), (1, 8, 4), (1, 12, 2)]
    length = 4
    observations_in = torch.zeros(len(segments), length, 3)
    mask = torch.zeros(len(segments), length, dtype=torch.bool)
    for i, (row, first, count) in enumerate(segments):
        observations_in[i, :count] = observations[first : first + count, row]
        mask[i, :count] = True
    batch = {
        Columns.OBS: observations_in,
        Columns.LOSS_MASK: mask,
        Columns.STATE_IN: batch_of([states_in[first][row] for row, first, _ in segments]),
    }
    module.train()
    learned = module.forward_train(batch)
    for i, (row, first, count) in enumerate(segments):
        torch.testing.assert_close(
            learned[Columns.ACTION_DIST_INPUTS][i, :count], carried[row, first : first + count], atol=1e-5, rtol=1e-5
        )
    values = module.compute_values(batch, embeddings=learned[Columns.EMBEDDINGS])
    torch.testing.assert_close(values, module.compute_values(batch))  # the same pass, run again
    assert values.shape == (len(segments), length)


def test_the_carried_memory_follows_the_weights_rllib_syncs_in():
    """After `set_state` (how RLlib moves the Learner's weights to an env runner) the module goes on from its carried
    memory with the new weights: the same outputs as from the memory rebuilt from STATE_IN."""
    torch.manual_seed(0)
    module, learner = build_module("gtrxl"), build_module("gtrxl")
    observations = torch.rand(10, 2, 3) * 2 - 1
    starts = torch.zeros(10, 2, dtype=torch.bool)
    starts[0] = True
    _, states_in = act_as_rllib(module, observations[:8], starts[:8])
    step = {Columns.OBS: observations[7][:, None], Columns.STATE_IN: batch_of(states_in[7])}
    module.carried = CarriedMemory()  # carry the memory of step 7 from here on
    state_out = {k: v.numpy() for k, v in module.forward_exploration(step)[Columns.STATE_OUT].items()}
    module.set_state(learner.get_state())
    following = {
        Columns.OBS: observations[8][:, None],
        Columns.STATE_IN: batch_of(
            [{name: value[row].copy() for name, value in state_out.items()} for row in range(2)]
        ),
    }
    assert module.carried.resume(following[Columns.STATE_IN], module.initial_state_tensors) is not None
    carried = module.forward_exploration(following)[Columns.ACTION_DIST_INPUTS]
    module.carried = CarriedMemory()
    rebuilt = module.forward_exploration(following)[Columns.ACTION_DIST_INPUTS]
    torch.testing.assert_close(carried, rebuilt, atol=1e-5, rtol=1e-5)
    learner.carried = CarriedMemory()
    torch.testing.assert_close(learner.forward_exploration(following)[Columns.ACTION_DIST_INPUTS], rebuilt)


def test_an_episode_start_forgets_the_past_and_the_memory_carries_it_otherwise():
    """The initial state (what RLlib gives a new episode) acts like a fresh module whatever the row saw before; a row
    that goes on from its STATE_OUT remembers (GTrXL)."""
    torch.manual_seed(0)
    module = build_module("gtrxl")
    history = torch.rand(4, 2, 3) * 2 - 1
    history[:, 1] = -history[:, 0]
    starts = torch.zeros(4, 2, dtype=torch.bool)
    starts[0] = True
    _, states_in = act_as_rllib(module, torch.cat([history, torch.zeros(1, 2, 3)]), torch.cat([starts, starts[1:2]]))
    now = torch.rand(1, 1, 3).expand(2, 1, 3)
    carried = module.forward_exploration({Columns.OBS: now, Columns.STATE_IN: batch_of(states_in[-1])})
    fresh_states = batch_of([module.get_initial_state()] * 2)
    restarted = module.forward_exploration({Columns.OBS: now, Columns.STATE_IN: fresh_states})
    fresh = build_module("gtrxl")
    fresh.load_state_dict(module.state_dict())
    alone = fresh.forward_exploration({Columns.OBS: now[:1], Columns.STATE_IN: batch_of([fresh.get_initial_state()])})
    logits = Columns.ACTION_DIST_INPUTS
    torch.testing.assert_close(restarted[logits], alone[logits].expand(2, 1, 3), atol=1e-5, rtol=1e-5)
    assert (carried[logits][0] - carried[logits][1]).abs().max() > 1e-4


@pytest.mark.exact
def test_the_module_holds_make_policys_network_and_saves_in_memory_policy_format(tmp_path):
    """The module's policy is `make_policy`'s (the GRU matched to the GTrXL's parameters); `save_pretrained` writes
    MemoryPolicy's folder, which `MemoryPolicy.from_pretrained` loads with the same weights."""
    torch.manual_seed(0)
    for body in ("gtrxl", "trxl_i", "gru"):
        module = build_module(body)
        expected = make_policy(body, BOX_OBS, ACTIONS["discrete"], **TINY_GTRXL)
        assert module.policy.num_parameters == expected.num_parameters
        assert module.policy.state_dict().keys() == expected.state_dict().keys()
    module.save_pretrained(tmp_path / "policy")
    loaded = MemoryPolicy.from_pretrained(tmp_path / "policy")
    assert loaded.body.kind == "gru" and loaded.observation_space == BOX_OBS
    for name, tensor in module.policy.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_ppo_training_settings_carry_train_ppos_settings_into_rllib():
    from ray.rllib.algorithms.ppo import PPOConfig

    settings = PPOSettings(total_steps=10_000, rollout_steps=64, segment_length=32, minibatches=2, final_entropy_coef=0)
    config = PPOConfig().training(**ppo_training_settings(settings, num_envs=8))
    assert config.train_batch_size_per_learner == 512 and config.minibatch_size == 256
    assert (config.num_epochs, config.lr, config.gamma, config.lambda_) == (4, 5e-4, 0.99, 0.95)
    assert (config.clip_param, config.vf_loss_coeff, config.grad_clip, config.use_kl_loss) == (0.2, 0.5, 0.5, False)
    assert config.entropy_coeff == [[0, 0.01], [10_000, 0]]
    with pytest.raises(ValueError, match="target_kl"):
        ppo_training_settings(PPOSettings(target_kl=0.015), num_envs=8)


def test_spaces_the_module_cannot_take_are_refused_by_name():
    discrete_obs = gym.spaces.Discrete(4)
    memory_module_spec("gtrxl", discrete_obs, ACTIONS["multi_discrete"], **TINY_GTRXL)  # fine
    refused = {
        "observation_space must be Discrete, MultiDiscrete or Box, got Dict": (
            gym.spaces.Dict({"a": BOX_OBS}),
            ACTIONS["discrete"],
        ),
        r"action_space Discrete\(3, start=1\) does not start at 0": (BOX_OBS, gym.spaces.Discrete(3, start=1)),
        r"action_space MultiDiscrete\(\[3 2\], start=\[1 0\]\) does not start at 0": (
            BOX_OBS,
            gym.spaces.MultiDiscrete([3, 2], start=[1, 0]),
        ),
        r"action_space Box\(-1.0, 1.0, \(2,\), float32\): Box actions are not taken through RLlib": (
            BOX_OBS,
            gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
        ),
    }
    for message, (observation_space, action_space) in refused.items():
        with pytest.raises(ValueError, match=message):
            memory_module_spec("gtrxl", observation_space, action_space, **TINY_GTRXL)


def test_config_keys_the_module_would_not_read_are_refused_by_name():
    with pytest.raises(ValueError, match="model_config key 'memory_len' is not read by MemoryRLModule;"):
        memory_module_spec("gtrxl", BOX_OBS, ACTIONS["discrete"], memory_len=32)
    with pytest.raises(ValueError, match="model_config key 'use_lstm' is not read .*here set body"):
        memory_module_spec("gru", BOX_OBS, ACTIONS["discrete"], use_lstm=True)
    with pytest.raises(ValueError, match="model_config body must be one of gtrxl, trxl_i, gru, got 'mlp'"):
        memory_module_spec("mlp", BOX_OBS, ACTIONS["discrete"])
    with pytest.raises(ValueError, match="max_seq_len must be a positive int, got 0"):
        memory_module_spec("gtrxl", BOX_OBS, ACTIONS["discrete"], max_seq_len=0)
    # RLlib's Learner reads max_seq_len from the module's model_config: the spec always holds it (PPOSettings')
    default = memory_module_spec("gtrxl", BOX_OBS, ACTIONS["discrete"], **TINY_GTRXL).model_config
    assert default["max_seq_len"] == PPOSettings().segment_length == 64
    # what PPOConfig passes by itself is accepted; a key given to PPOConfig.rl_module(model_config=...) is merged into
    # the spec's model_config by RLlib, and refused when the module is built
    assert check_model_config({"body": "gtrxl", "vf_share_layers": False})["fields"] == {}
    from ray.rllib.algorithms.ppo import PPOConfig

    spec = memory_module_spec("gtrxl", BOX_OBS, ACTIONS["discrete"], **TINY_GTRXL)
    config = PPOConfig().rl_module(rl_module_spec=spec, model_config={"fcnet_hiddens": [64]})
    merged = config.get_rl_module_spec(spaces={"default_policy": (BOX_OBS, ACTIONS["discrete"])})
    with pytest.raises(ValueError, match="model_config key 'fcnet_hiddens' is not read by MemoryRLModule"):
        merged.build()


@pytest.mark.slow
@pytest.mark.release_independent
def test_rllib_ppo_trains_two_iterations_with_the_module(tmp_path, monkeypatch):
    """PPO (RLlib's new API stack) with the GTrXL module on the proof-of-memory task: two training iterations sampled
    by a remote env runner (the module built from its spec in another process, its weights synced there), the second
    followed by an evaluation on a local env runner (greedy actions, `forward_inference`); the weights move, every env
    runner holds the Learner's, and the trained policy saves in MemoryPolicy's format."""
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig

    from hf_txvariants.rl import ProofOfMemoryEnv

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local test cluster: no token written under the home folder
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    env = ProofOfMemoryEnv()
    settings = PPOSettings(total_steps=256, rollout_steps=32, segment_length=8, epochs=2, minibatches=2)
    spec = memory_module_spec("gtrxl", env.observation_space, env.action_space, **TINY_GTRXL, max_seq_len=8)
    config = (
        PPOConfig()
        .environment("txv/ProofOfMemory-v0")
        .env_runners(num_env_runners=1, num_envs_per_env_runner=4, num_cpus_per_env_runner=0)
        .learners(num_learners=0)
        .training(**ppo_training_settings(settings, num_envs=4))
        .rl_module(rl_module_spec=spec)
        .evaluation(
            evaluation_interval=2,
            evaluation_num_env_runners=0,
            evaluation_duration=4,
            evaluation_duration_unit="episodes",
        )
        .debugging(seed=0)
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        algo = config.build_algo()
        module = algo.learner_group._learner.module["default_policy"]
        assert isinstance(module, MemoryRLModule) and module.policy.body.kind == "gtrxl"
        before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
        results = [algo.train() for _ in range(2)]
        sampled = [result["env_runners"]["num_env_steps_sampled_lifetime"] for result in results]
        assert sampled[0] >= 128 and sampled[1] >= sampled[0] + 128, sampled
        losses = [result["learners"]["default_policy"]["total_loss"] for result in results]
        assert all(np.isfinite(loss) for loss in losses), losses
        assert "evaluation" in results[1] and results[1]["evaluation"]["env_runners"]["num_episodes"] >= 4
        # (the weights below are copies, equal bit for bit; a tolerance keeps this Ray test out of CI's reruns of the
        # exact tests under other CPU kernels, where it would test nothing new: the update moves every weight it
        # touches by far more, lr 5e-4 x several Adam steps)
        after = module.state_dict()
        moved = max(float((before[name] - after[name]).abs().max()) for name in before)
        assert moved > 1e-4, moved
        remote = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.module.get_state(), local_env_runner=False
        )[0]
        for name, tensor in after.items():
            torch.testing.assert_close(torch.from_numpy(np.array(remote[name])), tensor, atol=1e-7, rtol=0)
        algo.get_module().save_pretrained(tmp_path / "policy")
        loaded = MemoryPolicy.from_pretrained(tmp_path / "policy").state_dict()
        for name, tensor in module.policy.state_dict().items():
            torch.testing.assert_close(loaded[name], tensor, atol=1e-7, rtol=0)
        algo.stop()
    finally:
        ray.shutdown()
