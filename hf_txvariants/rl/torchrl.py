"""GTrXL (and TrXL-I, and the GRU to compare with) as a TorchRL recurrent module, in the style of TorchRL's
`LSTMModule` / `GRUModule`: a tensordict in and out, a recurrent mode for learning on segments
(`torchrl.modules.set_recurrent_mode`), and a primer that adds the memory to the environment's specs
(`make_tensordict_primer`). It runs with TorchRL's collectors, `GymEnv` / `ParallelEnv` and `ClipPPOLoss`. Needs
TorchRL: `pip install "hf-txvariants[torchrl]"`.

    from torchrl.collectors import Collector
    from torchrl.modules import set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss
    from hf_txvariants.rl.torchrl import MemoryModule, actor_critic, make_torchrl_env, memory_advantages, segments

    env = make_torchrl_env("RepeatPreviousMedium", 8, previous_action=True, parallel=True)  # ParallelEnv + InitTracker
    module = MemoryModule.build("gtrxl", env, mem_len=32)           # make_policy's network
    env.append_transform(module.make_tensordict_primer())           # the memory in the env's specs
    actor, critic = actor_critic(module, env)                        # a ProbabilisticActor (categorical) and the critic
    loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2",
                       normalize_advantage=True, functional=False)
    for data in Collector(env, actor, frames_per_batch=1024, total_frames=100_000):   # data: [envs, steps]
        memory_advantages(data, module, gamma=0.99, gae_lambda=0.95)                  # train_ppo's GAE
        module.train()
        with set_recurrent_mode(True):
            for batch in ...:  # minibatches of whole rows of segments(data, 64), each re-run from its memory
                sum(v for k, v in loss(batch).items() if k.startswith("loss_")).backward() ...
        module.eval()
    module.save_pretrained("policy")    # MemoryPolicy's format: MemoryPolicy.from_pretrained("policy")

`train_clip_ppo(env, module, PPOSettings(...))` is that loop at `train_ppo`'s settings, `examples/rl_torchrl.py` runs
it. The memory travels as the policy's `snapshot`, one flat key per tensor
(`recurrent_state_memory`, `recurrent_state_memory_mask` for GTrXL, `recurrent_state_hidden` for the GRU, and
`recurrent_state_episode_steps` with an episode clock): the module reads it from the root of the tensordict and writes
the next one to `("next", key)`, which the collector moves to the root for the next step (TorchRL's convention for
`LSTMModule`'s `recurrent_state_h`). Stepping one step per call (sequential mode), the module continues the memory it
carried from the last call where the state it is given is, row by row, what that call wrote (or an episode starts
there, `is_init`), which saves GTrXL rebuilding its one-step memory from the tensors on every step; any other state is
rebuilt from its tensors. In recurrent mode a `[batch, time]` tensordict is one segment per row, run from the memory
stored at its first step, with `is_init` as the episode starts inside it: `train_ppo`'s stored-segment learning.

Discrete actions counted from 0 only (TorchRL's categorical samples codes from 0; `GymEnv(...,
categorical_action_encoding=True)` gives integer actions); other action spaces are refused by name (train them with
`train_ppo` or `MemoryPPO`).
"""

from __future__ import annotations

import numpy as np
import torch

from .policy import MemoryPolicy, make_policy
from .ppo import PPOSettings, TrainingHistory, generalised_advantages

try:
    from tensordict import TensorDictBase
    from tensordict.nn import TensorDictModuleBase
    from torchrl.data import Unbounded
    from torchrl.modules import ProbabilisticActor
    from torchrl.modules.tensordict_module.rnn import recurrent_mode as _global_recurrent_mode
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError('hf_txvariants.rl.torchrl needs TorchRL: pip install "hf-txvariants[torchrl]"') from error

STATE_PREFIX = "recurrent_state_"


def check_torchrl_spaces(observation_space, action_space):
    """Refuses, naming it, an action space the module does not take through TorchRL: anything but a Discrete counted
    from 0 (TorchRL's categorical samples codes from 0)."""
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"action_space {action_space} ({type(action_space).__name__}) is not taken by MemoryModule: it takes "
            "Discrete actions (TorchRL's categorical); train other action spaces with train_ppo or MemoryPPO"
        )
    if int(action_space.start) != 0:
        raise ValueError(
            f"action_space {action_space} does not start at 0: TorchRL's categorical samples codes from 0; shift "
            "the actions with an ActionWrapper"
        )


