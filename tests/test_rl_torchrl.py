"""hf_txvariants.rl.torchrl: GTrXL / TrXL-I / GRU as a TorchRL recurrent module (a tensordict in and out, a recurrent
mode for learning on segments, a primer adding the memory to the env's specs), running with TorchRL's collectors,
SerialEnv / ParallelEnv of GymEnvs and ClipPPOLoss, saving in MemoryPolicy's format, refusing by name what it cannot
take."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium")
pytest.importorskip("torchrl")

from tensordict import TensorDict  # noqa: E402
from torchrl.collectors import Collector  # noqa: E402
from torchrl.envs import GymEnv, InitTracker, SerialEnv, TransformedEnv  # noqa: E402
from torchrl.modules import set_recurrent_mode  # noqa: E402

from hf_txvariants.rl import MemoryPolicy, PPOSettings, make_policy, make_vector_env, train_ppo  # noqa: E402
from hf_txvariants.rl.torchrl import (  # noqa: E402
    MemoryModule,
    actor_critic,
    make_torchrl_env,
    memory_advantages,
    segments,
    train_clip_ppo,
)
from tiny_configs import tiny_policy_gtrxl_fields  # noqa: E402

TINY_GTRXL = tiny_policy_gtrxl_fields()
TASK = "txv/ProofOfMemory-v0"
ROOT = Path(__file__).resolve().parents[1]


def module_and_env(agent="gtrxl", num_envs=2, parallel=False, episode_clock=None, **fields):
    env = make_torchrl_env(TASK, num_envs, parallel=parallel)
    module = MemoryModule.build(agent, env, episode_clock=episode_clock, **{**TINY_GTRXL, **fields})
    env.append_transform(module.make_tensordict_primer())
    with torch.no_grad():  # weights off their initial values (zero biases would hide a lost tensor)
        for parameter in module.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    module.eval()
    return module, env


def collect(module, env, frames):
    actor, _ = actor_critic(module, env)
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def test_the_primer_adds_the_memory_to_the_env_specs_and_resets_it():
    module, env = module_and_env()
    layers, mem_len, hidden = TINY_GTRXL["num_hidden_layers"], TINY_GTRXL["mem_len"], TINY_GTRXL["hidden_size"]
    specs = env.full_observation_spec
    assert specs["recurrent_state_memory"].shape == (2, layers, mem_len, hidden)
    assert specs["recurrent_state_memory_mask"].shape == (2, mem_len)
    assert specs["recurrent_state_memory_mask"].dtype == torch.bool
    reset = env.reset()
    assert reset["is_init"].all() and not reset["recurrent_state_memory"].any()
    env.close(raise_if_closed=False)


@pytest.mark.parametrize("agent", ["gtrxl", "trxl_i", "gru", "gtrxl+clock"])
def test_recurrent_mode_on_a_stored_segment_sees_what_acting_saw(agent):
    """A collector's batch cut into segments (episode starts inside them included): in recurrent mode each segment,
    run from the memory stored at its first step, gives the logits and values computed while acting, one step per
    call with the memory carried."""
    torch.manual_seed(0)
    module, env = module_and_env(agent.removesuffix("+clock"), episode_clock=agent.endswith("+clock"))
    data = collect(module, env, 64)  # [2 envs, 32 steps]: proof-of-memory episodes last 6 to 16 steps
    assert data.shape == (2, 32) and data["is_init"][:, 1:].any()
    rows = segments(data, 8)
    assert rows.shape == (8, 8)
    acted = rows.select("logits", "state_value").clone()
    with set_recurrent_mode(True), torch.no_grad():
        module(rows)
    torch.testing.assert_close(rows["logits"], acted["logits"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rows["state_value"], acted["state_value"], atol=1e-5, rtol=1e-5)


def test_a_sequential_step_continues_the_carried_memory_or_rebuilds_it_the_same():
    """One step per call: from the state the last call wrote the module continues its carried memory; from a copy it
    does not recognise (another call in between) it rebuilds the memory from the tensors, with the same result; and
    `is_init` starts the memory afresh."""
    torch.manual_seed(0)
    module, env = module_and_env()
    td = env.reset()
    actor, _ = actor_critic(module, env)
    with torch.no_grad():
        for _ in range(3):
            td = env.step_mdp(env.step(actor(td)))
        state = td.select(*module.state_keys.values(), "observation", "is_init").clone()
        carried = module(td.clone())["logits"]
        module(state.clone().apply(torch.zeros_like))  # another call: the carried memory is no longer this state's
        rebuilt = module(state.clone())["logits"]
        fresh = module(state.clone().set("is_init", torch.ones(2, 1, dtype=torch.bool)))["logits"]
        starting = {"observation": state["observation"], "is_init": torch.ones(2, 1, dtype=torch.bool)}
        empty = module(state.clone().apply(torch.zeros_like).update(starting))["logits"]
    torch.testing.assert_close(carried, rebuilt, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fresh, empty, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(carried, fresh, atol=1e-4)
    env.close(raise_if_closed=False)


def test_memory_advantages_are_train_ppos_gae_from_the_acting_values():
    from hf_txvariants.rl import generalised_advantages

    module, env = module_and_env()
    data = collect(module, env, 32)
    memory_advantages(data, module, gamma=0.9, gae_lambda=0.8)
    assert data["advantage"].shape == data["value_target"].shape == (2, 16, 1)
    torch.testing.assert_close(data["value_target"], data["advantage"] + data["state_value"])
    # the last step's bootstrap: the value of its next observation from the memory stored with it
    last = data[:, -1]["next"].select("observation", *module.state_keys.values()).clone()
    last.set("is_init", torch.zeros(2, 1, dtype=torch.bool))
    with torch.no_grad():
        next_value = module(last)["state_value"].reshape(-1)
    t = lambda key: data[key].reshape(2, 16).transpose(0, 1).float()  # noqa: E731
    expected, _ = generalised_advantages(
        t(("next", "reward")), t("state_value"), t(("next", "done")), next_value, 0.9, 0.8
    )
    torch.testing.assert_close(data["advantage"][..., 0], expected.transpose(0, 1))


@pytest.mark.exact  # the weights saved and loaded, compared with torch.equal
def test_clip_ppo_with_a_parallel_env_and_the_collector_trains_and_saves(tmp_path):
    """train_clip_ppo: TorchRL's Collector over a ParallelEnv (one process per env, the memory carried through the
    primer's specs), ClipPPOLoss on segments in recurrent mode: the weights move, the history counts every frame, and
    the policy saves in MemoryPolicy's format."""
    torch.manual_seed(0)
    module, env = module_and_env(num_envs=2, parallel=True)
    before = {name: tensor.clone() for name, tensor in module.policy.state_dict().items()}
    settings = PPOSettings(total_steps=64, rollout_steps=16, segment_length=8, minibatches=2, epochs=2, return_window=2)
    history = train_clip_ppo(env, module, settings, seed=0)
    assert history.steps == [32, 64] and history.episodes > 0 and history.mean_returns[-1] is not None
    after = module.policy.state_dict()
    assert max(float((before[name] - after[name]).abs().max()) for name in before) > 1e-4
    assert module.save_pretrained(tmp_path / "torchrl") == ["config.json", "model.safetensors"]
    loaded = MemoryPolicy.from_pretrained(tmp_path / "torchrl")
    for name, tensor in after.items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


