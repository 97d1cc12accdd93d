"""The base of the caches that carry a model's own state (not transformers' key/value layers) as the model's cache
(`cache`): the XL family's memory (`txv_xl_memory.MemoryCache`), the original adaptive-span model's hidden states
(`txv_span_cache.SpanCache`), and the Universal Transformer's, the ACT RNN's and the Reformer's generation caches (in
their modeling files). One state per batch row, the batch-row operations `generate()` uses, and one serialised form,
the state protocol (`to_state` / `from_state`)."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class RowStateCache(Cache):
    """Base of the caches here that carry a model's own state (not transformers' key/value layers) as
    the model's cache: the batch-row operations `generate()` uses (beam reordering, expansion, selection) are applied
    to every tensor that `_row_tensors()` names, and the model keeps its own cache instead of a `DynamicCache`.

    Subclasses implement `_row_tensors()` (name -> `[batch, ...]` tensor or list of them, None when empty), set
    `num_layers` and `seen_tokens` (what `len()` and `get_seq_length()` give) or override those two, and implement the
    state protocol: `to_state()` gives the cache's content as plain tensors, lists of them,
    ints, strings and None (what `torch.load(weights_only=True)` reads back), `from_state(state)` the cache again.
    Checkpoints, RL snapshots and the pytree registration all go through it; nothing outside a cache reads or writes
    its private fields."""

    def __init__(self):
        super().__init__(layers=[])

    def _row_tensors(self) -> dict:
        raise NotImplementedError

    def to_state(self) -> dict:
        """This cache's content (see the class docstring); later passes never change what it returns."""
        raise NotImplementedError

    @classmethod
    def from_state(cls, state: dict):
        """The cache that `to_state()` described; a ValueError names what does not fit."""
        raise NotImplementedError

    @classmethod
    def _state_fields(cls, state, *names: str) -> tuple:
        """`state[name]` for each of `names`, after checking that `state` is a dict holding them."""
        if not isinstance(state, dict):
            raise ValueError(
                f"a {cls.__name__} state must be the dict its to_state() gives, got {type(state).__name__}"
            )
        missing = [name for name in names if name not in state]
        if missing:
            raise ValueError(f"the {cls.__name__} state lacks {', '.join(missing)} (it has {', '.join(sorted(state))})")
        return tuple(state[name] for name in names)

    def _map_rows(self, fn):
        for name, value in self._row_tensors().items():
            if value is None:
                continue
            if isinstance(value, list):
                setattr(self, name, [None if t is None else fn(t) for t in value])
            else:
                setattr(self, name, fn(value))

    def check_batch(self, batch: int):
        """A ValueError when the cached rows are not `batch` (the first cached tensor decides; an empty cache fits)."""
        for value in self._row_tensors().values():
            tensor = next((t for t in value if t is not None), None) if isinstance(value, list) else value
            if tensor is not None:
                if tensor.shape[0] != batch:
                    raise ValueError(
                        f"the cache holds batch size {tensor.shape[0]}, but the input has batch size {batch}"
                    )
                return

    def _first_state(self) -> torch.Tensor | None:
        """The first layer's `[batch, length, hidden]` state (None when empty): what `check_compatible` reads."""
        raise NotImplementedError

    def check_compatible(
        self, *, batch_size: int | None, hidden_size: int | None, num_layers: int, model_type: str | None = None
    ):
        """Raises a ValueError naming the mismatch when this cache cannot be used with the given input and model
        (subclasses set `num_layers` and `model_type`, the type of the model that wrote the cache, None for any);
        a size given as None is not checked."""
        if model_type is not None and self.model_type is not None and self.model_type != model_type:
            raise ValueError(
                f"the cache holds the states of a {self.model_type!r} model, this model is {model_type!r}: "
                "a cache is only valid for the model (and weights) that wrote it"
            )
        if self.num_layers != num_layers:
            raise ValueError(f"the cache holds states for {self.num_layers} layers, the model has {num_layers}")
        first = self._first_state()
        if first is None:
            return
        if batch_size is not None and first.shape[0] != batch_size:
            raise ValueError(
                f"the cache holds states for batch size {first.shape[0]}, but the input has batch size {batch_size}"
            )
        if hidden_size is not None and first.shape[-1] != hidden_size:
            raise ValueError(
                f"the cache holds states of hidden size {first.shape[-1]}, but config.hidden_size is {hidden_size}"
            )

    def reorder_cache(self, beam_idx: torch.LongTensor):
        self._map_rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int):
        self._map_rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor):
        self._map_rows(lambda t: t[indices])

    def __len__(self):
        return self.num_layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Number of tokens processed so far (the cache may keep fewer)."""
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None):
        return None

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def update(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} holds the model's own state, not keys/values")

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        """Whether the cache holds a state yet (any tensor that `_row_tensors()` names)."""
        return any(value is not None for value in self._row_tensors().values())

    @property
    def is_croppable(self) -> bool:
        """False unless a subclass says otherwise: a model's own state (a memory, an RNN state) cannot be rolled
        back."""
        return False

    # One entry per layer (`len(self)`): no state here is a sliding-window, linear-attention or dummy layer
    # (transformers' own properties read `self.layers`, which these caches leave empty).
    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self)

    is_linear = is_dummy = is_sliding


__all__ = ["RowStateCache"]
