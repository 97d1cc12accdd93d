"""Sparse Transformer configuration (Child, Gray, Radford and Sutskever 2019, "Generating Long Sequences with Sparse
Transformers")."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_compat import CACHE_OUTPUT_KEYS
from .txv_config import TxvTransformerConfig
from .txv_config_checks import check_choice, check_non_negative, check_positive, integer_list

PATTERNS = ("strided", "fixed", "causal", "sliding_window", "local1d")
PATTERN_MODES = ("interleaved", "merged", "per_head")
PATTERN_IMPLEMENTATIONS = ("auto", "blocked", "flex", "dense")
PATTERN_CONVENTIONS = ("reference", "paper")


@strict
class SparseTransformerConfig(TxvTransformerConfig):
    r"""
    The standard fields and the papers' names for them are `TxvTransformerConfig`'s (and `n_positions` for
    `max_position_embeddings`; `intermediate_size` defaults to 4 * hidden_size).

    Args:
        attention_pattern: "strided" (previous `stride` positions + every `stride`-th one), "fixed" (own block of
            `stride` + the last `summary_size` positions of every block), "causal" (dense), "sliding_window"
            (previous `stride` positions), "local1d" (own block of `stride` and the previous one).
        pattern_mode: how a factorised pattern (strided, fixed) is used (paper section 4.3): "interleaved" (one
            factor per residual block, alternating), "merged" (every head attends to the union), "per_head" (heads
            split between the factors).
        stride (`l`), summary_size (`c`).
        pattern_convention: which factor sets the "interleaved" and "per_head" modes use ("merged" is the same under
            both, the union being equal). "reference" (the default, today's behaviour, one reading of the reference
            code): strided A(1) is the previous l positions {i - l + 1, ..., i}; fixed A(2) is the summary positions
            and the query itself. "paper", section 4.2 of the paper: "A(1)_i = {t, t + 1, ..., i} for
            t = max(0, i - l) and A(2)_i = {j : (i - j) mod l = 0}" (strided: l + 1 local keys) and, for the fixed
            pattern, "A(1)_i = {j : (floor(j/l) = floor(i/l))}, and A(2)_i = {j : j mod l in {t, t + 1, ..., l}},
            where t = l - c" (the summary positions only, j <= i: a query before the first summary position sees
            nothing in A(2) and that head or layer outputs zeros for it).
        pattern_implementation: "auto" (the default: the fastest exact path for the device: tiles of dense attention
            on CPU, FlexAttention with a cached block mask on CUDA where the tiles are not plainly causal), "blocked"
            (tiles of dense attention through the fused SDPA kernel, no gather: trains on CPU), "flex"
            (FlexAttention block masks: CUDA, or CPU inference), "dense" (a dense mask through the eager/SDPA
            attention of `_attn_implementation`: the reference). All give the same outputs.
        block_size: query block of FlexAttention-free gathering (unused by the patterns here, which all tile).
        image_shape: `[height, width, channels]` when the sequence is a flattened image: position embeddings are then
            the sum of a row, a column and a channel embedding (paper section 5.4) instead of one per position.
        gradient_checkpointing_min_layers: stacks with at least this many layers train with gradient checkpointing
            on by default (0: never by default). `model.activation_checkpointing_disable()` turns it off.
    """

    model_type = "txv_sparse_transformer"
    keys_to_ignore_at_inference = CACHE_OUTPUT_KEYS
    attribute_map = TxvTransformerConfig.attribute_map | {"n_positions": "max_position_embeddings"}

    intermediate_size: int | None = None
    max_position_embeddings: int = 4096
    attention_pattern: str = "strided"
    pattern_mode: str = "interleaved"
    stride: int = 64
    summary_size: int = 8
    pattern_convention: str = "reference"
    pattern_implementation: str = "auto"
    block_size: int = 64
    image_shape: list[int] | None = None
    gradient_checkpointing_min_layers: int = 24
    dropout: float | int = 0.0

    def derive_defaults(self, kwargs: dict):
        if self.image_shape is not None:
            self.image_shape = integer_list(self, "image_shape")
        super().derive_defaults(kwargs)

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "max_position_embeddings", "stride", "block_size")
        check_choice(self, "attention_pattern", PATTERNS)
        check_choice(self, "pattern_mode", PATTERN_MODES)
        check_choice(self, "pattern_convention", PATTERN_CONVENTIONS)
        check_choice(self, "pattern_implementation", PATTERN_IMPLEMENTATIONS)
        if self.attention_pattern == "fixed" and not 0 < self.summary_size <= self.stride:
            raise ValueError(f"summary_size must be in [1, stride={self.stride}], got {self.summary_size}")
        if self.image_shape is not None:
            if len(self.image_shape) != 3 or min(self.image_shape) <= 0:
                raise ValueError(f"image_shape must be [height, width, channels] > 0, got {self.image_shape}")
            height, width, channels = self.image_shape
            if height * width * channels > self.max_position_embeddings:
                raise ValueError(
                    f"image_shape {self.image_shape} has {height * width * channels} positions, more than "
                    f"max_position_embeddings ({self.max_position_embeddings})"
                )
        check_non_negative(self, "gradient_checkpointing_min_layers")


__all__ = ["SparseTransformerConfig"]