@pytest.mark.exact  # the weights saved and loaded, compared with torch.equal
def test_a_policy_saved_by_train_ppo_runs_as_the_module(tmp_path):
    """MemoryPolicy's format both ways without conversion: train_ppo's saved policy is the module's network (every
    weight), acts in a TorchRL env (GymEnv), and the module's saved policy loads back as a MemoryPolicy with its
    spaces."""
    envs = make_vector_env(TASK, 2, seed=0)
    policy = make_policy("gtrxl", envs.single_observation_space, envs.single_action_space, **TINY_GTRXL)
    train_ppo(policy, envs, PPOSettings(total_steps=64, rollout_steps=16, segment_length=8, minibatches=2), seed=0)
    policy.save_pretrained(tmp_path / "train_ppo")
    module = MemoryModule.from_pretrained(tmp_path / "train_ppo")
    for name, tensor in policy.state_dict().items():
        assert torch.equal(module.policy.state_dict()[name], tensor), name
    # TorchRL's own GymEnv (by id) this time, batched by SerialEnv
    env = TransformedEnv(SerialEnv(2, lambda: GymEnv(TASK, categorical_action_encoding=True)), InitTracker())
    env.append_transform(module.make_tensordict_primer())
    module.eval()
    data = collect(module, env, 16)
    assert data["action"].shape == (2, 8) and set(data["action"].unique().tolist()) <= {0, 1}
    module.save_pretrained(tmp_path / "again")
    again = MemoryPolicy.from_pretrained(tmp_path / "again")
    again.check_spaces(envs.single_observation_space, envs.single_action_space)


