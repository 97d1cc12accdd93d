"""Segment-level recurrence memory for the Transformer-XL family, carried as the model's cache (`cache`): `MemoryCache`.

A Transformer-XL memory is not a key/value cache: for every layer it holds the hidden states that *entered* that
layer at the last `mem_len` positions (Dai et al. 2019, eq. for h~_{tau+1}^{n-1}). Keys and values are recomputed from
them with the current weights. The states are stored batch-first, `[batch, memory_length, hidden_size]`, detached
(stop-gradient, SG(.) in the paper) and trimmed to `mem_len`. A boolean `memory_mask` marks which memory slots may be
attended to (padding and reset rows are masked out).

In evaluation (no autograd) the cache also keeps what lets the next pass project only its own positions (the keys and
values of the memory slots, the relative position table and its projections): its `reuse`, a
`txv_xl_reuse.EvaluationReuse`.

After a one-position step (`txv_xl_step`, entered through the models' `forward_step`) the cache holds its memory in
the step's layout instead (`MemoryCache.step_layout`, a `txv_xl_step.StepMemory`), until anything else changes it.
"""

from __future__ import annotations

import torch
import torch.utils._pytree

from .txv_cache import RowStateCache
from .txv_xl_reuse import AppendBuffers, EvaluationReuse
from .txv_xl_step import StepMemory


