"""Actor-critic policies with a memory, for vectorised gymnasium environments and a plain PPO loop.

    policy = MemoryPolicy.gtrxl(envs.single_observation_space, envs.single_action_space, hidden_size=64, mem_len=64)
    state = policy.initial_state(envs.num_envs)
    starts = torch.ones(envs.num_envs, dtype=torch.bool)          # every env begins an episode
    step = policy.act(observations, state, starts)                # actions, log_probs, values, the next state
    observations, rewards, terminated, truncated, _ = envs.step(step.actions.numpy())
    state, starts = step.state, torch.as_tensor(terminated | truncated)

A policy is an observation encoder (and optionally an episode clock: `encoder.py`), a memory body (`GTrXLBody`,
`GRUBody`, `MLPBody`: `bodies.py`) and two linear heads (action logits, value), here with the action distributions;
it saves, loads and shares as `sharing.py` says. `make_policy` builds the benchmark's agents at an equal parameter
budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..configuration_gtrxl import GTrXLConfig
from .bodies import GRUBody, GTrXLBody, MemoryBody, MLPBody
from .encoder import EPISODE_CLOCK_PERIODS, EpisodeClock, ObservationEncoder
from .sharing import PolicySharingMixin


@dataclass
class ClockedState:
    """The state of a policy with an `EpisodeClock`: its body's state and, per env, the steps its episode has taken."""

    body: object
    episode_steps: torch.Tensor  # [envs], long


@dataclass
class PolicyOutput:
    logits: torch.Tensor  # [envs, steps, parameters]: the action logits (a Box: the Gaussian's means)
    values: torch.Tensor  # [envs, steps]
    state: object


@dataclass
class PolicyStep:
    actions: torch.Tensor  # [envs, *action_shape], in the action space's numbering (a Box's: unclipped)
    log_probs: torch.Tensor  # [envs]
    values: torch.Tensor  # [envs]
    state: object


def _action_parameters(action_space) -> tuple[str, int]:
    """The action space's kind ("discrete", "multi_discrete", "box") and how many outputs the policy head needs."""
    import gymnasium as gym

    if isinstance(action_space, gym.spaces.Discrete):
        return "discrete", int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        return "multi_discrete", int(action_space.nvec.sum())
    if isinstance(action_space, gym.spaces.Box) and np.issubdtype(action_space.dtype, np.floating):
        return "box", int(np.prod(action_space.shape))
    raise ValueError(
        f"action_space must be Discrete, MultiDiscrete (one-dimensional nvec) or Box (floating point), got "
        f"{action_space}; wrap the environment (e.g. gymnasium.wrappers.FlattenObservation for the observations, an "
        "ActionWrapper for the actions) to give it one of these"
    )


