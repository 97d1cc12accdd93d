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

`episode_clock` (off by default; `make_policy(..., episode_clock=True)`) adds the step within the episode to the
encoded observations (`EpisodeClock`): an absolute position, counted from the agent's own episode starts, as the
episodic PPO-TrXL of Pleines et al. (2023) gives its memory. GTrXL's attention knows only how far back a slot lies; a
task whose answer lies at a distance that depends on the step within the episode (POPGym's Autoencode: answer t,
counting from 0, is the card shown 2t steps before, the cards read back in reverse) needs the clock to find it
(benchmarks/RESULTS.md, issue 30).

Learning from stored segments (truncated back-propagation): `snapshot(state)` turns a state into fixed-shape,
batch-first tensors (stored at the start of each segment while acting, indexable per environment), `restore` turns a
stack of them back into a state, and `forward` over the segment with its `episode_starts` then sees exactly what
acting saw, step by step (`tests/test_rl_policy.py`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..configuration_gtrxl import GTrXLConfig
from ..modeling_gtrxl import GTrXLModel
from ..txv_xl_memory import MemoryCache


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
                raise ValueError(
                    f"a MultiDiscrete observation_space must be one-dimensional, got nvec shape "
                    f"{observation_space.nvec.shape}"
                )
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
                raise ValueError(
                    f"observations hold value {int(outside[0]) + self.offset} outside the observation "
                    f"space {self.observation_space}"
                )
        return torch.cat(
            [nn.functional.one_hot(codes[..., i], n) for i, n in enumerate(self.categories)], dim=-1
        ).float()

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(observations))


# The clock's default periods (in steps): the powers of 2 from 4 to 512, so that sin / cos of the step tell apart the
# steps of an episode up to a few hundred steps, and the products of a query's and a key's features (what attention
# computes) can express a fixed relation between their two steps, e.g. Autoencode's key at step c - s for a query
# at step s.
EPISODE_CLOCK_PERIODS = tuple(2.0**k for k in range(2, 10))


class EpisodeClock(nn.Module):
    """The step within the episode (0 at its first step) as sin and cos of 2 pi step / period for each of `periods`,
    mapped to the hidden size by a learned linear layer (no bias), added to the encoded observations."""

    def __init__(self, periods, hidden_size: int):
        super().__init__()
        given = periods
        try:  # a string is iterable too: "48" would read as periods 4 and 8
            periods = None if isinstance(periods, (str, bytes)) else [float(p) for p in periods]
        except (TypeError, ValueError):
            periods = None
        if not periods or any(not math.isfinite(p) or p <= 0 for p in periods):
            raise ValueError(f"episode_clock periods must be positive finite numbers (a list of them), got {given!r}")
        self.periods = periods
        self.register_buffer(
            "angular_speeds", 2 * math.pi / torch.tensor(periods, dtype=torch.float64), persistent=False
        )
        self.projection = nn.Linear(2 * len(periods), hidden_size, bias=False)

    @staticmethod
    def episode_steps(episode_starts: torch.Tensor, steps_before: torch.Tensor) -> torch.Tensor:
        """The step within its episode of each position `[envs, steps]`: 0 where an episode starts, else one more
        than the position before; `steps_before [envs]` is the step the first position would have (the steps the
        env's episode had taken before this call)."""
        envs, steps = episode_starts.shape
        if steps == 1:  # acting: one position per env
            return torch.where(episode_starts[:, 0], 0, steps_before)[:, None]
        index = torch.arange(steps, device=episode_starts.device).expand(envs, steps)
        last_start = torch.where(episode_starts, index, -1).cummax(dim=1).values  # the latest start at or before
        return torch.where(last_start >= 0, index - last_start, steps_before[:, None] + index)

    def forward(self, episode_steps: torch.Tensor, dtype) -> torch.Tensor:
        # in float64, so that a step in the millions keeps its phase to well within a period
        angles = episode_steps.to(torch.float64)[..., None] * self.angular_speeds
        features = torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)
        return self.projection(features)


@dataclass
class ClockedState:
    """The state of a policy with an `EpisodeClock`: its body's state and, per env, the steps its episode has taken."""

    body: object
    episode_steps: torch.Tensor  # [envs], long


class MemoryBody(nn.Module):
    """What a policy needs from its memory: `initial_state`, `forward(inputs [envs, steps, hidden], state,
    episode_starts [envs, steps]) -> (outputs, state)`, and `snapshot` / `restore` between a state and a dict of
    batch-first tensors of fixed shape."""

    hidden_size: int
    kind: str  # the name `BODIES` knows it by (saved in the policy's config.json)

    def to_config(self) -> dict:
        """What `from_config` rebuilds the body from (JSON-ready)."""
        return {"kind": self.kind, "hidden_size": self.hidden_size}

    @classmethod
    def from_config(cls, data: dict) -> MemoryBody:
        return cls(data["hidden_size"])

    def after_optimizer_step(self):
        """Called by `train_ppo` after every optimiser step."""

    def initial_state(self, num_envs: int, device=None):
        raise NotImplementedError

    def snapshot(self, state) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def restore(self, snapshot: dict[str, torch.Tensor]):
        raise NotImplementedError


