"""PPO for `MemoryPolicy` on a vectorised gymnasium environment, learning from stored segments.

Each update acts `rollout_steps` steps in every env, one step at a time with the memory, and stores the memory's
`snapshot` at the start of every `segment_length` steps. Learning re-runs each stored segment from its snapshot
(truncated back-propagation through the segment, the stored-memory scheme of GTrXL's and POPGym's recurrent PPO),
with clipped PPO, generalised advantage estimation and an entropy bonus. One loop serves every body (GTrXL, TrXL-I,
GRU, MLP) and every action space of the policy (Discrete, MultiDiscrete, Box), so agents differ only in their network.
The learning rate and the entropy coefficient anneal linearly when given final values (`final_learning_rate`,
`final_entropy_coef`, as CleanRL's `anneal_lr` and ppo_trxl's entropy schedule).

The score is POPGym's MMER (maximum mean episodic reward): after every update, the mean return of the last
`return_window` finished episodes; MMER is the largest of these over training (counted once the window is full).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from .policy import MemoryPolicy


@dataclass
class PPOSettings:
    total_steps: int = 200_000  # environment steps, all envs together
    rollout_steps: int = 128  # steps per env between updates
    # steps per stored segment (truncated back-propagation length). GTrXL learns a segment in one pass, the GRU one step
    # after another: at 64 GTrXL's whole loop runs at least as fast as the matched GRU's (at 16 it ran at 0.59x;
    # benchmarks/bench_rl_acting.py, model_cards/gtrxl.md "Acting speed"), and a segment holds a 64-step dependency
    segment_length: int = 64
    epochs: int = 4
    minibatches: int = 4
    learning_rate: float = 5e-4
    final_learning_rate: float | None = None  # anneal linearly towards this (CleanRL's anneal_lr: 0.0); None: constant
    # 0.99 as CleanRL and POPGym. Where an action's reward is all of its consequence (POPGym's card tasks: the next
    # cards do not depend on it), 0 keeps the other actions' rewards out of its advantage (benchmarks/RESULTS.md)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    final_entropy_coef: float | None = None  # anneal linearly towards this (ppo_trxl's entropy schedule); None: same
    max_grad_norm: float = 0.5
    return_window: int = 100
    # stop an update's epochs after one whose last minibatch moved the policy beyond this approximate KL from the
    # rollout's policy (CleanRL's target_kl, e.g. 0.015): a guard against an update that collapses the policy
    target_kl: float | None = None

    def check(self, num_envs: int):
        for name in ("total_steps", "rollout_steps", "segment_length", "epochs", "minibatches", "return_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"PPOSettings.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("learning_rate", "final_learning_rate", "entropy_coef", "final_entropy_coef"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"PPOSettings.{name} must be >= 0, got {value}")
        for name in ("gamma", "gae_lambda"):  # (0 is allowed: see the comment on gamma)
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"PPOSettings.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"PPOSettings.target_kl must be > 0 or None, got {self.target_kl}")
        if self.rollout_steps % self.segment_length:
            raise ValueError(
                f"PPOSettings.rollout_steps ({self.rollout_steps}) must be a multiple of segment_length "
                f"({self.segment_length})"
            )
        segments = num_envs * self.rollout_steps // self.segment_length
        if segments < self.minibatches:
            raise ValueError(
                f"PPOSettings.minibatches ({self.minibatches}) exceeds the {segments} segments of one rollout"
            )

    def updates(self, num_envs: int) -> int:
        return max(1, self.total_steps // (self.rollout_steps * num_envs))

    def learning_rate_at(self, update: int, updates: int) -> float:
        """The learning rate of update `update` (0-based) of `updates`: linear from `learning_rate` towards
        `final_learning_rate`, reaching it after the last update (CleanRL: lr * (1 - update / updates) for 0.0)."""
        return linear_schedule(self.learning_rate, self.final_learning_rate, update, updates)

    def entropy_coef_at(self, update: int, updates: int) -> float:
        """The entropy coefficient of update `update` of `updates`, annealed as the learning rate."""
        return linear_schedule(self.entropy_coef, self.final_entropy_coef, update, updates)


def linear_schedule(start: float, final: float | None, update: int, updates: int) -> float:
    """`start + (final - start) * update / updates`; `start` throughout when `final` is None."""
    if final is None:
        return start
    return start + (final - start) * update / updates


@dataclass
class TrainingHistory:
    """`steps[i]`: environment steps after update i; `mean_returns[i]`: mean return of the last `return_window`
    finished episodes then (None until the window is full)."""

    settings: dict
    steps: list = field(default_factory=list)
    mean_returns: list = field(default_factory=list)
    learning_rates: list = field(default_factory=list)  # what update i used
    entropy_coefs: list = field(default_factory=list)
    epochs_run: list = field(default_factory=list)  # fewer than settings.epochs where target_kl stopped update i
    episodes: int = 0
    seconds: float = 0.0

    @property
    def mmer(self) -> float:
        scored = [r for r in self.mean_returns if r is not None]
        return max(scored) if scored else float("nan")

    @property
    def final_mean_return(self) -> float:
        scored = [r for r in self.mean_returns if r is not None]
        return scored[-1] if scored else float("nan")

    @property
    def steps_per_second(self) -> float:
        return self.steps[-1] / self.seconds if self.steps and self.seconds else float("nan")

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "mmer": self.mmer,
            "final_mean_return": self.final_mean_return,
            "steps_per_second": self.steps_per_second,
        }


def _check_vector_env(envs):
    import gymnasium as gym

    if not isinstance(envs, gym.vector.VectorEnv):
        raise ValueError(f"envs must be a gymnasium.vector.VectorEnv, got {type(envs).__name__}")
    mode = envs.metadata.get("autoreset_mode")
    if mode != gym.vector.AutoresetMode.SAME_STEP:
        raise ValueError(
            f"envs must reset an ended episode within the same step (autoreset_mode=AutoresetMode.SAME_STEP), got "
            f"{mode}; build them with hf_txvariants.rl.make_vector_env or pass autoreset_mode to the vector env"
        )


def generalised_advantages(rewards, values, dones, next_value, gamma: float, gae_lambda: float):
    """GAE over `[steps, envs]`: delta_t = r_t + gamma V_{t+1} (1 - done_t) - V_t, A_t = delta_t + gamma lambda
    (1 - done_t) A_{t+1}. `dones[t]` ends the episode after step t (its next observation starts a new one)."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        following = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * following * alive - values[t]
        running = delta + gamma * gae_lambda * alive * running
        advantages[t] = running
    return advantages, advantages + values