class MemoryLayer:
    """One layer's view of a `MemoryCache`, so that code walking `cache.layers` (transformers' generation utilities)
    finds one object per layer. An XL memory holds the hidden states that entered the layer, not keys and values:
    `keys` and `values` both give that memory, `[batch, memory_length, hidden]` (None before the first update)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: MemoryCache, layer_idx: int):
        self._cache, self.layer_idx = cache, layer_idx

    @property
    def memory(self) -> torch.Tensor | None:
        return self._cache.layer_memory(self.layer_idx)

    keys = values = memory

    @property
    def is_initialized(self) -> bool:
        return self._cache.is_initialized

    def get_seq_length(self) -> int:
        return self._cache.get_seq_length()

    def get_max_length(self) -> int:
        return self._cache.mem_len


class MemoryCache(RowStateCache):
    """Per-layer Transformer-XL memory.

    Args:
        num_layers: number of layers whose inputs are remembered.
        mem_len: number of positions kept after each update (0 disables memory).
        memories: optional list of `[batch, length, hidden]` tensors, one per layer.
        memory_mask: optional `[batch, length]` bool tensor, True where a memory slot may be attended to.
        memory_init: what a fresh row starts with, "zeros" or "empty" (see `initial`); `reset_rows` uses it by
            default, so a reset row is exactly a fresh row of the model that made the cache.
        model_type: the `config.model_type` of the model that made the cache (None: any model may read it); a model
            of another type refuses it (`check_compatible`).
    `len(cache) == len(cache.layers) == num_layers` (one `MemoryLayer` view per layer).
    """

    def __init__(
        self,
        num_layers: int,
        mem_len: int,
        memories: list[torch.Tensor] | None = None,
        memory_mask: torch.Tensor | None = None,
        seen_tokens: int = 0,
        memory_init: str = "empty",
        model_type: str | None = None,
    ):
        super().__init__()
        if mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {mem_len}")
        if memory_init not in ("zeros", "empty"):
            raise ValueError(f"memory_init must be 'zeros' or 'empty', got {memory_init!r}")
        self.num_layers = num_layers
        self.mem_len = mem_len
        self.memory_init = memory_init
        self.model_type = model_type
        self.layers = [MemoryLayer(self, i) for i in range(num_layers)]
        # the memory in one of two layouts: per layer `[batch, length, hidden]` tensors and the mask (`memories`,
        # `memory_mask`), or, after a one-position step, the step's buffers (`_step`, a `txv_xl_step.StepMemory`),
        # of which `memories` and `memory_mask` are then views (`_step_window`)
        self._memories: list[torch.Tensor] | None = None
        self._memory_mask: torch.Tensor | None = None
        self._step = None
        self._step_window_read = True  # whether `_memories` and `_memory_mask` show the step's window
        self._all_real_mask: torch.Tensor | None = None
        self._buffers = AppendBuffers()  # in-place appends of the memory (evaluation)
        # what evaluation keeps besides the memory: its keys and values, the relative position table
        self.reuse = EvaluationReuse(num_layers)
        self.seen_tokens = seen_tokens
        if memories is not None:
            self._set(list(memories), memory_mask)

    # ----------------------------------------------------------------------------------------------------------------
    # construction helpers
    @classmethod
    def initial(
        cls, num_layers, mem_len, batch_size, hidden_size, memory_init, dtype, device, model_type=None
    ) -> MemoryCache:
        """The memory a first segment starts with: `memory_init="zeros"` gives `mem_len` zero vectors that are attended
        to (TF code and transformers' legacy TransfoXL), `"empty"` gives no memory (the original PyTorch code)."""
        cache = cls(num_layers, mem_len, memory_init=memory_init, model_type=model_type)
        if memory_init == "zeros" and mem_len > 0:
            zeros = torch.zeros(batch_size, mem_len, hidden_size, dtype=dtype, device=device)
            cache._set([zeros] * num_layers, None)
        return cache

    @classmethod
    def from_legacy_mems(
        cls, mems, mem_len: int, memory_init: str = "empty", model_type: str | None = None
    ) -> MemoryCache:
        """Builds a cache from the legacy `mems` list (one time-major `[length, batch, hidden]` tensor per layer)."""
        if not isinstance(mems, (list, tuple)) or not all(isinstance(m, torch.Tensor) and m.dim() == 3 for m in mems):
            raise ValueError("`mems` must be a list with one [memory_length, batch, hidden_size] tensor per layer")
        memories = [m.transpose(0, 1) for m in mems]
        seen_tokens = memories[0].shape[1] if memories else 0
        return cls(len(mems), mem_len, memories, None, seen_tokens, memory_init, model_type)

    def to_legacy_mems(self) -> list[torch.Tensor] | None:
        """The memory in the legacy layout: a list of time-major `[length, batch, hidden]` tensors."""
        if self.memories is None:
            return None
        return [m.transpose(0, 1) for m in self.memories]

    # ----------------------------------------------------------------------------------------------------------------
    # the state protocol (`RowStateCache`)
    def to_state(self) -> dict:
        """The memory as plain tensors, ints and strings: `memory [batch, layers, length, hidden]` (every layer's
        memory, stacked: a new tensor) and `memory_mask [batch, length]` (a copy), both None while the memory is
        empty; `seen_tokens`; and what the cache was made with: `num_layers`, `mem_len`, `memory_init`, `model_type`.
        What is cached besides the memory (its keys and values, the position table) is left out: recomputed.
        Checkpoints keep this dict; an RL snapshot keeps its two tensors (batch first, so that snapshots stack and
        index per environment)."""
        empty = self.memories is None
        return {
            "memory": None if empty else torch.stack(self.memories, dim=1),
            "memory_mask": None if empty else self.memory_mask.clone(),
            "seen_tokens": self.seen_tokens,
            "num_layers": self.num_layers,
            "mem_len": self.mem_len,
            "memory_init": self.memory_init,
            "model_type": self.model_type,
        }

    @classmethod
    def from_state(cls, state: dict) -> MemoryCache:
        memory, memory_mask, seen_tokens, num_layers, mem_len, memory_init, model_type = cls._state_fields(
            state, "memory", "memory_mask", "seen_tokens", "num_layers", "mem_len", "memory_init", "model_type"
        )
        cache = cls(num_layers, mem_len, seen_tokens=int(seen_tokens), memory_init=memory_init, model_type=model_type)
        if memory is not None:
            if not isinstance(memory, torch.Tensor) or memory.dim() != 4 or memory.shape[1] != num_layers:
                shape = tuple(memory.shape) if isinstance(memory, torch.Tensor) else type(memory).__name__
                raise ValueError(
                    f"the memory state's `memory` must be [batch, layers={num_layers}, length, hidden], got {shape}"
                )
            if not isinstance(memory_mask, torch.Tensor):
                raise ValueError(f"the memory state's `memory_mask` must be a tensor, got {type(memory_mask).__name__}")
            cache._set(list(memory.unbind(1)), memory_mask)
        return cache

    def _set(self, memories: list[torch.Tensor], memory_mask: torch.Tensor | None):
        if len(memories) != self.num_layers:
            raise ValueError(f"memory has {len(memories)} layers, expected {self.num_layers}")
        first = memories[0]
        for i, m in enumerate(memories):
            if m.dim() != 3 or m.shape != first.shape:
                raise ValueError(f"memory of layer {i} has shape {tuple(m.shape)}, expected {tuple(first.shape)}")
        all_real = memory_mask is None
        if memory_mask is None:
            memory_mask = torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
        elif memory_mask.shape != first.shape[:2]:
            raise ValueError(f"memory_mask has shape {tuple(memory_mask.shape)}, expected {tuple(first.shape[:2])}")
        self._step = None
        self._memories = [m.detach() if m.requires_grad else m for m in memories]
        self._memory_mask = memory_mask.to(torch.bool)
        # the mask known (without reading it) to be all True: `key_mask` then needs no mask and no host sync
        self._all_real_mask = self._memory_mask if all_real else None
        self.reuse.forget_memory_key_values()

    # ----------------------------------------------------------------------------------------------------------------
    # the memory and its two layouts
    @property
    def memories(self) -> list[torch.Tensor] | None:
        """Every layer's memory, `[batch, length, hidden]` (None while empty)."""
        if not self._step_window_read:
            self._read_step_window()
        return self._memories

    @memories.setter
    def memories(self, memories: list[torch.Tensor] | None):
        self._leave_step_layout()
        self._memories = memories

    @property
    def memory_mask(self) -> torch.Tensor | None:
        """`[batch, length]` bool, True where a memory slot may be attended to (None while empty)."""
        if not self._step_window_read:
            self._read_step_window()
        return self._memory_mask

    @memory_mask.setter
    def memory_mask(self, memory_mask: torch.Tensor | None):
        self._leave_step_layout()
        self._memory_mask = memory_mask

    def _read_step_window(self):
        self._memories, self._memory_mask = self._step.memory()
        self._step_window_read = True

    def _leave_step_layout(self):
        """Before any change of the memory other than a step: the memory is the step's window, and the next step
        starts from the changed memory (`step_layout`), not from the step's buffers."""
        if self._step is not None:
            if not self._step_window_read:
                self._read_step_window()
            self._step = None

    def step_layout(self, mem_len: int):
        """This memory in the layout of the one-position step (`txv_xl_step.StepMemory`: buffers of `mem_len` slots,
        the keys and values with them), made from `to_state()` unless the cache holds it already (nothing but steps
        has changed the memory since). A step advances it in place, then calls `stepped()`."""
        if self._step is None or self._step.mem_len != mem_len:
            self._step = StepMemory.from_state(self.to_state(), mem_len)
            self._step_window_read = False
        return self._step

    def stepped(self):
        """After a one-position step advanced `step_layout()`: the memory is the step's window (read when asked for),
        one more token seen."""
        self._step_window_read = False
        self._all_real_mask = None
        self.reuse.forget_memory_key_values()
        self.seen_tokens += 1

    def forget_key_values(self):
        """Drops everything kept besides the memory (`reuse`: the memory's keys and values, the relative position
        table and its projections; all recomputed when next needed)."""
        self.reuse.forget()

    # ----------------------------------------------------------------------------------------------------------------
    # what the model reads and writes
    @property
    def memory_length(self) -> int:
        if self._step is not None:
            return self._step.mem_len
        return 0 if self._memories is None else self._memories[0].shape[1]

    @property
    def batch_size(self) -> int | None:
        if self._step is not None:
            return self._step.batch_size
        return None if self._memories is None else self._memories[0].shape[0]

    def layer_memory(self, layer_idx: int) -> torch.Tensor | None:
        return None if self.memories is None else self.memories[layer_idx]

    def _first_state(self) -> torch.Tensor | None:
        return None if self.memories is None else self.memories[0]

    def key_mask(self, input_mask: torch.Tensor | None, query_length: int) -> torch.Tensor | None:
        """`[batch, memory_length + query_length]` bool, True where a key may be attended to (real memory slots and
        real tokens of the segment, `input_mask` True = real), or None when every key may. The memory counts as all
        real only when the cache knows it without reading it (no host synchronisation, and the same graph under
        torch.compile): a fresh memory and the updates and resets that keep it so; otherwise the mask is built."""
        memory_all_real = self.memory_mask is None or self.memory_mask is self._all_real_mask
        if input_mask is None and memory_all_real:
            return None
        if input_mask is None:
            input_mask = torch.ones(
                self.memory_mask.shape[0], query_length, dtype=torch.bool, device=self.memory_mask.device
            )
        return input_mask if self.memory_mask is None else torch.cat([self.memory_mask, input_mask], dim=1)

    def update_memories(self, layer_inputs: list[torch.Tensor], input_mask: torch.Tensor | None):
        """Appends the inputs every layer just saw and keeps the last `mem_len` positions (detached).

        `input_mask` is `[batch, new_length]` bool (True = real token) or None (all real)."""
        new_length = layer_inputs[0].shape[1]
        self.seen_tokens += new_length
        pending = self.reuse.take_pending()
        if self.mem_len == 0:
            return
        # the mask is kept only when some slot may be masked (building it for an all-real memory costs a pass)
        all_real = input_mask is None and (self.memories is None or self.memory_mask is self._all_real_mask)
        mask = None
        # without autograd the memory is appended to in place (`AppendBuffers`); with it, a copy (the memory read by
        # this pass may be saved for its backward)
        in_place = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        with torch.no_grad():
            if self.memories is None:
                memories = [h[:, -self.mem_len :] for h in layer_inputs]
            elif in_place:
                memories = [
                    self._buffers.append(("memory", i), m, h, 1)[:, -self.mem_len :]
                    for i, (m, h) in enumerate(zip(self.memories, layer_inputs))
                ]
            else:
                memories = [torch.cat([m, h], dim=1)[:, -self.mem_len :] for m, h in zip(self.memories, layer_inputs)]
            if not all_real:
                if input_mask is None:
                    input_mask = torch.ones(layer_inputs[0].shape[:2], dtype=torch.bool, device=layer_inputs[0].device)
                mask = input_mask if self.memories is None else torch.cat([self.memory_mask, input_mask], dim=1)
                mask = mask[:, -self.mem_len :]
            self._set(memories, mask)
        if in_place:
            for i, memory in enumerate(self.memories):
                self._buffers.keep(("memory", i), memory)
        self.reuse.keep_pending(pending, self.memory_length)

    def reset_rows(self, done: torch.Tensor, memory_init: str | None = None):
        """Forgets the memory of the rows where `done` is True (e.g. an episode ended), in place.

        With `memory_init="zeros"` a reset row gets zero vectors that are attended to, like a fresh row; with
        `"empty"` its memory slots are masked out, so it attends only to its new tokens, like a fresh row. The
        default is the cache's own `memory_init` (that of the model that made it): a reset row is then a fresh row."""
        memory_init = memory_init or self.memory_init
        if memory_init not in ("zeros", "empty"):
            raise ValueError(f"memory_init must be 'zeros' or 'empty', got {memory_init!r}")
        if self.memories is None:
            return
        done = done.to(device=self.memory_mask.device, dtype=torch.bool).view(-1)
        if done.shape[0] != self.batch_size:
            raise ValueError(f"`done` has {done.shape[0]} rows, the memory has batch size {self.batch_size}")
        if memory_init == "zeros":
            keep = (~done)[:, None, None].to(self.memories[0].dtype)
            self.memories = [m * keep for m in self.memories]
            # the zero vectors are attended: their keys and values (through a pre-norm, not zero) are recomputed, as
            # are those of the pass under way (computed from the old memory)
            self.reuse.forget_memory_key_values()
            all_real = self.memory_mask is self._all_real_mask
            self.memory_mask = self.memory_mask | done[:, None]
            self._all_real_mask = self.memory_mask if all_real else None
        else:
            # "empty": the reset slots are masked out, so neither their vectors (left as they are: no pass over the
            # memory, which a step of an acting agent would pay) nor their cached keys and values are ever attended
            self.memory_mask = self.memory_mask & ~done[:, None]

    def clone(self) -> MemoryCache:
        copy = MemoryCache(
            self.num_layers,
            self.mem_len,
            seen_tokens=self.seen_tokens,
            memory_init=self.memory_init,
            model_type=self.model_type,
        )
        if self.memories is not None:
            copy._set([m.clone() for m in self.memories], self.memory_mask.clone())
        copy.reuse = self.reuse.clone()
        return copy

    # ----------------------------------------------------------------------------------------------------------------
    # the Cache interface used by `generate()`
    def __repr__(self):
        return f"MemoryCache(num_layers={self.num_layers}, mem_len={self.mem_len}, memory_length={self.memory_length})"

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.mem_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.memory_length + query_length, 0

    def reset(self):
        self.memories, self.memory_mask, self.seen_tokens = None, None, 0
        self._buffers = AppendBuffers()
        self.reuse.reset()

    def crop(self, max_length: int):
        raise NotImplementedError(
            "A Transformer-XL memory cannot be cropped: it keeps only the last mem_len hidden states, so it cannot be "
            "rolled back (assisted decoding is not supported)"
        )

    def _map_rows(self, fn):
        if self._step is not None:  # (beam search reorders every step: the step's buffers follow the rows)
            self._step.map_rows(fn)
            self._step_window_read = False
            return
        all_real = self.memory_mask is not None and self.memory_mask is self._all_real_mask
        super()._map_rows(fn)
        self.reuse.map_rows(fn)
        if all_real:  # rows of an all-real memory (beam reordering, expansion, selection) are all real
            self._all_real_mask = self.memory_mask

    def _row_tensors(self) -> dict:
        return {
            "memories": self.memories,
            "memory_mask": self.memory_mask,
        }


def _flatten_memory(cache: MemoryCache):
    """The pytree children of a `MemoryCache`: the tensors of its state; the rest of the state is the context."""
    state = cache.to_state()
    children = [state.pop(name) for name in PYTREE_CHILDREN]
    return children, tuple(sorted(state.items()))


def _flatten_memory_with_keys(cache: MemoryCache):
    children, context = _flatten_memory(cache)
    return [(torch.utils._pytree.MappingKey(name), child) for name, child in zip(PYTREE_CHILDREN, children)], context


def _unflatten_memory(children, context) -> MemoryCache:
    return MemoryCache.from_state({**dict(context), **dict(zip(PYTREE_CHILDREN, children))})


PYTREE_CHILDREN = ("memory", "memory_mask")

# A pytree node, so that `torch.export` and `torch.compile` can return (and take) the memory as the cache.
torch.utils._pytree.register_pytree_node(
    MemoryCache,
    _flatten_memory,
    _unflatten_memory,
    serialized_type_name=f"{__name__}.MemoryCache",
    flatten_with_keys_fn=_flatten_memory_with_keys,
)


def memory_for_input(
    memory, new_memory, *, batch_size: int, hidden_size: int, num_layers: int, model_type: str | None = None
) -> MemoryCache:
    """The memory a forward pass reads: the given cache checked against the input, or `new_memory()` when None."""
    if memory is None:
        return new_memory()
    if not isinstance(memory, MemoryCache):
        raise ValueError(f"the cache must be the MemoryCache returned by this model, got {type(memory).__name__}")
    memory.check_compatible(
        batch_size=batch_size, hidden_size=hidden_size, num_layers=num_layers, model_type=model_type
    )
    return memory


__all__ = ["MemoryCache", "MemoryLayer", "memory_for_input"]