class GTrXLBody(MemoryBody):
    """The GTrXL backbone (`GTrXLModel`) over encoded observations; the state is its `MemoryCache`."""

    kind = "gtrxl"

    def __init__(self, config: GTrXLConfig):
        super().__init__()
        if config.mem_len < 0:
            raise ValueError(f"config.mem_len must be >= 0, got {config.mem_len}")
        self.config = config
        self.hidden_size, self.mem_len = config.hidden_size, config.mem_len
        self.model = GTrXLModel(config)  # (which keeps what its one-step path needs: `XLBackboneMixin`)

    @property
    def memoryless(self) -> bool:
        """`mem_len=0`: every step attends only to itself (GTrXL's own network without a memory, a baseline of
        exactly its parameters); the state is None."""
        return self.mem_len == 0

    def to_config(self) -> dict:
        return {"kind": self.kind, "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, data: dict) -> GTrXLBody:
        return cls(GTrXLConfig.from_dict(data["config"]))

    def after_optimizer_step(self):
        self.model.clamp_spans_()  # keeps learned adaptive spans in [0, attn_span]; a no-op without adaptive span

    def initial_state(self, num_envs: int, device=None) -> MemoryCache | None:
        """`mem_len` slots per env, masked out (with `memory_init="zeros"`: zero vectors that are attended), so the
        memory has its full, fixed shape from the first step on."""
        if self.memoryless:
            return None
        config, parameter = self.config, next(self.parameters())
        device = device or parameter.device
        memory = torch.zeros(
            num_envs, config.num_hidden_layers, config.mem_len, config.hidden_size, dtype=parameter.dtype, device=device
        )
        mask = torch.full((num_envs, config.mem_len), config.memory_init == "zeros", dtype=torch.bool, device=device)
        return self.restore({"memory": memory, "memory_mask": mask})

    def _memory_state(self, snapshot: dict[str, torch.Tensor]) -> dict:
        """The `MemoryCache` state of a snapshot: its two tensors, the rest from this body's config."""
        config = self.config
        return {
            "memory": snapshot["memory"],
            "memory_mask": snapshot["memory_mask"],
            "seen_tokens": 0,
            "num_layers": config.num_hidden_layers,
            "mem_len": config.mem_len,
            "memory_init": config.memory_init,
            "model_type": config.model_type,
        }

    def forward(self, inputs, state, episode_starts):
        if self.memoryless:  # each step is its own sequence of one
            envs, steps, hidden = inputs.shape
            out = self.model(inputs_embeds=inputs.reshape(envs * steps, 1, hidden), use_cache=False)
            return out.last_hidden_state.reshape(envs, steps, hidden), None
        if state is not None and state.batch_size not in (None, inputs.shape[0]):
            raise ValueError(
                f"the state holds the memory of {state.batch_size} envs, but {inputs.shape[0]} observations came"
            )
        # acting: one step per call through the model's one door into the one-position step (None where it cannot
        # serve: learning, several steps, a model it does not support), the state advanced in place
        if state is not None:
            hidden = self.model.forward_step(inputs, state, episode_starts=episode_starts)
            if hidden is not None:
                return hidden, state
        # the backbone itself (the model's forward would only check `inputs_embeds`, made here by the encoder, and
        # wrap the same two results in a ModelOutput)
        out = self.model.forward_segment(inputs, cache=state, episode_starts=episode_starts)
        return out.last_hidden_state, out.cache

    def snapshot(self, state: MemoryCache | None) -> dict[str, torch.Tensor]:
        """The two tensors of the memory's state (`MemoryCache.to_state`): every layer's memory, `memory [envs,
        layers, mem_len, hidden]`, and `memory_mask [envs, mem_len]`, new tensors (acting goes on updating the state
        itself), batch first (snapshots stack and index per env); the rest of the state is this body's config."""
        if self.memoryless:
            return {}
        memory = None if state is None else state.to_state()
        length = "no memory" if memory is None or memory["memory"] is None else memory["memory"].shape[2]
        if length != self.mem_len:
            raise ValueError(
                f"the GTrXL state must hold mem_len={self.mem_len} slots (start from `initial_state`), got {length}"
            )
        return {"memory": memory["memory"], "memory_mask": memory["memory_mask"]}

    def restore(self, snapshot: dict[str, torch.Tensor]) -> MemoryCache | None:
        if self.memoryless:
            return None
        return MemoryCache.from_state(self._memory_state(snapshot))


class GRUBody(MemoryBody):
    """One GRU cell stepped through time; a row's hidden state is zeroed where its episode starts."""

    kind = "gru"

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

    kind = "mlp"

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


BODIES = {"gtrxl": GTrXLBody, "gru": GRUBody, "mlp": MLPBody}
POLICY_FORMAT = "hf_txvariants.rl.MemoryPolicy"
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


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


class MemoryPolicy(nn.Module):
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

    # ----------------------------------------------------------------------------------------------------------------
    # saving, loading, sharing
    def to_config(self) -> dict:
        """config.json: the body (its kind and config), both spaces and the episode clock's periods if it has one, all
        plain JSON."""
        from .spaces import space_to_dict

        config = {
            "format": POLICY_FORMAT,
            "format_version": 1,
            "body": self.body.to_config(),
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
        }
        if self.clock is not None:  # version 2: a release that reads version 1 only would drop the clock
            config.update(format_version=2, episode_clock=self.clock.periods)
        return config

    @classmethod
    def from_config(cls, config: dict) -> MemoryPolicy:
        from .spaces import space_from_dict

        if not isinstance(config, dict) or config.get("format") != POLICY_FORMAT:
            found = config.get("format") if isinstance(config, dict) else type(config).__name__
            raise ValueError(f"not a saved MemoryPolicy config (format {found!r}, expected {POLICY_FORMAT!r})")
        if config.get("format_version") not in (1, 2):
            raise ValueError(
                f"saved MemoryPolicy format_version {config.get('format_version')!r} is not supported "
                "(this release reads versions 1 and 2)"
            )
        body = config.get("body")
        if not isinstance(body, dict) or body.get("kind") not in BODIES:
            raise ValueError(f"the saved body must name one of {', '.join(BODIES)} as its 'kind', got {body!r}")
        return cls(
            space_from_dict(config["observation_space"]),
            space_from_dict(config["action_space"]),
            BODIES[body["kind"]].from_config(body),
            config.get("episode_clock"),
        )

    def save_pretrained(self, save_directory) -> list[str]:
        """Writes `config.json` (`to_config`) and `model.safetensors` into `save_directory`, through a temporary
        sibling folder renamed into place: a failure leaves no half-written folder. Returns the file names."""
        from pathlib import Path

        from safetensors.torch import save_file

        from ..txv_pretrained import atomic_directory

        save_directory = Path(save_directory)
        with atomic_directory(save_directory) as staging:
            (staging / CONFIG_NAME).write_text(json.dumps(self.to_config(), indent=2, sort_keys=True) + "\n")
            weights = {name: tensor.detach().cpu().contiguous() for name, tensor in self.state_dict().items()}
            save_file(weights, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        return sorted(p.name for p in save_directory.iterdir() if p.is_file())

    @classmethod
    def from_pretrained(
        cls, name_or_path, device=None, revision: str | None = None, token: str | None = None, cache_dir=None
    ):
        """A policy from a folder `save_pretrained` wrote, or from a Hub repo id (downloading only config.json and
        model.safetensors). Weights are read with safetensors; nothing is unpickled."""
        from pathlib import Path

        from safetensors.torch import load_file

        folder = Path(name_or_path)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(
                snapshot_download(
                    str(name_or_path),
                    revision=revision,
                    token=token,
                    cache_dir=cache_dir,
                    allow_patterns=[CONFIG_NAME, WEIGHTS_NAME],
                )
            )
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder} has no {name}: not a folder MemoryPolicy.save_pretrained wrote")
        try:
            config = json.loads((folder / CONFIG_NAME).read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{folder / CONFIG_NAME} is not valid JSON: {error}") from None
        policy = cls.from_config(config)
        policy.load_state_dict(load_file(str(folder / WEIGHTS_NAME)))
        return policy.to(device) if device is not None else policy

    def push_to_hub(
        self,
        repo_id: str,
        task: str | None = None,
        mean_return: float | None = None,
        private: bool = False,
        token: str | None = None,
        commit_message: str = "Upload MemoryPolicy",
        api=None,
        revision: str | None = None,
        create_pr: bool = False,
    ):
        """Creates `repo_id` (if needed) and uploads config.json, model.safetensors and a model card (README.md, with
        `task` and `mean_return` in its metadata when given) in one commit. Returns the commit info."""
        import tempfile
        from pathlib import Path

        from huggingface_hub import HfApi

        from .card import build_policy_card

        api = api or HfApi(token=token)
        with tempfile.TemporaryDirectory(prefix="txv-policy-push-") as tmp:
            folder = Path(tmp) / "repo"
            self.save_pretrained(folder)
            build_policy_card(self, repo_id, task, mean_return).save(folder / "README.md")
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=str(folder),
                repo_type="model",
                commit_message=commit_message,
                revision=revision,
                create_pr=create_pr,
            )


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
    "BODIES",
    "DEFAULT_GTRXL_FIELDS",
    "EPISODE_CLOCK_PERIODS",
    "RL_GATE_BIAS",
    "ClockedState",
    "EpisodeClock",
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