def env_spaces(env):
    """The gymnasium spaces of a TorchRL env (`GymEnv`, `ParallelEnv` of them, or a `TransformedEnv` over those):
    its single observation (`observation` key) and action specs as gymnasium spaces."""
    import gymnasium as gym

    observation_spec = env.observation_spec["observation"]
    action_spec = env.action_spec
    batch = tuple(env.batch_size)
    shape = tuple(observation_spec.shape)[len(batch) :]
    low = observation_spec.space.low.reshape(-1, *shape)[0].cpu().numpy()
    high = observation_spec.space.high.reshape(-1, *shape)[0].cpu().numpy()
    dtype = np.dtype(str(observation_spec.dtype).removeprefix("torch."))
    if not np.issubdtype(dtype, np.floating):
        raise ValueError(f"the module takes Box observations from TorchRL envs, got {observation_spec.dtype} ones")
    observation_space = gym.spaces.Box(low, high, shape=shape, dtype=dtype)
    n = getattr(getattr(action_spec, "space", None), "n", None)
    if n is None or tuple(action_spec.shape)[len(batch) :] not in ((), (1,)) or action_spec.dtype != torch.int64:
        raise ValueError(
            f"action spec {type(action_spec).__name__} {tuple(action_spec.shape)} {action_spec.dtype} is not taken by "
            "MemoryModule: it takes one categorical action (integers; GymEnv(..., categorical_action_encoding=True))"
        )
    return observation_space, gym.spaces.Discrete(int(n))


def gym_env(task: str, previous_action: bool = False):
    """`make_env(task, previous_action)` (a POPGym task or a gymnasium id) as a TorchRL `GymWrapper` with integer
    actions (`categorical_action_encoding=True`). A module-level function: `ParallelEnv` workers can build it."""
    from torchrl.envs import GymWrapper

    from .envs import make_env

    return GymWrapper(make_env(task, previous_action=previous_action), categorical_action_encoding=True)


def make_torchrl_env(task: str, num_envs: int, previous_action: bool = False, parallel: bool = False):
    """`num_envs` copies of `gym_env(task, previous_action)` in a `ParallelEnv` (`parallel`: one process each) or a
    `SerialEnv`, with TorchRL's `InitTracker` (the `is_init` the module resets its memory at). Append the module's
    `make_tensordict_primer()` before collecting."""
    import functools

    from torchrl.envs import InitTracker, ParallelEnv, SerialEnv, TransformedEnv

    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    gym_env(task, previous_action).close()  # refuse a bad task or option here, by name, not inside a worker
    make = functools.partial(gym_env, task, previous_action)
    batched = ParallelEnv(num_envs, make) if parallel else SerialEnv(num_envs, make)
    return TransformedEnv(batched, InitTracker())