class MemoryPolicy(PolicySharingMixin, nn.Module):
    """Observation encoder -> memory body -> action distribution and value.

    Action spaces (`act`, `evaluate_actions`):
    - Discrete: a categorical over the logits;
    - MultiDiscrete (one-dimensional): independent categoricals, log-probabilities and entropies summed;
    - Box (floating point): a diagonal Gaussian, means from the head and a learned state-independent log-std
      (`log_std`). Actions are the unclipped samples (their log-probabilities are those of the samples); only
      `env_actions` clips them to the bounds, to step the environment (as CleanRL's continuous PPO).

    `episode_clock`: None or False (no clock), True (`EPISODE_CLOCK_PERIODS`) or the periods of an `EpisodeClock`;
    with one, the state is a `ClockedState` and `snapshot` adds `episode_steps [envs]`."""

    def __init__(self, observation_space, action_space, body: MemoryBody, episode_clock=None):
        super().__init__()
        self.action_kind, num_parameters = _action_parameters(action_space)
        self.observation_space, self.action_space = observation_space, action_space
        self.encoder = ObservationEncoder(observation_space, body.hidden_size)
        if episode_clock is True:
            episode_clock = EPISODE_CLOCK_PERIODS
        no_clock = episode_clock is None or episode_clock is False
        self.clock = None if no_clock else EpisodeClock(episode_clock, body.hidden_size)
        self.body = body
        self.policy_head = nn.Linear(body.hidden_size, num_parameters)
        self.value_head = nn.Linear(body.hidden_size, 1)
        if self.action_kind == "box":
            self.log_std = nn.Parameter(torch.zeros(num_parameters))
        if self.action_kind == "discrete":
            self.category_sizes, start = [int(action_space.n)], [int(action_space.start)]
        elif self.action_kind == "multi_discrete":
            self.category_sizes, start = action_space.nvec.tolist(), action_space.start.tolist()
        else:
            self.category_sizes, start = [], []
        self.register_buffer("action_start", torch.tensor(start, dtype=torch.long), persistent=False)
        self.first_action = start[0] if self.action_kind == "discrete" else None  # a Discrete space's `start`

    # ----------------------------------------------------------------------------------------------------------------
    # construction
    @classmethod
    def gtrxl(
        cls, observation_space, action_space, config: GTrXLConfig | None = None, episode_clock=None, **config_fields
    ):
        """A GTrXL policy; `config_fields` build the `GTrXLConfig` (vocab_size is 1: observations come in as
        `inputs_embeds`). `gate_type="trxl_i"` gives TrXL-I; `mem_len=0` the same network without a memory."""
        if config is None:
            config = GTrXLConfig(**{"vocab_size": 1, **config_fields})
        elif config_fields:
            raise ValueError(f"pass either a config or config fields, not both (got {sorted(config_fields)})")
        return cls(observation_space, action_space, GTrXLBody(config), episode_clock)

    @classmethod
    def gru(cls, observation_space, action_space, hidden_size: int, episode_clock=None):
        return cls(observation_space, action_space, GRUBody(hidden_size), episode_clock)

    @classmethod
    def mlp(cls, observation_space, action_space, hidden_size: int, episode_clock=None):
        return cls(observation_space, action_space, MLPBody(hidden_size), episode_clock)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        return self.policy_head.weight.device

    def check_spaces(self, observation_space, action_space):
        """Refuses an environment whose spaces are not the ones this policy was built for, naming both."""
        if observation_space != self.observation_space or action_space != self.action_space:
            raise ValueError(
                f"the policy was built for observation space {self.observation_space} and action space "
                f"{self.action_space}, but the environment has observation space {observation_space} and action "
                f"space {action_space}"
            )

    # ----------------------------------------------------------------------------------------------------------------
    # the memory
    def initial_state(self, num_envs: int):
        state = self.body.initial_state(num_envs, device=self.device)
        if self.clock is None:
            return state
        return ClockedState(state, torch.zeros(num_envs, dtype=torch.long, device=self.device))

    def snapshot(self, state) -> dict[str, torch.Tensor]:
        if self.clock is None:
            return self.body.snapshot(state)
        state = self._clocked_state(state)
        return {**self.body.snapshot(state.body), "episode_steps": state.episode_steps.clone()}

    @staticmethod
    def _clocked_state(state) -> ClockedState:
        """`state`, checked to be a clocked policy's."""
        if not isinstance(state, ClockedState):
            raise ValueError(
                f"this policy has an episode clock: its state is a ClockedState (from `initial_state` or "
                f"`restore`), got {type(state).__name__}"
            )
        return state

    def restore(self, snapshot: dict[str, torch.Tensor]):
        if self.clock is None:
            return self.body.restore(snapshot)
        if "episode_steps" not in snapshot:
            raise ValueError(
                f"this policy has an episode clock: the state needs 'episode_steps', got {sorted(snapshot)}"
            )
        body_snapshot = {name: value for name, value in snapshot.items() if name != "episode_steps"}
        return ClockedState(self.body.restore(body_snapshot), snapshot["episode_steps"].long())

    # ----------------------------------------------------------------------------------------------------------------
    # the action distribution
    # Categoricals are written out (log_softmax, multinomial, gather) rather than built as torch.distributions objects:
    # the objects' construction and argument checks cost more than a small policy's whole step when acting.
    def _sample(self, parameters: torch.Tensor, greedy: bool) -> torch.Tensor:
        """Actions `[..., *action_shape]` in the action space's numbering."""
        if self.action_kind == "box":
            if greedy:
                flat = parameters
            else:
                flat = parameters + self.log_std.exp() * torch.randn_like(parameters)
            return flat.reshape(*parameters.shape[:-1], *self.action_space.shape)
        if self.action_kind == "discrete":  # one categorical: no split and stack
            if greedy:
                codes = parameters.argmax(-1)
            else:
                probabilities = parameters.softmax(-1).reshape(-1, parameters.shape[-1])
                codes = torch.multinomial(probabilities, 1).reshape(parameters.shape[:-1])
            return codes + self.first_action
        codes = []
        for logits in parameters.split(self.category_sizes, dim=-1):
            if greedy:
                codes.append(logits.argmax(-1))
            else:
                probabilities = logits.softmax(-1).reshape(-1, logits.shape[-1])
                codes.append(torch.multinomial(probabilities, 1).reshape(logits.shape[:-1]))
        codes = torch.stack(codes, -1) + self.action_start
        return codes[..., 0] if self.action_kind == "discrete" else codes

    def _log_probs_and_entropy(self, parameters: torch.Tensor, actions: torch.Tensor, entropy: bool = True):
        """Log-probabilities of `actions` `[..., *action_shape]` (the space's numbering) and the entropies, `[...]`
        (None unless `entropy`)."""
        if self.action_kind == "box":
            flat = actions.reshape(*parameters.shape).to(parameters.dtype)
            log_std = self.log_std.expand_as(parameters)
            log_probs = -0.5 * ((flat - parameters) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)
            entropies = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1) if entropy else None
            return log_probs.sum(-1), entropies
        codes = actions.long().reshape(*parameters.shape[:-1], len(self.category_sizes)) - self.action_start
        if self.action_kind == "discrete":  # one categorical: no split
            normalised = parameters.log_softmax(-1)
            log_probs = normalised.gather(-1, codes)[..., 0]
            return log_probs, -(normalised.exp() * normalised).sum(-1) if entropy else None
        log_probs, entropies = 0, 0
        for i, logits in enumerate(parameters.split(self.category_sizes, dim=-1)):
            normalised = logits.log_softmax(-1)
            log_probs = log_probs + normalised.gather(-1, codes[..., i : i + 1])[..., 0]
            if entropy:
                entropies = entropies - (normalised.exp() * normalised).sum(-1)
        return log_probs, entropies if entropy else None

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """The actions to step the environment with: a numpy array, a Box's clipped to its bounds."""
        actions = actions.detach().cpu().numpy()
        if self.action_kind == "box":
            return np.clip(actions, self.action_space.low, self.action_space.high).astype(self.action_space.dtype)
        return actions

    # ----------------------------------------------------------------------------------------------------------------
    # running
    def _tensor(self, value, dtype=None) -> torch.Tensor:
        return torch.as_tensor(value, dtype=dtype, device=self.device)

    def forward(self, observations, state, episode_starts) -> PolicyOutput:
        """observations `[envs, steps, *observation_shape]`, episode_starts `[envs, steps]` (True where an episode
        begins: that step sees nothing of the memory before it)."""
        observations = self._tensor(observations)
        episode_starts = self._tensor(episode_starts, torch.bool)
        if episode_starts.shape != observations.shape[:2]:
            raise ValueError(
                f"episode_starts has shape {tuple(episode_starts.shape)}, expected [envs, steps] = "
                f"{tuple(observations.shape[:2])} from the observations"
            )
        inputs = self.encoder(observations)
        if self.clock is None:
            hidden, state = self.body(inputs, state, episode_starts)
        else:
            state = self._clocked_state(state)
            steps = self.clock.episode_steps(episode_starts, state.episode_steps)
            hidden, body_state = self.body(inputs + self.clock(steps, inputs.dtype), state.body, episode_starts)
            state = ClockedState(body_state, steps[:, -1] + 1)
        return PolicyOutput(self.policy_head(hidden), self.value_head(hidden).squeeze(-1), state)

    @torch.no_grad()
    def act(self, observations, state, episode_starts, greedy: bool = False) -> PolicyStep:
        """One step in every env: observations `[envs, *observation_shape]`, episode_starts `[envs]`. Returns the
        actions (sampled, or the most likely with `greedy`), their log-probabilities, the values and the next state."""
        observations = self._tensor(observations)
        episode_starts = self._tensor(episode_starts, torch.bool)
        out = self(observations[:, None], state, episode_starts[:, None])
        parameters = out.logits[:, 0]
        actions = self._sample(parameters, greedy)
        log_probs, _ = self._log_probs_and_entropy(parameters, actions, entropy=False)
        return PolicyStep(actions, log_probs, out.values[:, 0], out.state)

    def evaluate_actions(self, observations, state, episode_starts, actions):
        """Log-probabilities of `actions` `[envs, steps, *action_shape]`, the entropies and the values over a stored
        segment that starts from `state` (e.g. `restore` of the snapshot taken when acting reached it)."""
        out = self(observations, state, episode_starts)
        log_probs, entropy = self._log_probs_and_entropy(out.logits, self._tensor(actions))
        return log_probs, entropy, out.values

    @torch.no_grad()
    def predict(self, observation, state: dict | None = None, episode_start=None, deterministic: bool = False):
        """One step, numpy in and numpy out, as SB3-contrib's `RecurrentPPO.predict`: returns `(actions, state)`.

        observation: `[envs, *observation_shape]`, or one observation `observation_shape`. state: what the last call
        returned (a dict of numpy arrays, the `snapshot` of the memory), or None to start fresh. episode_start
        `[envs]`: True where an episode begins (default: all True when `state` is None, else all False). The actions
        are ready for `env.step` (a Box's clipped to its bounds). The state passed in is never modified."""
        observation = np.asarray(observation)
        single = observation.shape == tuple(self.observation_space.shape)
        if single:
            observation = observation[None]
        num_envs = observation.shape[0]
        if state is None:
            memory = self.initial_state(num_envs)
        else:
            if not isinstance(state, dict):
                raise ValueError(f"state must be None or the dict that predict returned, got {type(state).__name__}")
            for name, value in state.items():
                if np.shape(value)[:1] != (num_envs,):
                    raise ValueError(f"state[{name!r}] has shape {np.shape(value)}, expected {num_envs} envs first")
            memory = self.restore({name: self._tensor(np.array(value)) for name, value in state.items()})
        if episode_start is None:
            episode_start = np.full(num_envs, state is None)
        episode_start = np.asarray(episode_start, dtype=bool).reshape(-1)
        if episode_start.shape != (num_envs,):
            raise ValueError(f"episode_start has {episode_start.size} entries for {num_envs} observations")
        step = self.act(observation, memory, episode_start, greedy=deterministic)
        actions = self.env_actions(step.actions)
        next_state = {name: value.cpu().numpy() for name, value in self.snapshot(step.state).items()}
        return (actions[0] if single else actions), next_state


