"""Reformer configuration (Kitaev, Kaiser and Levskaya 2020, "Reformer: The Efficient Transformer").

Field names are transformers' ReformerConfig's, so a `reformer` config.json (with its weights) loads into the
`txv_reformer` classes unchanged; the standard names are accepted too (`head_dim` for `attention_head_size`,
`intermediate_size` for `feed_forward_size`, `dropout` for `hidden_dropout_prob`)."""

from __future__ import annotations

import math

from huggingface_hub.dataclasses import strict

from .txv_compat import CACHE_OUTPUT_KEYS
from .txv_config import TxvConfig
from .txv_config_checks import check_non_negative, check_positive, check_probabilities, integer_list


@strict
class TxvReformerConfig(TxvConfig):
    r"""
    Args:
        attn_layers: one entry per layer, "lsh" or "local" (num_hidden_layers is its length).
        attention_head_size (`head_dim`), num_attention_heads, hidden_size, feed_forward_size (`intermediate_size`).
        num_hashes, num_buckets (int, list of factors, or None: chosen from the length as transformers does),
        hash_seed (fix the random rotations: tests and parity only), lsh_attn_chunk_length,
        lsh_num_chunks_before/after, local_attn_chunk_length, local_num_chunks_before/after.
        is_decoder: causal attention (True for language modelling).
        axial_pos_embds, axial_pos_shape, axial_pos_embds_dim, axial_norm_std: axial position embeddings (the
            position p is (p // shape[1], p % shape[1]); the two embeddings are concatenated).
        chunk_size_feed_forward, chunk_size_lm_head: positions per chunk of the feed-forward / LM head (0: all).
        reversible: reversible residual layers (memory flat in depth); False stores activations as usual (same
            outputs and gradients).
    """

    model_type = "txv_reformer"
    keys_to_ignore_at_inference = CACHE_OUTPUT_KEYS
    attribute_map = {
        "head_dim": "attention_head_size",
        "intermediate_size": "feed_forward_size",
        "dropout": "hidden_dropout_prob",
        "d_model": "hidden_size",
        "n_head": "num_attention_heads",
        "d_head": "attention_head_size",
        "d_inner": "feed_forward_size",
    }

    attention_head_size: int = 64
    attn_layers: list[str] | tuple[str, ...] = ("local", "lsh", "local", "lsh", "local", "lsh")
    axial_norm_std: float = 1.0
    axial_pos_embds: bool = True
    axial_pos_shape: list[int] | tuple[int, ...] = (64, 64)
    axial_pos_embds_dim: list[int] | tuple[int, ...] = (64, 192)
    chunk_size_lm_head: int = 0
    eos_token_id: int | list[int] | None = 2
    feed_forward_size: int = 512
    hash_seed: int | None = None
    hidden_act: str = "relu"
    hidden_dropout_prob: float | int = 0.05
    hidden_size: int = 256
    is_decoder: bool = True
    layer_norm_eps: float = 1e-12
    local_num_chunks_before: int = 1
    local_num_chunks_after: int = 0
    local_attention_probs_dropout_prob: float | int = 0.05
    local_attn_chunk_length: int = 64
    lsh_attn_chunk_length: int = 64
    lsh_attention_probs_dropout_prob: float | int = 0.0
    lsh_num_chunks_before: int = 1
    lsh_num_chunks_after: int = 0
    max_position_embeddings: int = 4096
    num_attention_heads: int = 12
    num_buckets: int | list[int] | None = None
    num_hashes: int = 1
    vocab_size: int = 320
    reversible: bool = True
    tie_word_embeddings: bool = False
    classifier_dropout: float | int | None = None
    pad_token_id: int | None = 0

    def derive_defaults(self, kwargs: dict):
        super().derive_defaults(kwargs)
        kwargs.pop("num_hidden_layers", None)  # transformers' ReformerConfig saves it: here it is len(attn_layers)
        self.attn_layers = list(self.attn_layers)
        self.axial_pos_shape = integer_list(self, "axial_pos_shape")
        self.axial_pos_embds_dim = integer_list(self, "axial_pos_embds_dim")
        if isinstance(self.num_buckets, (list, tuple)):
            self.num_buckets = integer_list(self, "num_buckets")

    @property
    def num_hidden_layers(self) -> int:
        return len(self.attn_layers)

    @property
    def chunk_multiple(self) -> int:
        """Inputs are padded (internally) to a multiple of this: the least common multiple of the chunk lengths."""
        lengths = {"lsh": self.lsh_attn_chunk_length, "local": self.local_attn_chunk_length}
        return math.lcm(*{lengths[kind] for kind in self.attn_layers})

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(
            self,
            "num_attention_heads",
            "attention_head_size",
            "feed_forward_size",
            "num_hashes",
            "lsh_attn_chunk_length",
            "local_attn_chunk_length",
            "max_position_embeddings",
        )
        if not self.attn_layers or any(kind not in ("lsh", "local") for kind in self.attn_layers):
            raise ValueError(f"attn_layers must be a non-empty list of 'lsh' / 'local', got {self.attn_layers}")
        factors = [self.num_buckets] if isinstance(self.num_buckets, int) else (self.num_buckets or [])
        if any(f <= 0 or f % 2 for f in factors):
            raise ValueError(f"num_buckets must be even (each factor), got {self.num_buckets}")
        check_non_negative(
            self, "lsh_num_chunks_before", "lsh_num_chunks_after", "local_num_chunks_before", "local_num_chunks_after"
        )
        if self.axial_pos_embds:
            if len(self.axial_pos_shape) != 2 or len(self.axial_pos_embds_dim) != 2:
                raise ValueError(
                    f"axial_pos_shape and axial_pos_embds_dim must have 2 entries, got {self.axial_pos_shape} and "
                    f"{self.axial_pos_embds_dim}"
                )
            if sum(self.axial_pos_embds_dim) != self.hidden_size:
                raise ValueError(
                    f"axial_pos_embds_dim {self.axial_pos_embds_dim} must sum to hidden_size ({self.hidden_size})"
                )
            if math.prod(self.axial_pos_shape) < self.max_position_embeddings:
                raise ValueError(
                    f"axial_pos_shape {self.axial_pos_shape} must cover max_position_embeddings "
                    f"({self.max_position_embeddings})"
                )
        if self.max_position_embeddings % self.chunk_multiple and self.max_position_embeddings > self.chunk_multiple:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) must be a multiple of the chunk lengths' "
                f"least common multiple ({self.chunk_multiple}) so that padded inputs have positions"
            )
        check_probabilities(
            self,
            "hidden_dropout_prob",
            "lsh_attention_probs_dropout_prob",
            "local_attention_probs_dropout_prob",
        )


__all__ = ["TxvReformerConfig"]
