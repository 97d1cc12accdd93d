"""Actor-critic policies with a memory, for vectorised gymnasium environments and a plain PPO loop.

    policy = MemoryPolicy.gtrxl(envs.single_observation_space, envs.single_action_space, hidden_size=64, mem_len=64)
    state = policy.initial_state(envs.num_envs)
    starts = torch.ones(envs.num_envs, dtype=torch.bool)          # every env begins an episode
    step = policy.act(observations, state, starts)                # actions, log_probs, values, the next state
    observations, rewards, terminated, truncated, _ = envs.step(step.actions.numpy())
    state, starts = step.state, torch.as_tensor(terminated | truncated)

A policy is an observation encoder (one-hot for discrete observations, flattened for boxes), a memory body and two
linear heads (action logits, value). The body is one of:
- `GTrXLBody`: the GTrXL backbone (any `gate_type`, so also TrXL-I), fed `inputs_embeds`; its state is the
  `MemoryCache`, reset per environment through `episode_starts`.
- `GRUBody`: a GRU cell, its hidden state zeroed at episode starts (the baseline RL users pick).
- `MLPBody`: no memory at all (the memoryless floor).

Learning from stored segments (truncated back-propagation): `snapshot(state)` turns a state into fixed-shape,
batch-first tensors (stored at the start of each segment while acting, indexable per environment), `restore` turns a
stack of them back into a state, and `forward` over the segment with its `episode_starts` then sees exactly what
acting saw, step by step (`tests/test_rl_policy.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..configuration_gtrxl import GTrXLConfig
from ..modeling_gtrxl import GTrXLModel
from ..txv_cache import MemoryCache


def _space_size(space) -> int:
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(
        f"observation_space must be Discrete, MultiDiscrete or Box, got {type(space).__name__}; wrap the environment "
        "(e.g. gymnasium.wrappers.FlattenObservation) to give it one of these"
    )


class ObservationEncoder(nn.Module):
    """Observations `[..., *observation_shape]` -> `[..., hidden_size]`: one-hot codes for Discrete and MultiDiscrete
    spaces, flattened floats for a Box, then one linear layer."""

    def __init__(self, observation_space, hidden_size: int):
        super().__init__()
        import gymnasium as gym

        self.observation_space = observation_space
        self.input_size = _space_size(observation_space)
        if isinstance(observation_space, gym.spaces.Discrete):
            self.event_dims, self.categories = 0, [int(observation_space.n)]
            self.offset = int(observation_space.start)
        elif isinstance(observation_space, gym.spaces.MultiDiscrete):
            if observation_space.nvec.ndim != 1:
                raise ValueError(f"a MultiDiscrete observation_space must be one-dimensional, got nvec shape "
                                 f"{observation_space.nvec.shape}")
            self.event_dims, self.categories = 1, [int(n) for n in observation_space.nvec]
            self.offset = 0
        else:
            self.event_dims, self.categories = len(observation_space.shape), None
        self.projection = nn.Linear(self.input_size, hidden_size)

    def features(self, observations: torch.Tensor) -> torch.Tensor:
        batch_shape = observations.shape[: observations.dim() - self.event_dims]
        if self.categories is None:
            return observations.reshape(*batch_shape, self.input_size).float()
        codes = (observations.long() - self.offset).reshape(*batch_shape, len(self.categories))
        for i, n in enumerate(self.categories):
            outside = codes[..., i][(codes[..., i] < 0) | (codes[..., i] >= n)]
            if outside.numel():
                raise ValueError(f"observations hold value {int(outside[0]) + self.offset} outside the observation "
                                 f"space {self.observation_space}")
        return torch.cat(
            [nn.functional.one_hot(codes[..., i], n) for i, n in enumerate(self.categories)], dim=-1
        ).float()

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(observations))


class MemoryBody(nn.Module):
    """What a policy needs from its memory: `initial_state`, `forward(inputs [envs, steps, hidden], state,
    episode_starts [envs, steps]) -> (outputs, state)`, and `snapshot` / `restore` between a state and a dict of
    batch-first tensors of fixed shape."""

    hidden_size: int

    def initial_state(self, num_envs: int, device=None):
        raise NotImplementedError

    def snapshot(self, state) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def restore(self, snapshot: dict[str, torch.Tensor]):
        raise NotImplementedError


class GTrXLBody(MemoryBody):
    """The GTrXL backbone (`GTrXLModel`) over encoded observations; the state is its `MemoryCache`."""

    def __init__(self, config: GTrXLConfig):
        super().__init__()
        if config.mem_len < 1:
            raise ValueError(f"a GTrXL policy needs config.mem_len >= 1 (its memory), got {config.mem_len}; "
                             "MemoryPolicy.mlp is the memoryless policy")
        self.config = config
        self.hidden_size = config.hidden_size
        self.model = GTrXLModel(config)

    def initial_state(self, num_envs: int, device=None) -> MemoryCache:
        """`mem_len` slots per env, masked out (with `memory_init="zeros"`: zero vectors that are attended), so the
        memory has its full, fixed shape from the first step on."""
        config, parameter = self.config, next(self.parameters())
        device = device or parameter.device
        memory = torch.zeros(num_envs, config.num_hidden_layers, config.mem_len, config.hidden_size,
                             dtype=parameter.dtype, device=device)
        mask = torch.full((num_envs, config.mem_len), config.memory_init == "zeros", dtype=torch.bool, device=device)
        return self.restore({"memory": memory, "memory_mask": mask})

    def forward(self, inputs, state, episode_starts):
        out = self.model(inputs_embeds=inputs, cache=state, episode_starts=episode_starts, use_cache=True)
        return out.last_hidden_state, out.cache

    def snapshot(self, state: MemoryCache) -> dict[str, torch.Tensor]:
        """Every layer's memory, `memory [envs, layers, mem_len, hidden]`, and `memory_mask [envs, mem_len]` (a copy:
        acting goes on updating the state itself)."""
        if state.memories is None or state.memory_length != self.config.mem_len:
            raise ValueError(f"the GTrXL state must hold mem_len={self.config.mem_len} slots (start from "
                             f"`initial_state`), got {state.memory_length}")
        return {"memory": torch.stack(state.memories, dim=1).clone(), "memory_mask": state.memory_mask.clone()}

    def restore(self, snapshot: dict[str, torch.Tensor]) -> MemoryCache:
        config = self.config
        return MemoryCache(
            config.num_hidden_layers,
            config.mem_len,
            memories=list(snapshot["memory"].unbind(1)),
            memory_mask=snapshot["memory_mask"],
            memory_init=config.memory_init,
            model_type=config.model_type,
        )


class GRUBody(MemoryBody):
    """One GRU cell stepped through time; a row's hidden state is zeroed where its episode starts."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.cell = nn.GRUCell(hidden_size, hidden_size)

    def initial_state(self, num_envs: int, device=None) -> torch.Tensor:
        return torch.zeros(num_envs, self.hidden_size, device=device or self.cell.weight_hh.device)

    def forward(self, inputs, state, episode_starts):
        outputs = []
        for t in range(inputs.shape[1]):
            state = self.cell(inputs[:, t], state * (~episode_starts[:, t, None]).to(state.dtype))
            outputs.append(state)
        return torch.stack(outputs, dim=1), state

    def snapshot(self, state: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden": state.detach().clone()}

    def restore(self, snapshot: dict[str, torch.Tensor]) -> torch.Tensor:
        return snapshot["hidden"]


class MLPBody(MemoryBody):
    """Two ReLU layers on each step alone: no memory (its state is None)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.layers = nn.Sequential(
            nn.ReLU(), nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, hidden_size), nn.ReLU()
        )

    def initial_state(self, num_envs: int, device=None):
        return None

    def forward(self, inputs, state, episode_starts):
        return self.layers(inputs), None

    def snapshot(self, state) -> dict[str, torch.Tensor]:
        return {}

    def restore(self, snapshot: dict[str, torch.Tensor]):
        return None


@dataclass
class PolicyOutput:
    logits: torch.Tensor  # [envs, steps, actions]
    values: torch.Tensor  # [envs, steps]
    state: object


@dataclass
class PolicyStep:
    actions: torch.Tensor  # [envs]
    log_probs: torch.Tensor  # [envs]
    values: torch.Tensor  # [envs]
    state: object


class MemoryPolicy(nn.Module):
    """Observation encoder -> memory body -> action logits and value. Discrete action spaces."""

    def __init__(self, observation_space, action_space, body: MemoryBody):
        super().__init__()
        import gymnasium as gym

        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"action_space must be Discrete, got {action_space}")
        self.num_actions = int(action_space.n)
        self.action_offset = int(action_space.start)
        self.encoder = ObservationEncoder(observation_space, body.hidden_size)
        self.body = body
        self.policy_head = nn.Linear(body.hidden_size, self.num_actions)
        self.value_head = nn.Linear(body.hidden_size, 1)

    # ----------------------------------------------------------------------------------------------------------------
    # construction
    @classmethod
    def gtrxl(cls, observation_space, action_space, config: GTrXLConfig | None = None, **config_fields):
        """A GTrXL policy; `config_fields` build the `GTrXLConfig` (vocab_size is 1: observations come in as
        `inputs_embeds`). `gate_type="trxl_i"` gives TrXL-I."""
        if config is None:
            config = GTrXLConfig(**{"vocab_size": 1, **config_fields})
        elif config_fields:
            raise ValueError(f"pass either a config or config fields, not both (got {sorted(config_fields)})")
        return cls(observation_space, action_space, GTrXLBody(config))

    @classmethod
    def gru(cls, observation_space, action_space, hidden_size: int):
        return cls(observation_space, action_space, GRUBody(hidden_size))

    @classmethod
    def mlp(cls, observation_space, action_space, hidden_size: int):
        return cls(observation_space, action_space, MLPBody(hidden_size))

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ----------------------------------------------------------------------------------------------------------------
    # the memory
    def initial_state(self, num_envs: int):
        return self.body.initial_state(num_envs, device=self.policy_head.weight.device)

    def snapshot(self, state) -> dict[str, torch.Tensor]:
        return self.body.snapshot(state)

    def restore(self, snapshot: dict[str, torch.Tensor]):
        return self.body.restore(snapshot)

    # ----------------------------------------------------------------------------------------------------------------
    # running
    def _tensor(self, value, dtype=None) -> torch.Tensor:
        return torch.as_tensor(value, dtype=dtype, device=self.policy_head.weight.device)

    def forward(self, observations, state, episode_starts) -> PolicyOutput:
        """observations `[envs, steps, *observation_shape]`, episode_starts `[envs, steps]` (True where an episode
        begins: that step sees nothing of the memory before it)."""
        observations = self._tensor(observations)
        episode_starts = self._tensor(episode_starts, torch.bool)
        if episode_starts.shape != observations.shape[:2]:
            raise ValueError(f"episode_starts has shape {tuple(episode_starts.shape)}, expected [envs, steps] = "
                             f"{tuple(observations.shape[:2])} from the observations")
        hidden, state = self.body(self.encoder(observations), state, episode_starts)
        return PolicyOutput(self.policy_head(hidden), self.value_head(hidden).squeeze(-1), state)

    @torch.no_grad()
    def act(self, observations, state, episode_starts, greedy: bool = False) -> PolicyStep:
        """One step in every env: observations `[envs, *observation_shape]`, episode_starts `[envs]`. Returns the
        actions (sampled, or the most likely with `greedy`), their log-probabilities, the values and the next state."""
        observations = self._tensor(observations)
        episode_starts = self._tensor(episode_starts, torch.bool)
        out = self(observations[:, None], state, episode_starts[:, None])
        logits = out.logits[:, 0]
        distribution = torch.distributions.Categorical(logits=logits)
        actions = logits.argmax(-1) if greedy else distribution.sample()
        return PolicyStep(actions + self.action_offset, distribution.log_prob(actions), out.values[:, 0], out.state)

    def evaluate_actions(self, observations, state, episode_starts, actions):
        """Log-probabilities of `actions` `[envs, steps]`, the entropies and the values over a stored segment that
        starts from `state` (e.g. `restore` of the snapshot taken when acting reached it)."""
        out = self(observations, state, episode_starts)
        distribution = torch.distributions.Categorical(logits=out.logits)
        actions = self._tensor(actions).long() - self.action_offset
        return distribution.log_prob(actions), distribution.entropy(), out.values


AGENTS = ("gtrxl", "trxl_i", "gru", "mlp")
DEFAULT_GTRXL_FIELDS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, mem_len=64)


def make_policy(agent: str, observation_space, action_space, **gtrxl_fields) -> MemoryPolicy:
    """One of `AGENTS` at an equal parameter budget: "gtrxl" (GRU-gated GTrXL) and "trxl_i" (identity map
    reordering, no gates) from `DEFAULT_GTRXL_FIELDS` updated by `gtrxl_fields`; "gru" and "mlp" of the width whose
    parameter count is closest to that GTrXL policy's."""
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}; known: {', '.join(AGENTS)}")
    fields = {**DEFAULT_GTRXL_FIELDS, **gtrxl_fields}
    if agent in ("gtrxl", "trxl_i"):
        return MemoryPolicy.gtrxl(observation_space, action_space, gate_type="gru" if agent == "gtrxl" else "trxl_i",
                                  **fields)
    budget = MemoryPolicy.gtrxl(observation_space, action_space, gate_type="gru", **fields).num_parameters
    build = getattr(MemoryPolicy, agent)
    width = parameter_matched_hidden_size(lambda h: build(observation_space, action_space, h), budget)
    return build(observation_space, action_space, width)


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
    "GRUBody",
    "GTrXLBody",
    "MLPBody",
    "MemoryBody",
    "MemoryPolicy",
    "ObservationEncoder",
    "PolicyOutput",
    "PolicyStep",
    "make_policy",
    "parameter_matched_hidden_size",
]