AGENTS = ("gtrxl", "trxl_i", "gru", "mlp")
DEFAULT_GTRXL_FIELDS = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, mem_len=64
)
# The GRU gates' b_g of `make_policy("gtrxl")`: 0, gates half open from the start, not the paper's 2 (GTrXLConfig's
# default), which starts each layer near the identity for stability over billions of steps. Within POPGym-size
# budgets b_g = 0 found the memory first in every comparison (RepeatPreviousMedium: 78-123k steps against 199-227k,
# and 0.965 against 0.926 at 400k; RepeatPreviousHard: 242-522k against 313-608k; benchmarks/RESULTS.md, issue 30).
# Pass `gate_bias=2.0` for the paper's.
RL_GATE_BIAS = 0.0


def make_policy(agent: str, observation_space, action_space, episode_clock=None, **gtrxl_fields) -> MemoryPolicy:
    """One of `AGENTS` at an equal parameter budget: "gtrxl" (GRU-gated GTrXL, b_g `RL_GATE_BIAS` unless
    `gate_bias` is given) and "trxl_i" (identity map reordering, no gates) from `DEFAULT_GTRXL_FIELDS` updated by
    `gtrxl_fields`; "gru" and "mlp" of the width whose parameter count is closest to that GTrXL policy's.
    `episode_clock` (see `MemoryPolicy`) is given to every agent alike, the budget's GTrXL included."""
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}; known: {', '.join(AGENTS)}")
    fields = {**DEFAULT_GTRXL_FIELDS, **gtrxl_fields}
    if agent == "gtrxl":
        fields.setdefault("gate_bias", RL_GATE_BIAS)
    if agent in ("gtrxl", "trxl_i"):
        gate_type = "gru" if agent == "gtrxl" else "trxl_i"
        return MemoryPolicy.gtrxl(
            observation_space, action_space, episode_clock=episode_clock, gate_type=gate_type, **fields
        )
    budget = MemoryPolicy.gtrxl(
        observation_space, action_space, episode_clock=episode_clock, gate_type="gru", **fields
    ).num_parameters
    build = getattr(MemoryPolicy, agent)
    width = parameter_matched_hidden_size(
        lambda h: build(observation_space, action_space, h, episode_clock=episode_clock), budget
    )
    return build(observation_space, action_space, width, episode_clock=episode_clock)


def parameter_matched_hidden_size(build, target: int, low: int = 4, high: int = 4096) -> int:
    """The hidden size whose `build(hidden_size).num_parameters` is closest to `target` (a baseline of equal budget)."""
    while high - low > 1:  # num_parameters grows with the width: bisect, then take the nearer neighbour
        middle = (low + high) // 2
        if build(middle).num_parameters < target:
            low = middle
        else:
            high = middle
    return min((low, high), key=lambda h: abs(build(h).num_parameters - target))


__all__ = [
    "AGENTS",
    "DEFAULT_GTRXL_FIELDS",
    "RL_GATE_BIAS",
    "ClockedState",
    "MemoryPolicy",
    "PolicyOutput",
    "PolicyStep",
    "make_policy",
    "parameter_matched_hidden_size",
]