class MemoryModule(TensorDictModuleBase):
    """A `MemoryPolicy` (`self.policy`) as a TorchRL recurrent module: reads `observation`, `is_init` and the memory
    (`recurrent_state_*`), writes `logits`, `state_value` (`[..., 1]`) and the next memory at `("next",
    "recurrent_state_*")`. See the module's docstring."""

    def __init__(self, policy: MemoryPolicy, observation_key="observation", default_recurrent_mode: bool = False):
        super().__init__()
        check_torchrl_spaces(policy.observation_space, policy.action_space)
        self.policy = policy
        initial = policy.snapshot(policy.initial_state(1))
        self.state_specs = {name: (tuple(value.shape[1:]), value.dtype) for name, value in initial.items()}
        self.state_keys = {name: STATE_PREFIX + name for name in initial}
        self.observation_key = observation_key
        self.in_keys = [observation_key, "is_init", *self.state_keys.values()]
        self.out_keys = ["logits", "state_value", *(("next", key) for key in self.state_keys.values())]
        self._recurrent_mode = default_recurrent_mode
        self._carried, self._carried_out = None, None

    @classmethod
    def build(cls, agent: str, env, episode_clock=None, **gtrxl_fields) -> MemoryModule:
        """`make_policy(agent, ...)` for the spaces of TorchRL env `env` (`env_spaces`)."""
        observation_space, action_space = env_spaces(env)
        check_torchrl_spaces(observation_space, action_space)
        return cls(make_policy(agent, observation_space, action_space, episode_clock=episode_clock, **gtrxl_fields))

    # the memory -----------------------------------------------------------------------------------------------------
    def make_tensordict_primer(self):
        """A `TensorDictPrimer` that adds the memory's tensors (`recurrent_state_*`, zeros at every reset, where
        `is_init` starts the memory afresh) to the environment's specs, so collectors and `ParallelEnv` carry them."""
        from torchrl.envs.transforms.transforms import TensorDictPrimer

        specs = {
            self.state_keys[name]: Unbounded(shape=shape, dtype=dtype)
            for name, (shape, dtype) in self.state_specs.items()
        }
        return TensorDictPrimer(specs, expand_specs=True)

    @property
    def recurrent_mode(self) -> bool:
        """True inside `torchrl.modules.set_recurrent_mode(True)` (else the constructor's default): a `[batch, time]`
        tensordict is a segment per row; False: one step per call."""
        mode = _global_recurrent_mode()
        return bool(self._recurrent_mode) if mode is None else bool(mode)

    def _state_in(self, tensordict) -> dict[str, torch.Tensor]:
        missing = [key for key in self.state_keys.values() if key not in tensordict.keys()]
        if missing:
            raise KeyError(
                f"the tensordict has no {', '.join(missing)}: append module.make_tensordict_primer() to the env"
            )
        return {name: tensordict.get(key) for name, key in self.state_keys.items()}

    def _resume(self, state_in: dict[str, torch.Tensor], starts: torch.Tensor):
        """The memory carried from the last sequential call where every row of `state_in` is what that call wrote or
        starts an episode; None where it must be rebuilt from the tensors."""
        if self._carried_out is None:
            return None
        for name, value in state_in.items():
            last = self._carried_out[name]
            if value.shape != last.shape or value.dtype != last.dtype:
                return None
            same = (value == last).reshape(len(value), -1).all(1)
            if not bool((same | starts).all()):
                return None
        return self._carried

    # the passes -----------------------------------------------------------------------------------------------------
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.recurrent_mode:
            return self._forward_segments(tensordict)
        shape = tensordict.batch_size
        flat = tensordict.reshape(-1)
        observations = flat.get(self.observation_key)
        starts = flat.get("is_init").reshape(-1).bool()
        state_in = self._state_in(flat)
        memory = self._resume(state_in, starts)
        if memory is None:
            memory = self.policy.restore({name: value.clone() for name, value in state_in.items()})
        out = self.policy(observations[:, None], memory, starts[:, None])
        state_out = self.policy.snapshot(out.state)
        self._carried, self._carried_out = out.state, state_out
        flat.set("logits", out.logits[:, 0])
        flat.set("state_value", out.values[:, 0, None])
        for name, key in self.state_keys.items():
            flat.set(("next", key), state_out[name])
        if flat is not tensordict:
            tensordict.update(flat.reshape(shape))
        return tensordict

    def _forward_segments(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Recurrent mode: each row of a `[batch, time]` tensordict (`[time]`: one row; more dims: all but the last
        folded into the batch) is a segment, run from the memory stored at its first step."""
        shape = tensordict.batch_size
        if len(shape) == 0:
            raise ValueError("MemoryModule in recurrent mode needs a tensordict with a time dimension, got shape []")
        rows = tensordict.reshape(1, -1) if len(shape) == 1 else tensordict.reshape(-1, shape[-1])
        observations = rows.get(self.observation_key)
        starts = rows.get("is_init").reshape(rows.batch_size).bool()
        first = {name: value[:, 0] for name, value in self._state_in(rows).items()}
        out = self.policy(observations, self.policy.restore(first), starts)
        rows.set("logits", out.logits)
        rows.set("state_value", out.values[..., None])
        tensordict.update(rows.reshape(shape), keys_to_update=["logits", "state_value"])
        return tensordict

    def train(self, mode: bool = True):
        self._carried, self._carried_out = None, None  # (a mode switch drops GTrXL's one-step memory layout)
        return super().train(mode)

    # sharing --------------------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory) -> list[str]:
        """`MemoryPolicy.save_pretrained` of the module's policy: loads with `MemoryPolicy.from_pretrained`,
        `MemoryModule.from_pretrained`, `MemoryPPO.load`, runs with `python -m hf_txvariants.rl.evaluate`."""
        return self.policy.save_pretrained(save_directory)

    @classmethod
    def from_pretrained(cls, name_or_path, **kwargs) -> MemoryModule:
        """The module around the `MemoryPolicy` a folder (or Hub repo id) holds: trained by `train_ppo`, RLlib,
        `MemoryPPO` or this module."""
        return cls(MemoryPolicy.from_pretrained(name_or_path), **kwargs)


def actor_critic(module: MemoryModule, env=None):
    """TorchRL's actor and critic over `module`: a `ProbabilisticActor` sampling `action` from a categorical over
    `logits` (with its log-probability, for `ClipPPOLoss`; greedy under `ExplorationType.DETERMINISTIC`), and the
    module itself as the critic (it writes `state_value`). They share the memory body, as in `train_ppo`; give
    `ClipPPOLoss` `functional=False` so the value loss trains it too."""
    from torch.distributions import Categorical

    actor = ProbabilisticActor(
        module=module,
        in_keys=["logits"],
        out_keys=["action"],
        spec=None if env is None else env.action_spec,
        distribution_class=Categorical,
        return_log_prob=True,
    )
    return actor, module


@torch.no_grad()
def memory_advantages(data: TensorDictBase, module: MemoryModule, gamma: float = 0.99, gae_lambda: float = 0.95):
    """`train_ppo`'s GAE over a collected batch `data [envs, steps]` (a collector's, with `split_trajs=False`): from
    the values computed while acting (`state_value`), the rewards and the dones (`("next", "done")`: an episode cut by
    a time limit is not bootstrapped, as `train_ppo`), and the value of each env's last next observation (from its
    memory at `("next", "recurrent_state_*")`). Writes `advantage` and `value_target` (`[envs, steps, 1]`)."""
    if data.ndim != 2:
        raise ValueError(f"memory_advantages needs a [envs, steps] batch, got batch size {tuple(data.batch_size)}")
    last = data[:, -1]["next"].select(module.observation_key, *module.state_keys.values()).clone()
    last.set("is_init", torch.zeros(data.shape[0], 1, dtype=torch.bool, device=data.device))
    carried = module._carried, module._carried_out
    module._carried_out = None  # (peek from the tensors; the collector's next step continues the carried memory)
    next_value = module(last).get("state_value").reshape(-1)
    module._carried, module._carried_out = carried
    rewards = data.get(("next", "reward")).reshape(data.shape).transpose(0, 1).float()
    values = data.get("state_value").reshape(data.shape).transpose(0, 1)
    dones = data.get(("next", "done")).reshape(data.shape).transpose(0, 1).float()
    advantages, returns = generalised_advantages(rewards, values, dones, next_value, gamma, gae_lambda)
    data.set("advantage", advantages.transpose(0, 1)[..., None])
    data.set("value_target", returns.transpose(0, 1)[..., None])
    return data


def segments(data: TensorDictBase, segment_length: int) -> TensorDictBase:
    """A collected batch `[envs, steps]` as segments `[envs * steps / segment_length, segment_length]`, segment-major
    (row s * envs + e, as `train_ppo`), each starting with the memory stored when acting reached it: shuffle and split
    the rows into minibatches, and run them in recurrent mode."""
    envs, steps = data.shape
    if steps % segment_length:
        raise ValueError(f"the batch's {steps} steps per env are not a multiple of segment_length {segment_length}")
    cut = data.reshape(envs, steps // segment_length, segment_length).transpose(0, 1)
    return cut.reshape(-1, segment_length)


def train_clip_ppo(env, module: MemoryModule, settings: PPOSettings, seed: int = 0, log=None) -> TrainingHistory:
    """TorchRL's PPO with `module` on `env` (a batched TorchRL env with `InitTracker` and the module's primer, e.g.
    a `ParallelEnv` of `GymEnv`s) for `settings.total_steps` frames, with `train_ppo`'s settings: a `Collector` of
    `rollout_steps` frames per env, `memory_advantages` (train_ppo's GAE), `ClipPPOLoss` (clip, entropy, value weight
    on the squared error, advantages normalised per minibatch, `functional=False`: the shared body learns from both
    losses) over minibatches of whole segments in recurrent mode, each re-run from its stored memory, gradient
    clipping and Adam (eps 1e-5), the learning rate and entropy annealed as `train_ppo` anneals them. Returns
    `train_ppo`'s `TrainingHistory` (the mean return of the last `return_window` episodes after each update, `.mmer`,
    `.steps_per_second`); `log(history)` is called after every update when given."""
    import time
    from dataclasses import asdict

    from torchrl.collectors import Collector
    from torchrl.modules import set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss

    num_envs = int(np.prod(tuple(env.batch_size)))
    if len(env.batch_size) != 1:
        raise ValueError(f"env must be batched over one dimension (ParallelEnv / SerialEnv), got {env.batch_size}")
    settings.check(num_envs)
    if settings.target_kl is not None:
        raise ValueError("PPOSettings.target_kl is not implemented in train_clip_ppo; leave it None")
    torch.manual_seed(seed)
    env.set_seed(seed)
    actor, critic = actor_critic(module, env)
    loss_module = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=settings.clip,
        entropy_coeff=settings.entropy_coef,
        critic_coeff=settings.value_coef,  # x the squared error ("l2"), as train_ppo's value_coef x MSE
        loss_critic_type="l2",
        normalize_advantage=True,
        functional=False,
    )
    optimizer = torch.optim.Adam(module.parameters(), lr=settings.learning_rate, eps=1e-5)
    updates = settings.updates(num_envs)
    frames_per_batch = settings.rollout_steps * num_envs
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=updates * frames_per_batch)
    history = TrainingHistory(settings=asdict(settings))
    running, finished = torch.zeros(num_envs), []
    started = time.perf_counter()
    module.eval()
    try:
        for update, data in enumerate(collector):
            rewards = data.get(("next", "reward")).reshape(data.shape).float()
            dones = data.get(("next", "done")).reshape(data.shape)
            for t in range(data.shape[1]):
                running += rewards[:, t]
                finished.extend(running[dones[:, t]].tolist())
                running[dones[:, t]] = 0.0
            history.episodes += int(dones.sum())
            learning_rate = settings.learning_rate_at(update, updates)
            entropy_coef = settings.entropy_coef_at(update, updates)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate
            loss_module.entropy_coeff.fill_(entropy_coef)  # (a buffer of the loss: ClipPPOLoss's schedulable one)
            memory_advantages(data, module, settings.gamma, settings.gae_lambda)
            rows = segments(data, settings.segment_length)
            module.train()
            with set_recurrent_mode(True):
                for _ in range(settings.epochs):
                    for index in torch.randperm(rows.shape[0]).chunk(settings.minibatches):
                        out = loss_module(rows[index])
                        loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                        optimizer.zero_grad()
                        loss.backward()
                        torch.nn.utils.clip_grad_norm_(module.parameters(), settings.max_grad_norm)
                        optimizer.step()
                        module.policy.body.after_optimizer_step()
            module.eval()
            collector.update_policy_weights_()
            history.epochs_run.append(settings.epochs)
            history.learning_rates.append(learning_rate)
            history.entropy_coefs.append(entropy_coef)
            history.steps.append((update + 1) * frames_per_batch)
            window = finished[-settings.return_window :]
            finished = window
            full = len(window) == settings.return_window
            history.mean_returns.append(float(np.mean(window)) if full else None)
            history.seconds = time.perf_counter() - started
            if log is not None:
                log(history)
    finally:
        collector.shutdown()
    return history


__all__ = [
    "STATE_PREFIX",
    "MemoryModule",
    "actor_critic",
    "check_torchrl_spaces",
    "env_spaces",
    "gym_env",
    "make_torchrl_env",
    "memory_advantages",
    "segments",
    "train_clip_ppo",
]