def test_what_the_module_cannot_take_is_refused_by_name():
    box = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
    with pytest.raises(ValueError, match="action_space .*Box.* not taken by MemoryModule"):
        MemoryModule(make_policy("gru", box, gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32), **TINY_GTRXL))
    with pytest.raises(ValueError, match="does not start at 0"):
        MemoryModule(make_policy("gru", box, gym.spaces.Discrete(3, start=1), **TINY_GTRXL))
    one_hot = TransformedEnv(GymEnv(TASK), InitTracker())  # one-hot actions (categorical_action_encoding=False)
    with pytest.raises(ValueError, match="categorical_action_encoding=True"):
        MemoryModule.build("gtrxl", one_hot, **TINY_GTRXL)
    module, env = module_and_env()
    no_primer = TensorDict({"observation": torch.zeros(2, 3), "is_init": torch.ones(2, 1, dtype=torch.bool)}, [2])
    with pytest.raises(KeyError, match="make_tensordict_primer"):
        module(no_primer)
    with pytest.raises(ValueError, match="multiple of segment_length"):
        segments(TensorDict({}, [2, 12]), 8)
    with pytest.raises(gym.error.NameNotFound, match="NoSuchTask"):  # here, not inside a worker
        make_torchrl_env("NoSuchTask-v9", 2, parallel=True)
    env.close(raise_if_closed=False)


@pytest.mark.slow
def test_the_example_trains_and_evaluates_the_saved_policy(tmp_path):
    arguments = ["--total-steps", "256", "--num-envs", "2", "--rollout-steps", "64", "--segment-length", "16"]
    arguments += ["--return-window", "4", "--eval-episodes", "2", "--serial", "--mem-len", "8", "--hidden-size", "16"]
    for field in ("num_hidden_layers=1", "num_attention_heads=2", "intermediate_size=32"):
        arguments += ["--gtrxl-field", field]
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "rl_torchrl.py"), *arguments, "--save", str(tmp_path / "policy")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MMER" in out.stdout and "saved policy" in out.stdout
    assert MemoryPolicy.from_pretrained(tmp_path / "policy").body.kind == "gtrxl"


def test_only_rl_torchrl_imports_torchrl_and_nothing_imports_it():
    package = ROOT / "hf_txvariants"
    module = package / "rl" / "torchrl.py"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [(0, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.level, node.module or "")]
            else:
                continue
            for level, name in names:
                third_party = level == 0 and name.split(".")[0] in ("torchrl", "tensordict")
                if (third_party and path != module) or (level > 0 and name.split(".")[-1] == "torchrl"):
                    offenders.append(f"{path.relative_to(package)}: {'.' * level}{name}")
    assert offenders == []


@pytest.mark.exact  # the weights saved and loaded, compared with torch.equal
def test_a_policy_moves_between_sb3_and_torchrl_without_conversion(tmp_path):
    """The folder MemoryPPO saves is the module's policy, and the module's is MemoryPPO's (MemoryPolicy's format)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    from hf_txvariants.rl import make_env
    from hf_txvariants.rl.sb3 import MemoryPPO

    sb3 = MemoryPPO("gtrxl", make_vec_env(lambda: make_env(TASK), n_envs=2), policy_kwargs=dict(TINY_GTRXL),
                    n_steps=16, segment_length=8, device="cpu")  # fmt: skip
    sb3.save_pretrained(tmp_path / "sb3")
    module = MemoryModule.from_pretrained(tmp_path / "sb3")
    for name, tensor in sb3.memory_policy.state_dict().items():
        assert torch.equal(module.policy.state_dict()[name], tensor), name
    module.save_pretrained(tmp_path / "torchrl")
    back = MemoryPPO.load(tmp_path / "torchrl", env=make_vec_env(lambda: make_env(TASK), n_envs=2), n_steps=16,
                          segment_length=8, device="cpu")  # fmt: skip
    for name, tensor in module.policy.state_dict().items():
        assert torch.equal(back.memory_policy.state_dict()[name], tensor), name
