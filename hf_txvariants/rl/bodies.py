"""The memory bodies of a `MemoryPolicy`, between its encoder and its heads, each owning its state:
- `GTrXLBody`: the GTrXL backbone (any `gate_type`, so also TrXL-I), fed `inputs_embeds`; its state is the
  `MemoryCache`, reset per environment through `episode_starts`. Acting goes through the model's one door into the
  one-position step (`GTrXLModel.forward_step`), learning through the backbone over a segment (`forward_segment`).
- `GRUBody`: a GRU cell, its hidden state zeroed at episode starts (the baseline RL users pick).
- `MLPBody`: no memory at all (the memoryless floor).

Learning from stored segments (truncated back-propagation): `snapshot(state)` turns a state into fixed-shape,
batch-first tensors (stored at the start of each segment while acting, indexable per environment; for GTrXL the
tensors of the memory's state, `MemoryCache.to_state`), `restore` turns a stack of them back into a state, and
`forward` over the segment with its `episode_starts` then sees exactly what acting saw, step by step
(`tests/test_rl_policy.py`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..configuration_gtrxl import GTrXLConfig
from ..modeling_gtrxl import GTrXLModel
from ..txv_xl_memory import MemoryCache


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
        self.model = GTrXLModel(config)  # (which keeps what its one-step path needs: `forward_step`)

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
        # acting: one step per call through the model's one door into the one-position step (None where it cannot
        # serve: learning, several steps, a model it does not support, a state of other envs), the state advanced in
        # place
        if state is not None:
            hidden = self.model.forward_step(inputs, state, episode_starts=episode_starts)
            if hidden is not None:
                return hidden, state
            if state.batch_size not in (None, inputs.shape[0]):
                raise ValueError(
                    f"the state holds the memory of {state.batch_size} envs, but {inputs.shape[0]} observations came"
                )
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


__all__ = ["BODIES", "GRUBody", "GTrXLBody", "MLPBody", "MemoryBody"]