def _to_segments(x: torch.Tensor, segment_length: int) -> torch.Tensor:
    """`[steps, envs, ...]` -> `[segments * envs, segment_length, ...]`, segment-major (row s * envs + e)."""
    steps, envs = x.shape[:2]
    segments = steps // segment_length
    x = x.reshape(segments, segment_length, envs, *x.shape[2:]).transpose(1, 2)
    return x.reshape(segments * envs, segment_length, *x.shape[3:])


def _adam(parameters: list, learning_rate: float) -> torch.optim.Adam:
    """Adam (eps 1e-5, as CleanRL), one fused kernel for every parameter where torch has one for their device: a step
    over GTrXL's 63 parameter tensors took 1.57 ms on one CPU thread tensor by tensor and 0.35 ms fused (the GRU's 10
    tensors: 0.45 / 0.15 ms)."""
    fused = all(parameter.device.type in ("cpu", "cuda") for parameter in parameters)
    return torch.optim.Adam(parameters, lr=learning_rate, eps=1e-5, fused=fused)


def train_ppo(policy: MemoryPolicy, envs, settings: PPOSettings, seed: int = 0, log=None) -> TrainingHistory:
    """Trains `policy` on `envs` (a vector env with `AutoresetMode.SAME_STEP`, see `make_vector_env`) for
    `settings.total_steps` environment steps. `log(history)` is called after every update when given."""
    _check_vector_env(envs)
    policy.check_spaces(envs.single_observation_space, envs.single_action_space)
    num_envs = envs.num_envs
    settings.check(num_envs)
    torch.manual_seed(seed)
    optimizer = _adam(list(policy.parameters()), settings.learning_rate)
    history = TrainingHistory(settings=asdict(settings))
    observations, _ = envs.reset(seed=seed)
    device = policy.device  # the rollout is kept where the policy is
    state = policy.initial_state(num_envs)
    starts = torch.ones(num_envs, dtype=torch.bool, device=device)
    running_returns = np.zeros(num_envs)
    finished: list[float] = []
    steps_per_update = settings.rollout_steps * num_envs
    started = time.perf_counter()
    updates = settings.updates(num_envs)
    for update in range(updates):
        learning_rate = settings.learning_rate_at(update, updates)
        entropy_coef = settings.entropy_coef_at(update, updates)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        policy.eval()
        rollout = {k: [] for k in ("observations", "starts", "actions", "log_probs", "values", "rewards", "dones")}
        snapshots = []
        for t in range(settings.rollout_steps):
            if t % settings.segment_length == 0:
                snapshots.append(policy.snapshot(state))
            step = policy.act(observations, state, starts)
            next_observations, rewards, terminated, truncated, _ = envs.step(policy.env_actions(step.actions))
            dones = np.logical_or(terminated, truncated)
            running_returns += rewards
            finished.extend(running_returns[dones].tolist())
            history.episodes += int(dones.sum())
            running_returns[dones] = 0.0
            for key, value in (
                ("observations", torch.as_tensor(observations, device=device)),
                ("starts", starts),
                ("actions", step.actions),
                ("log_probs", step.log_probs),
                ("values", step.values),
                ("rewards", torch.as_tensor(rewards, dtype=torch.float32, device=device)),
                ("dones", torch.as_tensor(dones, dtype=torch.float32, device=device)),
            ):
                rollout[key].append(value)
            observations, state, starts = next_observations, step.state, torch.as_tensor(dones, device=device)
        rollout = {k: torch.stack(v) for k, v in rollout.items()}  # [steps, envs, ...]
        # the value of the next observation, from a copy of the state (acting goes on from the state itself)
        peek_state = policy.restore(policy.snapshot(state))
        next_value = policy.act(observations, peek_state, starts).values
        advantages, returns = generalised_advantages(
            rollout["rewards"], rollout["values"], rollout["dones"], next_value, settings.gamma, settings.gae_lambda
        )
        epochs_run = _update(policy, optimizer, settings, rollout, snapshots, advantages, returns, entropy_coef)
        history.epochs_run.append(epochs_run)
        history.learning_rates.append(learning_rate)
        history.entropy_coefs.append(entropy_coef)
        history.steps.append((len(history.steps) + 1) * steps_per_update)
        window = finished[-settings.return_window :]
        history.mean_returns.append(float(np.mean(window)) if len(window) == settings.return_window else None)
        finished = window  # only the window is ever read
        history.seconds = time.perf_counter() - started
        if log is not None:
            log(history)
    return history


