"""GTrXL (and TrXL-I, and the GRU to compare with) as the memory of a Stable-Baselines3 agent: `MemoryPPO`, an
`OnPolicyAlgorithm` that SB3 users drive as they drive `PPO` / sb3-contrib's `RecurrentPPO`. Needs Stable-Baselines3:
`pip install "hf-txvariants[sb3]"`.

    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from hf_txvariants.rl import make_env
    from hf_txvariants.rl.sb3 import MemoryPPO

    envs = make_vec_env(lambda: make_env("RepeatPreviousMedium", previous_action=True), n_envs=16)
    model = MemoryPPO("gtrxl", envs, policy_kwargs=dict(mem_len=32), tensorboard_log="runs", verbose=1)
    model.learn(200_000, callback=...)
    model.save("gtrxl-rpm.zip")                 # SB3's file: MemoryPPO.load("gtrxl-rpm.zip", env=envs)
    model.save_pretrained("gtrxl-rpm")          # MemoryPolicy's format: MemoryPolicy.from_pretrained("gtrxl-rpm")
    actions, state = model.predict(observations, state, episode_start, deterministic=True)
    evaluate_policy(model, envs, n_eval_episodes=100)

`policy` is one of `make_policy`'s agents ("gtrxl", "trxl_i", "gru", "mlp"; `policy_kwargs` are its GTrXL fields and
`episode_clock`, the GRU and MLP matched to the GTrXL they describe), a `MemoryPolicy` (trained by `train_ppo`, RLlib
or another `MemoryPPO`), or a folder `MemoryPolicy.save_pretrained` wrote; `MemoryPPO.load` also takes such a folder.

It learns as `train_ppo` learns, with the same maths: each rollout acts `n_steps` steps in every env, one step at a time
with the memory, storing the memory's `snapshot` at the start of every `segment_length` steps (`MemoryRolloutBuffer`,
SB3's `RolloutBuffer` with the snapshots); every minibatch is `batch_size // segment_length` stored segments, each
re-run from its snapshot (truncated back-propagation through the segment), with clipped PPO on advantages normalised
per minibatch, GAE over SB3's episode starts (which equals `train_ppo`'s over its dones), an unclipped value loss, an
entropy bonus, gradient clipping and Adam (eps 1e-5, fused). The defaults are `PPOSettings`' (`ppo_arguments` maps
any `PPOSettings` onto this class's arguments). Where it differs from SB3's `PPO`: an episode cut by a time limit is
not bootstrapped with the value of its last observation (as `train_ppo`); `target_kl` stops the epochs after one whose
last minibatch passed it (as `train_ppo`, SB3 stops within the epoch at 1.5x); `ent_coef` may be a schedule.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from .policy import AGENTS, MemoryPolicy, make_policy
from .ppo import PPOSettings, TrainingHistory

try:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.policies import BasePolicy
    from stable_baselines3.common.utils import FloatSchedule, LinearSchedule, explained_variance
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError('hf_txvariants.rl.sb3 needs Stable-Baselines3: pip install "hf-txvariants[sb3]"') from error


def check_sb3_spaces(observation_space, action_space):
    """Refuses, naming it, a space `MemoryPolicy` cannot take (before SB3's own checks, which assert): observations
    Discrete, MultiDiscrete (one-dimensional) or Box; actions Discrete, MultiDiscrete (one-dimensional) or a floating
    Box. A Dict observation space, for one, wants `gymnasium.wrappers.FlattenObservation`."""
    ok_observation = isinstance(observation_space, (spaces.Discrete, spaces.Box)) or (
        isinstance(observation_space, spaces.MultiDiscrete) and observation_space.nvec.ndim == 1
    )
    if not ok_observation:
        raise ValueError(
            f"observation_space {observation_space} ({type(observation_space).__name__}) is not taken by MemoryPPO: "
            "it takes Discrete, MultiDiscrete (one-dimensional) or Box observations; wrap the environment (e.g. "
            "gymnasium.wrappers.FlattenObservation for a Dict or Tuple)"
        )
    ok_action = (
        isinstance(action_space, spaces.Discrete)
        or (isinstance(action_space, spaces.MultiDiscrete) and action_space.nvec.ndim == 1)
        or (isinstance(action_space, spaces.Box) and np.issubdtype(action_space.dtype, np.floating))
    )
    if not ok_action:
        raise ValueError(
            f"action_space {action_space} ({type(action_space).__name__}) is not taken by MemoryPPO: it takes "
            "Discrete, MultiDiscrete (one-dimensional) or Box (floating point) actions; wrap the environment with an "
            "ActionWrapper to give it one of these (a MultiBinary as a MultiDiscrete of 2s)"
        )


class MemoryActorCriticPolicy(BasePolicy):
    """SB3's policy around a `MemoryPolicy` (`self.memory`): its optimiser, its training mode and `predict` with a
    state. Built from `policy_config` (`MemoryPolicy.to_config()`, what a saved SB3 file holds) or from `agent` and
    `make_policy`'s fields (`agent_fields`)."""

    def __init__(
        self,
        observation_space,
        action_space,
        lr_schedule,
        agent: str | None = None,
        policy_config: dict | None = None,
        optimizer_kwargs: dict | None = None,
        **agent_fields,
    ):
        super().__init__(observation_space, action_space, optimizer_kwargs=optimizer_kwargs)
        if policy_config is not None:
            if agent is not None or agent_fields:
                raise ValueError(
                    f"pass either policy_config or an agent and its fields, not both (got agent {agent!r}, fields "
                    f"{sorted(agent_fields)})"
                )
            self.memory = MemoryPolicy.from_config(policy_config)
        else:
            self.memory = make_policy(agent or "gtrxl", observation_space, action_space, **agent_fields)
        self.memory.check_spaces(observation_space, action_space)
        parameters = list(self.parameters())
        fused = all(parameter.device.type in ("cpu", "cuda") for parameter in parameters)
        # Adam as train_ppo's: eps 1e-5 (CleanRL's), one fused kernel
        self.optimizer = torch.optim.Adam(
            parameters, lr=lr_schedule(1), **{"eps": 1e-5, "fused": fused, **self.optimizer_kwargs}
        )

    def _get_constructor_parameters(self) -> dict:
        data = super()._get_constructor_parameters()
        data.update(policy_config=self.memory.to_config(), optimizer_kwargs=self.optimizer_kwargs)
        return data

    def forward(self, observation, deterministic: bool = False):
        raise NotImplementedError(
            "a memory policy acts with its state: use predict(observation, state, episode_start) or MemoryPolicy.act"
        )

    def _predict(self, observation, deterministic: bool = False):  # (BasePolicy's abstract step; predict is below)
        num_envs = observation.shape[0]
        starts = torch.ones(num_envs, dtype=torch.bool)
        return self.memory.act(observation, self.memory.initial_state(num_envs), starts, greedy=deterministic).actions

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        """`MemoryPolicy.predict`: `(actions, state)`, the state a dict of numpy arrays (the memory's snapshot) to pass
        back, `episode_start [envs]` True where an episode begins (as sb3-contrib's `RecurrentPPO.predict`)."""
        self.set_training_mode(False)
        return self.memory.predict(observation, state, episode_start, deterministic=deterministic)


class MemoryRolloutBuffer(RolloutBuffer):
    """SB3's `RolloutBuffer` (observations, actions in the action space's numbering, rewards, episode starts, values,
    log-probabilities; GAE) and the memory's snapshot at the start of every stored segment (`add_snapshot`), given
    back as minibatches of whole segments (`segments`)."""

    def reset(self) -> None:
        super().reset()
        self.snapshots: list[dict[str, torch.Tensor]] = []

    def add_snapshot(self, snapshot: dict[str, torch.Tensor]):
        self.snapshots.append(snapshot)

    def segments(self, segment_length: int) -> dict[str, torch.Tensor]:
        """The rollout as `[segments * envs, segment_length, ...]` tensors, segment-major (row s * envs + e, as
        `train_ppo`), with the stored memory of each segment's start (`snapshot:<name>`)."""
        if len(self.snapshots) * segment_length != self.buffer_size:
            raise ValueError(
                f"the buffer holds {len(self.snapshots)} snapshots for {self.buffer_size} steps of segments of "
                f"{segment_length}: fill it with MemoryPPO.collect_rollouts"
            )
        lead = (self.buffer_size, self.n_envs)
        arrays = {
            "observations": self.observations.reshape(*lead, *self.observation_space.shape),
            "actions": self.actions.reshape(*lead, *self.action_space.shape),
            "episode_starts": self.episode_starts.astype(bool),
            "log_probs": self.log_probs,
            "advantages": self.advantages,
            "returns": self.returns,
        }
        segments = {}
        for name, array in arrays.items():
            x = torch.as_tensor(array, device=self.device)
            x = x.reshape(self.buffer_size // segment_length, segment_length, self.n_envs, *x.shape[2:]).transpose(1, 2)
            segments[name] = x.reshape(-1, segment_length, *x.shape[3:])
        for name in self.snapshots[0]:
            segments[f"snapshot:{name}"] = torch.cat([snapshot[name] for snapshot in self.snapshots])
        return segments


def _schedule(value):
    return value if callable(value) else FloatSchedule(value)


class MemoryPPO(OnPolicyAlgorithm):
    """PPO with a `MemoryPolicy` (GTrXL, TrXL-I, GRU or MLP body) learning from stored segments; see the module's
    docstring. SB3's `OnPolicyAlgorithm`: `learn(total_timesteps, callback=..., log_interval=..., tb_log_name=...,
    reset_num_timesteps=..., progress_bar=...)`, `predict(observation, state, episode_start, deterministic)`, `save` /
    `load`, its VecEnvs (`DummyVecEnv`, `SubprocVecEnv`, ...), logger and TensorBoard output, `evaluate_policy`.

    Arguments as SB3's `PPO` (`n_steps`, `batch_size`, `n_epochs`, `gamma`, `gae_lambda`, `clip_range`,
    `normalize_advantage`, `ent_coef`, `vf_coef`, `max_grad_norm`, `target_kl`, ...), plus `segment_length` (the
    stored segments: `n_steps` must be a multiple of it, `batch_size` too). `batch_size` None: a quarter of the rollout
    (`PPOSettings`' 4 minibatches). After `learn`, `self.history` is `train_ppo`'s `TrainingHistory` of the run (the
    mean return of the last `stats_window_size` episodes after each rollout, `.mmer`, `.steps_per_second`)."""

    policy: MemoryActorCriticPolicy
    rollout_buffer: MemoryRolloutBuffer

    def __init__(
        self,
        policy="gtrxl",
        env=None,
        learning_rate=5e-4,
        n_steps: int = 128,
        segment_length: int = 64,
        batch_size: int | None = None,
        n_epochs: int = 4,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range=0.2,
        normalize_advantage: bool = True,
        ent_coef=0.01,
        vf_coef: float = 0.5,
        max_grad_norm: float = 0.5,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device="auto",
        _init_setup_model: bool = True,
    ):
        policy_class, policy_kwargs, self._initial_weights = self._policy_arguments(policy, policy_kwargs)
        super().__init__(
            policy_class,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            gamma=gamma,
            gae_lambda=gae_lambda,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=False,
            sde_sample_freq=-1,
            rollout_buffer_class=MemoryRolloutBuffer,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=False,
            supported_action_spaces=None,  # checked below, by name (SB3's check asserts)
        )
        self.segment_length, self.batch_size, self.n_epochs = segment_length, batch_size, n_epochs
        self.clip_range, self.normalize_advantage, self.target_kl = clip_range, normalize_advantage, target_kl
        self._last_memory = None
        self.history: TrainingHistory | None = None
        if self.env is not None:
            check_sb3_spaces(self.observation_space, self.action_space)
            self._check_settings()
        if _init_setup_model:
            self._setup_model()

    @staticmethod
    def _policy_arguments(policy, policy_kwargs):
        """(policy class, policy kwargs, weights to start from or None) for the `policy` argument."""
        if isinstance(policy, type) and issubclass(policy, MemoryActorCriticPolicy):  # SB3's `load`
            return policy, policy_kwargs, None
        if isinstance(policy, str) and policy in AGENTS:
            return MemoryActorCriticPolicy, {"agent": policy, **(policy_kwargs or {})}, None
        if isinstance(policy, (str, Path)) and Path(policy).is_dir():
            policy = MemoryPolicy.from_pretrained(policy)
        if isinstance(policy, MemoryPolicy):
            if policy_kwargs:
                raise ValueError(
                    f"policy is a MemoryPolicy, which brings its own network: policy_kwargs {sorted(policy_kwargs)} "
                    "would not be read; leave them out"
                )
            weights = {name: tensor.detach().cpu().clone() for name, tensor in policy.state_dict().items()}
            return MemoryActorCriticPolicy, {"policy_config": policy.to_config()}, weights
        raise ValueError(
            f"policy must be one of {', '.join(AGENTS)}, a MemoryPolicy or a folder MemoryPolicy.save_pretrained "
            f"wrote, got {policy!r}"
        )

    def _check_settings(self):
        rollout = self.n_steps * self.n_envs
        for name in ("n_steps", "segment_length", "n_epochs", "stats_window_size"):
            value = self._stats_window_size if name == "stats_window_size" else getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MemoryPPO {name} must be a positive int, got {value!r}")
        if self.n_steps % self.segment_length:
            raise ValueError(
                f"MemoryPPO n_steps ({self.n_steps}) must be a multiple of segment_length ({self.segment_length})"
            )
        if self.batch_size is None:  # PPOSettings' 4 minibatches, as torch.chunk cuts them
            segments = rollout // self.segment_length
            self.batch_size = -(-segments // 4) * self.segment_length
        if self.batch_size % self.segment_length or not self.segment_length <= self.batch_size <= rollout:
            raise ValueError(
                f"MemoryPPO batch_size ({self.batch_size}) must be a multiple of segment_length "
                f"({self.segment_length}) between it and the rollout's n_steps x n_envs = {rollout} steps: a "
                "minibatch is whole segments"
            )
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"MemoryPPO target_kl must be > 0 or None, got {self.target_kl}")

    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        self.rollout_buffer = MemoryRolloutBuffer(
            self.n_steps,
            self.observation_space,
            self.action_space,
            device=self.device,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            n_envs=self.n_envs,
        )
        self.policy = MemoryActorCriticPolicy(
            self.observation_space, self.action_space, self.lr_schedule, **self.policy_kwargs
        )
        if self._initial_weights is not None:
            self.policy.memory.load_state_dict(self._initial_weights)
            self._initial_weights = None
        self.policy = self.policy.to(self.device)
        # what a saved file rebuilds the network from: the policy's own config (MemoryPolicy.to_config, plain JSON)
        self.policy_kwargs = {"policy_config": self.policy.memory.to_config()}
        self.clip_range = FloatSchedule(self.clip_range)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_last_memory", "_initial_weights"]

    # ----------------------------------------------------------------------------------------------------------------
    # the policy in the project's format
    @property
    def memory_policy(self) -> MemoryPolicy:
        """The `MemoryPolicy` this algorithm trains (`save_pretrained`, `push_to_hub`, `act`, `train_ppo`)."""
        return self.policy.memory

    def save_pretrained(self, save_directory) -> list[str]:
        """`MemoryPolicy.save_pretrained` of the trained policy: loads with `MemoryPolicy.from_pretrained` (and
        `MemoryPPO.load`, `MemoryPPO(folder, env)`), runs with `python -m hf_txvariants.rl.evaluate`."""
        return self.memory_policy.save_pretrained(save_directory)

    @classmethod
    def from_pretrained(cls, name_or_path, env=None, revision: str | None = None, token: str | None = None, **kwargs):
        """A new `MemoryPPO` (a fresh optimiser) around the `MemoryPolicy` at `name_or_path` (a folder or a Hub repo
        id); `kwargs` are `MemoryPPO`'s arguments."""
        return cls(MemoryPolicy.from_pretrained(name_or_path, revision=revision, token=token), env, **kwargs)

    @classmethod
    def load(
        cls, path, env=None, device="auto", custom_objects=None, print_system_info=False, force_reset=True, **kwargs
    ):
        """SB3's `load` of a file `save` wrote; a folder `MemoryPolicy.save_pretrained` wrote (by `train_ppo`'s
        policy, RLlib's module or `save_pretrained` here) starts a new `MemoryPPO` around that policy."""
        if Path(path).is_dir():
            return cls(MemoryPolicy.from_pretrained(path), env, device=device, **kwargs)
        return super().load(
            path,
            env=env,
            device=device,
            custom_objects=custom_objects,
            print_system_info=print_system_info,
            force_reset=force_reset,
            **kwargs,
        )

    # ----------------------------------------------------------------------------------------------------------------
    # acting
    def _setup_learn(
        self, total_timesteps, callback=None, reset_num_timesteps=True, tb_log_name="run", progress_bar=False
    ):
        resetting = reset_num_timesteps or self._last_obs is None
        total_timesteps, callback = super()._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        num_envs = self.env.num_envs
        if resetting or self._last_memory is None:
            self._last_memory = self.memory_policy.initial_state(num_envs)
            self._last_episode_starts = np.ones(num_envs, dtype=bool)
            self._running_returns = np.zeros(num_envs)
        if reset_num_timesteps or self.history is None:
            self.history = TrainingHistory(settings=self._history_settings())
            self._finished_returns: list[float] = []
        self._learn_started = time.perf_counter() - self.history.seconds
        return total_timesteps, callback

    def _history_settings(self) -> dict:
        names = ("n_steps", "segment_length", "batch_size", "n_epochs", "gamma", "gae_lambda", "vf_coef")
        settings = {name: getattr(self, name) for name in names}
        settings.update(max_grad_norm=self.max_grad_norm, target_kl=self.target_kl, n_envs=self.n_envs)
        settings.update(stats_window_size=self._stats_window_size, seed=self.seed)
        return settings

    def collect_rollouts(self, env, callback, rollout_buffer: MemoryRolloutBuffer, n_rollout_steps: int) -> bool:
        """SB3's rollout (callbacks, episode info, `num_timesteps`), acting one step at a time with the memory carried
        per env and reset where an episode starts, the memory's snapshot stored at every segment's start."""
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        policy, device = self.memory_policy, self.device
        n_steps = 0
        rollout_buffer.reset()
        callback.on_rollout_start()
        while n_steps < n_rollout_steps:
            if n_steps % self.segment_length == 0:
                rollout_buffer.add_snapshot(policy.snapshot(self._last_memory))
            starts = torch.as_tensor(self._last_episode_starts, dtype=torch.bool, device=device)
            step = policy.act(self._last_obs, self._last_memory, starts)
            new_obs, rewards, dones, infos = env.step(policy.env_actions(step.actions))
            self.num_timesteps += env.num_envs
            self._last_memory = step.state
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            self._count_returns(rewards, dones)
            n_steps += 1
            rollout_buffer.add(
                self._last_obs,
                step.actions.cpu().numpy(),
                rewards,
                self._last_episode_starts,
                step.values,
                step.log_probs,
            )
            self._last_obs, self._last_episode_starts = new_obs, dones
        with torch.no_grad():  # the value of the next observation, from a copy of the memory (acting goes on from it)
            peek = policy.restore(policy.snapshot(self._last_memory))
            starts = torch.as_tensor(dones, dtype=torch.bool, device=device)
            values = policy.act(new_obs, peek, starts).values
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        self._record_history()
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _count_returns(self, rewards, dones):
        self._running_returns += rewards
        self._finished_returns.extend(self._running_returns[dones].tolist())
        self.history.episodes += int(np.sum(dones))
        self._running_returns[dones] = 0.0

    def _record_history(self):
        """After a rollout, as `train_ppo` after an update: the steps and the mean return of the last
        `stats_window_size` finished episodes (None until there are that many)."""
        window = self._finished_returns[-self._stats_window_size :]
        self._finished_returns = window
        full = len(window) == self._stats_window_size
        self.history.steps.append(self.num_timesteps)
        self.history.mean_returns.append(float(np.mean(window)) if full else None)
        self.history.learning_rates.append(self.lr_schedule(self._current_progress_remaining))
        self.history.seconds = time.perf_counter() - self._learn_started

    # ----------------------------------------------------------------------------------------------------------------
    # learning
    def train(self) -> None:
        """The PPO epochs over the rollout, every minibatch whole stored segments re-run from their snapshots."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        clip_range = self.clip_range(self._current_progress_remaining)
        ent_coef = self.ent_coef(self._current_progress_remaining) if callable(self.ent_coef) else self.ent_coef
        policy, optimizer = self.memory_policy, self.policy.optimizer
        segments = self.rollout_buffer.segments(self.segment_length)
        snapshot_names = [name for name in segments if name.startswith("snapshot:")]
        count = segments["actions"].shape[0]
        per_batch = self.batch_size // self.segment_length
        entropy_losses, pg_losses, value_losses, clip_fractions, approx_kls = [], [], [], [], []
        epochs_run = 0
        for epoch in range(self.n_epochs):
            epochs_run = epoch + 1
            for rows in torch.randperm(count, device=segments["actions"].device).split(per_batch):
                state = policy.restore({name.split(":", 1)[1]: segments[name][rows] for name in snapshot_names})
                log_probs, entropy, values = policy.evaluate_actions(
                    segments["observations"][rows], state, segments["episode_starts"][rows], segments["actions"][rows]
                )
                advantages = segments["advantages"][rows]
                if self.normalize_advantage and advantages.numel() > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                log_ratio = log_probs - segments["log_probs"][rows]
                ratio = log_ratio.exp()
                clipped = ratio.clamp(1 - clip_range, 1 + clip_range)
                policy_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
                value_loss = (values - segments["returns"][rows]).pow(2).mean()
                entropy_loss = -entropy.mean()
                loss = policy_loss + ent_coef * entropy_loss + self.vf_coef * value_loss
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                optimizer.step()
                policy.body.after_optimizer_step()
                with torch.no_grad():  # the "k3" estimate of KL(rollout policy || current), as SB3 and CleanRL
                    approx_kl = float(((ratio - 1) - log_ratio).mean())
                pg_losses.append(policy_loss.item())
                value_losses.append(value_loss.item())
                entropy_losses.append(entropy_loss.item())
                clip_fractions.append(float(((ratio - 1).abs() > clip_range).float().mean()))
                approx_kls.append(approx_kl)
            self._n_updates += 1
            if self.target_kl is not None and approx_kl > self.target_kl:  # (of the epoch's last minibatch)
                break
        if self.history is not None:  # (the seconds up to the end of this update, as train_ppo counts them)
            self.history.epochs_run.append(epochs_run)
            self.history.entropy_coefs.append(float(ent_coef))
            self.history.seconds = time.perf_counter() - self._learn_started
        explained = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        self.logger.record("train/entropy_loss", np.mean(entropy_losses))
        self.logger.record("train/policy_gradient_loss", np.mean(pg_losses))
        self.logger.record("train/value_loss", np.mean(value_losses))
        self.logger.record("train/approx_kl", np.mean(approx_kls))
        self.logger.record("train/clip_fraction", np.mean(clip_fractions))
        self.logger.record("train/loss", loss.item())
        self.logger.record("train/explained_variance", explained)
        self.logger.record("train/ent_coef", float(ent_coef))
        self.logger.record("train/epochs_run", epochs_run)
        if policy.action_kind == "box":
            self.logger.record("train/std", policy.log_std.exp().mean().item())
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/clip_range", clip_range)
        if self.history is not None and self.history.mean_returns[-1] is not None:
            self.logger.record("rollout/mmer", self.history.mmer)

    def learn(
        self,
        total_timesteps: int,
        callback=None,
        log_interval: int = 1,
        tb_log_name: str = "MemoryPPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ):
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )


def ppo_arguments(settings: PPOSettings, num_envs: int) -> dict:
    """`MemoryPPO(policy, env, **...)` arguments for `train_ppo`'s PPO of `settings` with `num_envs` environments:
    the same rollout (`n_steps`), segments, minibatches (`batch_size`), epochs, learning rate and entropy (annealed
    linearly when `settings` anneals them: SB3's schedules read the progress after each rollout, so the values run one
    update ahead of `train_ppo`'s), discount, GAE lambda, clip, value weight, gradient norm, target KL and the window
    of returns. Train with `learn(settings.total_steps)`."""
    settings.check(num_envs)
    segments = settings.rollout_steps * num_envs // settings.segment_length

    def schedule(start, final):
        return start if final is None else LinearSchedule(start, final, 1.0)

    return {
        "learning_rate": schedule(settings.learning_rate, settings.final_learning_rate),
        "n_steps": settings.rollout_steps,
        "segment_length": settings.segment_length,
        # whole segments; as many per minibatch as torch.chunk gives train_ppo's
        "batch_size": -(-segments // settings.minibatches) * settings.segment_length,
        "n_epochs": settings.epochs,
        "gamma": settings.gamma,
        "gae_lambda": settings.gae_lambda,
        "clip_range": settings.clip,
        "ent_coef": schedule(settings.entropy_coef, settings.final_entropy_coef),
        "vf_coef": settings.value_coef,
        "max_grad_norm": settings.max_grad_norm,
        "target_kl": settings.target_kl,
        "stats_window_size": settings.return_window,
    }


__all__ = [
    "MemoryActorCriticPolicy",
    "MemoryPPO",
    "MemoryRolloutBuffer",
    "check_sb3_spaces",
    "ppo_arguments",
]
