"""What an XL-family memory keeps in evaluation besides the memory itself, so that a pass projects only its own
positions: `EvaluationReuse`, held by the `txv_xl_memory.MemoryCache` as its `reuse`.

- The keys and values each layer computed for the memory slots when they were its current segment (`KeyValueSlot`,
  one layer's access during a pass): with unchanged weights they equal the recomputed ones. They are trimmed with the
  memory, follow its rows (beam search), are dropped by a training pass, a row reset or a change of the weights, and
  are never used while autograd records.
- The relative position table (`relative_table`, the sinusoids of every distance seen so far) and each layer's
  projection of it (`KeyValueSlot.position_keys`): neither depends on the batch or the memory, so a step of
  `generate()` (one query against a memory of mem_len positions) projects only its own position, as a step against a
  key/value cache does.
- In-place appends (`AppendBuffers`) of the keys and values, as of the memory itself (which the cache appends with
  its own `AppendBuffers`).
"""

from __future__ import annotations

import torch

STEP_FRACTION = 8  # an append of one position or at most 1/STEP_FRACTION of the window is a step: room is kept


class AppendBuffers:
    """Appending to the tensors a cache keeps (the memory of each layer, its keys and values) in place, in evaluation.

    `append(name, window, new, dim)` is `torch.cat([window, new], dim)`; when `window` is the view this object last
    handed out under `name` (`keep(name, view)`), `new` is written into the preallocated buffer right after it and a
    view of the buffer is returned: no copy of the window, which a step of `generate()` or of an acting agent would
    otherwise pay per layer (the memory, keys and values: `[batch, mem_len, hidden]` each). For steps (an append of
    one position, or of at most 1/8 of the window) a buffer holds room for as many positions again as the window is
    long; when it is full, the window is copied to the start of a new buffer. A larger append (a segment in
    evaluation) gets a buffer of exactly `[window; new]`, as `torch.cat` would: room for further segments would
    double the memory, keys and values that evaluation holds per layer, to save one copy of the window in two.
    Only what lies after the last view handed out is ever written, so no tensor handed out (kept by the caller,
    returned as the cache) ever changes. Used only without autograd (an in-place write would invalidate the saved
    tensors of a graph); the cache drops the buffers whenever it replaces its tensors otherwise."""

    def __init__(self):
        self._entries: dict = {}  # name -> [buffer, dim, end (where the next entries go), the view last kept]

    def append(self, name, window: torch.Tensor, new: torch.Tensor, dim: int) -> torch.Tensor:
        entry = self._entries.get(name)
        length, added = window.shape[dim], new.shape[dim]
        if entry is None or entry[3] is not window or entry[2] + added > entry[0].shape[dim]:
            shape = list(window.shape)
            shape[dim] = length + added + (length if added <= max(1, length // STEP_FRACTION) else 0)
            buffer = window.new_empty(shape)
            buffer.narrow(dim, 0, length).copy_(window)
            entry = self._entries[name] = [buffer, dim, length, None]
        buffer, _, end, _ = entry
        buffer.narrow(dim, end, added).copy_(new)
        entry[2], entry[3] = end + added, None  # consumed: `keep` names the next window
        return buffer.narrow(dim, end - length, length + added)

    def keep(self, name, view: torch.Tensor):
        """Records `view` as the window to extend next when it is the last entries of what `append(name, ...)`
        returned last (any other tensor is not extended in place: it is copied into a new buffer)."""
        entry = self._entries.get(name)
        if entry is None or view._base is not entry[0]:
            return
        buffer, dim, end, _ = entry
        if view.data_ptr() == buffer.narrow(dim, end - view.shape[dim], view.shape[dim]).data_ptr():
            entry[3] = view


def is_row_suffix(rows: torch.Tensor, table: torch.Tensor) -> bool:
    """Whether `rows` is a view of the last rows of the contiguous `table` (same storage, same end)."""
    return (
        rows.dtype == table.dtype
        and rows.device == table.device
        and rows.is_contiguous()
        and rows.shape[1:] == table.shape[1:]
        and rows.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
        and rows.data_ptr() + rows.numel() * rows.element_size()
        == table.data_ptr() + table.numel() * table.element_size()
    )


class KeyValueSlot:
    """One layer's access, during one evaluation pass, to what its `EvaluationReuse` keeps (the
    `RelativePositionAttention` of layer `layer_idx` calls it; see `EvaluationReuse` for each method)."""

    def __init__(self, reuse: EvaluationReuse, layer_idx: int):
        self.reuse, self.layer_idx = reuse, layer_idx

    def lookup(self, weights_token: tuple, memory_length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.reuse.lookup(self.layer_idx, weights_token, memory_length)

    def extend(self, cached: tuple[torch.Tensor, torch.Tensor], key: torch.Tensor, value: torch.Tensor):
        return self.reuse.extend(self.layer_idx, cached, key, value)

    def keep(self, key: torch.Tensor, value: torch.Tensor, weights_token: tuple):
        self.reuse.keep(self.layer_idx, key, value, weights_token)

    def position_keys(self, weights_token: tuple, position_embeddings: torch.Tensor, project) -> torch.Tensor:
        return self.reuse.position_keys(self.layer_idx, weights_token, position_embeddings, project)


class EvaluationReuse:
    """The keys and values of a memory's slots (per layer, aligned with the memory: `memory_keys`, `memory_values`
    `[batch, heads, memory_length, head_dim]` and the weights that made them, `key_value_tokens`; None where not
    kept), the relative position table (`table`) and each layer's projection of it, for `num_layers` layers."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.memory_keys: list[torch.Tensor | None] | None = None
        self.memory_values: list[torch.Tensor | None] | None = None
        self.key_value_tokens: list[tuple | None] | None = None
        self._pending: list | None = None  # what the layers computed in the pass under way
        self._buffers = AppendBuffers()  # in-place appends of the keys and values
        # batch-independent, kept across updates (see `relative_table` and `position_keys`)
        self.table: torch.Tensor | None = None
        self._table_key: tuple | None = None
        self._position_keys: list = [None] * num_layers

    def forget_memory_key_values(self):
        """Drops the memory's keys and values (and those of a pass under way): recomputed when next needed."""
        self.memory_keys = self.memory_values = self.key_value_tokens = None
        self._pending = None

    def forget(self):
        """Drops everything kept: the memory's keys and values, the relative position table and its projections."""
        self.forget_memory_key_values()
        self.table = self._table_key = None
        self._position_keys = [None] * self.num_layers

    def reset(self):
        """`forget`, and the buffers of the in-place appends too."""
        self._buffers = AppendBuffers()
        self.forget()

    def map_rows(self, fn):
        """Applies `fn` (a `[rows, ...] -> [rows', ...]` selection, e.g. beam search's reordering) to the keys and
        values (the table and its projections do not depend on the rows)."""
        if self.memory_keys is not None:
            self.memory_keys = [None if k is None else fn(k) for k in self.memory_keys]
            self.memory_values = [None if v is None else fn(v) for v in self.memory_values]

    def clone(self) -> EvaluationReuse:
        """A new reuse holding copies of the memory's keys and values (the table is made again when needed)."""
        copy = EvaluationReuse(self.num_layers)
        if self.memory_keys is not None:
            copy.memory_keys = [None if k is None else k.clone() for k in self.memory_keys]
            copy.memory_values = [None if v is None else v.clone() for v in self.memory_values]
            copy.key_value_tokens = list(self.key_value_tokens)
        return copy

    def relative_table(self, key_length: int, build, key: tuple, least_key_length: int) -> torch.Tensor:
        """The relative position table of a pass over `key_length` keys, `build(length)` (the sinusoids of distances
        length - 1 .. -1, `txv_relative_attention.relative_position_embeddings`), as the last `key_length + 1` rows of
        one table kept across passes: built for at least `least_key_length` keys (the memory's mem_len + 1: a step
        against a full memory), and again, longer, when a pass needs more. `key` names everything else the table
        depends on (clamp_len, width, dtype, device): another key builds a new table."""
        table = self.table
        if table is None or self._table_key != key or table.shape[0] < key_length + 1:
            table = self.table = build(max(key_length, least_key_length))
            self._table_key = key
            self._position_keys = [None] * self.num_layers
        return table[table.shape[0] - key_length - 1 :]

    def key_value_slots(self) -> list[KeyValueSlot]:
        """One `KeyValueSlot` per layer for an evaluation pass (no autograd, weights fixed during the pass)."""
        self._pending = [None] * self.num_layers
        return [KeyValueSlot(self, i) for i in range(self.num_layers)]

    def lookup(self, layer_idx: int, weights_token: tuple, memory_length: int):
        """The `[batch, heads, memory_length, head_dim]` keys and values of the last `memory_length` memory slots if
        layer `layer_idx` kept them with the same weights (`weights_token` names them: the tensors, their in-place
        versions, the autocast dtype), else None."""
        if self.memory_keys is None or memory_length == 0:
            return None
        key, value = self.memory_keys[layer_idx], self.memory_values[layer_idx]
        if key is None or memory_length > key.shape[2] or self.key_value_tokens[layer_idx] != weights_token:
            return None
        if memory_length == key.shape[2]:  # the kept tensors themselves: `extend` appends to them in place
            return key, value
        return key[:, :, -memory_length:], value[:, :, -memory_length:]

    def extend(self, layer_idx: int, cached: tuple[torch.Tensor, torch.Tensor], key: torch.Tensor, value):
        """`[cached keys; key]` and `[cached values; value]` along the positions (appended in place, see
        `AppendBuffers`)."""
        return (
            self._buffers.append(("key", layer_idx), cached[0], key, 2),
            self._buffers.append(("value", layer_idx), cached[1], value, 2),
        )

    def keep(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, weights_token: tuple):
        """Records the keys and values layer `layer_idx` used for the last `key.shape[2]` positions of `[memory;
        segment]`; the memory update keeps the part that stays in memory (`keep_pending`)."""
        if self._pending is not None:
            # (no copy without autograd: the tensors may be views `AppendBuffers` extends in place)
            key, value = (key.detach(), value.detach()) if key.requires_grad else (key, value)
            self._pending[layer_idx] = (key, value, weights_token)

    def take_pending(self) -> list | None:
        """What the layers kept in the pass under way (None: nothing), now no longer pending."""
        pending, self._pending = self._pending, None
        return pending

    def keep_pending(self, pending: list | None, memory_length: int):
        """After a memory update: per layer, the last `memory_length` keys and values of what the pass computed
        (`take_pending`), when it covered them (else None: recomputed next time)."""
        if pending is None or memory_length == 0:
            return
        keys, values, tokens = [], [], []
        for entry in pending:
            if entry is None or entry[0].shape[2] < memory_length:
                entry = (None, None, None)
            else:
                key, value, token = entry
                entry = (key[:, :, -memory_length:], value[:, :, -memory_length:], token)
                self._buffers.keep(("key", len(keys)), entry[0])
                self._buffers.keep(("value", len(keys)), entry[1])
            keys.append(entry[0])
            values.append(entry[1])
            tokens.append(entry[2])
        if any(token is not None for token in tokens):
            self.memory_keys, self.memory_values, self.key_value_tokens = keys, values, tokens

    def position_keys(self, layer_idx: int, weights_token: tuple, position_embeddings: torch.Tensor, project):
        """`project(position_embeddings)` (the layer's keys of the relative positions, `[heads, rows, head_dim]`),
        taken from the projection of the whole `table` made with the same weights when `position_embeddings` is a
        suffix of that table (the rows of the distances a pass sees are always its last rows); computed whole
        otherwise."""
        table = self.table
        rows = position_embeddings.shape[0]
        if table is None or not is_row_suffix(position_embeddings, table):
            return project(position_embeddings)
        token = (weights_token, table.data_ptr(), table.shape[0])
        cached = self._position_keys[layer_idx]
        if cached is None or cached[0] != token:
            cached = self._position_keys[layer_idx] = (token, project(table))
        return cached[1][:, cached[1].shape[1] - rows :]


__all__ = ["AppendBuffers", "EvaluationReuse", "KeyValueSlot", "is_row_suffix"]