def _update(
    policy, optimizer, settings: PPOSettings, rollout, snapshots, advantages, returns, entropy_coef: float
) -> int:
    """The PPO epochs over one rollout; returns how many ran (`settings.target_kl` may stop them early)."""
    policy.train()
    segment_length = settings.segment_length
    segments = {k: _to_segments(v, segment_length) for k, v in rollout.items()}
    segments["advantages"] = _to_segments(advantages, segment_length)
    segments["returns"] = _to_segments(returns, segment_length)
    stored = {k: torch.cat([s[k] for s in snapshots]) for k in snapshots[0]}  # segment-major, as `_to_segments`
    count = segments["actions"].shape[0]
    for epoch in range(settings.epochs):
        for rows in torch.randperm(count, device=segments["actions"].device).chunk(settings.minibatches):
            state = policy.restore({k: v[rows] for k, v in stored.items()})
            log_probs, entropy, values = policy.evaluate_actions(
                segments["observations"][rows], state, segments["starts"][rows], segments["actions"][rows]
            )
            advantages = segments["advantages"][rows]
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            log_ratio = log_probs - segments["log_probs"][rows]
            ratio = log_ratio.exp()
            clipped = ratio.clamp(1 - settings.clip, 1 + settings.clip)
            policy_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
            value_loss = (values - segments["returns"][rows]).pow(2).mean()
            loss = policy_loss + settings.value_coef * value_loss - entropy_coef * entropy.mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), settings.max_grad_norm)
            optimizer.step()
            policy.body.after_optimizer_step()
        if settings.target_kl is not None:
            with torch.no_grad():  # the "k3" estimate of KL(rollout policy || current), CleanRL's approx_kl
                approx_kl = float(((ratio - 1) - log_ratio).mean())  # of the epoch's last minibatch
            if approx_kl > settings.target_kl:
                return epoch + 1
    return settings.epochs


__all__ = ["PPOSettings", "TrainingHistory", "generalised_advantages", "linear_schedule", "train_ppo"]
