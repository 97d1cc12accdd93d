"""Sparse Transformer configuration (Child, Gray, Radford and Sutskever 2019, "Generating Long Sequences with Sparse
Transformers")."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

from .txv_config_checks import apply_paper_names, check_positive, check_probabilities, default_head_dim, integer_list

PATTERNS = ("strided", "fixed", "causal", "sliding_window", "local1d")
PATTERN_MODES = ("interleaved", "merged", "per_head")
PATTERN_IMPLEMENTATIONS = ("auto", "blocked", "flex", "dense")
PATTERN_CONVENTIONS = ("reference", "paper")


@strict
class SparseTransformerConfig(PreTrainedConfig):
    r"""
    Standard names are stored; the papers' names are accepted through `attribute_map`
    (`d_model`, `n_head`, `d_head`, `d_inner`, `n_layer`, `dropatt`, `n_positions`).

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
            on by default (0: never by default). `model.gradient_checkpointing_disable()` turns it off.
    """

    model_type = "txv_sparse_transformer"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "d_model": "hidden_size",
        "n_head": "num_attention_heads",
        "d_head": "head_dim",
        "d_inner": "intermediate_size",
        "n_layer": "num_hidden_layers",
        "dropatt": "attention_dropout",
        "n_positions": "max_position_embeddings",
    }

    vocab_size: int = 256
    hidden_size: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    head_dim: int | None = None
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
    attention_dropout: float | int = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        apply_paper_names(self, kwargs)
        default_head_dim(self)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.image_shape is not None:
            self.image_shape = integer_list(self, "image_shape")
        super().__post_init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        check_positive(
            self,
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
            "stride",
            "block_size",
        )
        if self.attention_pattern not in PATTERNS:
            raise ValueError(f"attention_pattern must be one of {PATTERNS}, got {self.attention_pattern!r}")
        if self.pattern_mode not in PATTERN_MODES:
            raise ValueError(f"pattern_mode must be one of {PATTERN_MODES}, got {self.pattern_mode!r}")
        if self.pattern_convention not in PATTERN_CONVENTIONS:
            raise ValueError(f"pattern_convention must be one of {PATTERN_CONVENTIONS}, got {self.pattern_convention!r}")
        if self.pattern_implementation not in PATTERN_IMPLEMENTATIONS:
            raise ValueError(
                f"pattern_implementation must be one of {PATTERN_IMPLEMENTATIONS}, got {self.pattern_implementation!r}"
            )
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
        if self.gradient_checkpointing_min_layers < 0:
            raise ValueError(f"gradient_checkpointing_min_layers must be >= 0, got {self.gradient_checkpointing_min_layers}")
        check_probabilities(self, "dropout", "attention_dropout")


__all__ = ["SparseTransformerConfig"]
