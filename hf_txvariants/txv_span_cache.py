"""The cache of the original adaptive-span Transformer (facebookresearch/adaptive-span, `models.py`), carried as the
model's `cache`.

Each layer keeps the hidden states that entered it at its own number of past positions: that number follows the
layer's learned spans (`attn_span` S, or with `adapt_span_cache` the trimmed span plus one 64-position step), so
layers differ. A fresh row starts as zero vectors, which are attended to (a query always sees S previous positions,
the first ones being these zeros), exactly like the original's `h_cache = [torch.zeros(...)]`; `reset_rows` zeroes
rows again, as the original does at the end of its training data. States are stored batch-first,
`[batch, length, hidden_size]`, detached.
"""

from __future__ import annotations

import torch

from .txv_cache import RowStateCache


class SpanCacheLayer:
    """One layer's view of a `SpanCache`, so that code walking `cache.layers` (transformers' generation utilities)
    finds one object per layer; `keys` and `values` both give the layer's kept hidden states."""

    is_sliding = False
    is_compileable = False

    def __init__(self, cache: SpanCache, layer_idx: int):
        self._cache, self.layer_idx = cache, layer_idx

    @property
    def states(self) -> torch.Tensor | None:
        return None if self._cache.states is None else self._cache.states[self.layer_idx]

    keys = values = states

    @property
    def is_initialized(self) -> bool:
        return self._cache.states is not None

    def get_seq_length(self) -> int:
        return self._cache.get_seq_length()

    def get_max_length(self) -> int | None:
        return None


class SpanCache(RowStateCache):
    """Per-layer hidden states of the original adaptive-span model, each layer with its own length.

    Args:
        num_layers: number of layers.
        states: optional list of `[batch, length_l, hidden]` tensors, one per layer (lengths may differ).
        seen_tokens: tokens processed so far.
        model_type: the `config.model_type` of the model that made the cache; another type refuses it.
    """

    def __init__(
        self,
        num_layers: int,
        states: list[torch.Tensor] | None = None,
        seen_tokens: int = 0,
        model_type: str | None = None,
    ):
        super().__init__()
        self.num_layers = num_layers
        self.model_type = model_type
        self.seen_tokens = seen_tokens
        self.layers = [SpanCacheLayer(self, i) for i in range(num_layers)]
        self.states: list[torch.Tensor] | None = None
        if states is not None:
            self.set_states(states)

    @classmethod
    def zeros(
        cls, lengths: list[int], batch_size: int, hidden_size: int, dtype, device, model_type: str | None = None
    ) -> SpanCache:
        """The cache a first block starts with: `lengths[l]` zero vectors for layer l (attended to)."""
        states = [torch.zeros(batch_size, length, hidden_size, dtype=dtype, device=device) for length in lengths]
        return cls(len(lengths), states, model_type=model_type)

    def to_state(self) -> dict:
        """`states` (each layer's kept hidden states, `[batch, length_l, hidden]`; None while empty), `seen_tokens`,
        `num_layers` and `model_type`."""
        return {
            "states": None if self.states is None else list(self.states),
            "seen_tokens": self.seen_tokens,
            "num_layers": self.num_layers,
            "model_type": self.model_type,
        }

    @classmethod
    def from_state(cls, state: dict) -> SpanCache:
        states, seen_tokens, num_layers, model_type = cls._state_fields(
            state, "states", "seen_tokens", "num_layers", "model_type"
        )
        if states is not None and (
            not isinstance(states, (list, tuple)) or not all(isinstance(s, torch.Tensor) for s in states)
        ):
            raise ValueError(f"the SpanCache state's `states` must be a list of tensors, got {type(states).__name__}")
        return cls(num_layers, None if states is None else list(states), int(seen_tokens), model_type)

    def set_states(self, states: list[torch.Tensor]):
        if len(states) != self.num_layers:
            raise ValueError(f"the cache has {len(states)} layers of states, expected {self.num_layers}")
        for i, state in enumerate(states):
            if state.dim() != 3 or state.shape[0] != states[0].shape[0] or state.shape[2] != states[0].shape[2]:
                raise ValueError(
                    f"cache state of layer {i} has shape {tuple(state.shape)}, expected "
                    f"[batch={states[0].shape[0]}, length, hidden={states[0].shape[2]}]"
                )
        self.states = [state.detach() for state in states]

    @property
    def batch_size(self) -> int | None:
        return None if self.states is None else self.states[0].shape[0]

    @property
    def lengths(self) -> list[int]:
        """The number of positions each layer keeps (empty before the first block)."""
        return [] if self.states is None else [state.shape[1] for state in self.states]

    def _first_state(self) -> torch.Tensor | None:
        return None if self.states is None else self.states[0]

    def reset_rows(self, done: torch.Tensor):
        """Zeroes the states of the rows where `done` is True, in place: such a row is a fresh row again."""
        if self.states is None:
            return
        done = done.to(device=self.states[0].device, dtype=torch.bool).view(-1)
        if done.shape[0] != self.batch_size:
            raise ValueError(f"`done` has {done.shape[0]} rows, the cache has batch size {self.batch_size}")
        keep = (~done)[:, None, None].to(self.states[0].dtype)
        self.states = [state * keep for state in self.states]

    # ----------------------------------------------------------------------------------------------------------------
    # the Cache interface used by `generate()`
    def __repr__(self):
        return f"SpanCache(num_layers={self.num_layers}, lengths={self.lengths}, seen_tokens={self.seen_tokens})"

    def reset(self):
        self.states, self.seen_tokens = None, 0

    def crop(self, max_length: int):
        raise NotImplementedError(
            "the adaptive-span cache keeps only the last positions each layer needs: it cannot "
            "be rolled back (assisted decoding is not supported)"
        )

    def _row_tensors(self) -> dict:
        return {"states": self.states}


__all__ = ["SpanCache", "SpanCacheLayer"]
