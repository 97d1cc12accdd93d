"""Adaptive-span Transformer configuration (Sukhbaatar et al. 2019). model_type `txv_adaptive_span`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

from .txv_adaptive_head import adaptive_softmax_defaults, check_adaptive_softmax_fields
from .txv_adaptive_span import check_span_fields
from .txv_config_checks import apply_paper_names, check_positive, check_probabilities, default_head_dim
from .txv_gates import check_gate_fields


@strict
class AdaptiveSpanConfig(PreTrainedConfig):
    r"""
    A Transformer-XL-style decoder (segment memory as `past_key_values`, relative positions, post-layer-norm) whose
    heads learn their attention span.

    Standard names are stored; the papers' and the original code's names are accepted through `attribute_map`
    (`d_model`/`hid_sz`, `n_head`/`nheads`, `d_head`, `d_inner`/`inner_hid_sz`, `n_layer`/`nlayers`, `dropatt`).

    Args:
        vocab_size, hidden_size, num_attention_heads, head_dim, intermediate_size, num_hidden_layers.
        attn_span: S, the largest span; a query sees at most the S keys at distances 0 .. S - 1 (None: no window,
            then mem_len must be given and adaptive span disabled).
        mem_len: positions kept as memory (default S - 1, all a full span needs); trimmed further to what the
            current spans need when `adapt_span_cache`.
        adapt_span_enabled: False gives the plain model with a hard window of S keys.
        adapt_span_ramp: R, the length of the soft mask's ramp. adapt_span_init: initial span as a fraction of S.
        adapt_span_loss: weight of the L1 span penalty in the loss (the original enwik8 recipes use 2e-6).
        adapt_span_cache: drop the memory and keys that the current spans give weight 0 (saves compute and memory).
        adapt_span_dynamic: spans computed per query, z_t = S * sigmoid(v . x_t + b).
        memory_init: "empty" (no memory before the first segment) or "zeros" (S - 1 zero vectors, attended to).
        gate_type, gate_bias: the residual form (default "trxl": the plain post-layer-norm block); "trxl_i" or a
            gate ("gru", ...) gives the Gated Transformer-XL layer of Parisotto et al., see `GTrXLConfig`.
        final_layer_norm: a layer norm on the last hidden state (default False, as the original; set it with a gate).
        dropout, attention_dropout, layer_norm_eps, initializer_range.
        adaptive, cutoffs, div_val, d_embed, tie_projs: the adaptive input embedding and projected adaptive softmax
            of Transformer-XL for large vocabularies (same fields as `TransfoXLConfig`), off by default.
    """

    model_type = "txv_adaptive_span"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "d_model": "hidden_size",
        "hid_sz": "hidden_size",
        "n_head": "num_attention_heads",
        "nheads": "num_attention_heads",
        "d_head": "head_dim",
        "d_inner": "intermediate_size",
        "inner_hid_sz": "intermediate_size",
        "n_layer": "num_hidden_layers",
        "nlayers": "num_hidden_layers",
        "dropatt": "attention_dropout",
    }

    vocab_size: int = 256
    hidden_size: int = 256
    num_attention_heads: int = 4
    head_dim: int | None = None
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    attn_span: int | None = 1024
    mem_len: int | None = None
    adapt_span_enabled: bool = True
    adapt_span_ramp: int = 32
    adapt_span_init: float = 0.0
    adapt_span_loss: float = 2e-6
    adapt_span_cache: bool = True
    adapt_span_dynamic: bool = False
    adaptive: bool = False
    cutoffs: list[int] | tuple[int, ...] = ()
    d_embed: int | None = None
    div_val: int = 1
    tie_projs: list[bool] | None = None
    memory_init: str = "empty"
    gate_type: str = "trxl"
    gate_bias: float | int = 2.0
    final_layer_norm: bool = False
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
        adaptive_softmax_defaults(self)
        default_head_dim(self)
        if self.mem_len is None and isinstance(self.attn_span, int) and self.attn_span > 0:
            self.mem_len = self.attn_span - 1
        super().__post_init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        """Called at construction: a wrong config is a ValueError naming the field."""
        check_positive(
            self,
            "vocab_size",
            "hidden_size",
            "num_attention_heads",
            "head_dim",
            "intermediate_size",
            "num_hidden_layers",
        )
        if self.hidden_size % 2:
            raise ValueError(f"hidden_size must be even (sinusoidal relative positions), got {self.hidden_size}")
        if self.mem_len is None:
            raise ValueError("mem_len must be given when attn_span is None")
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {self.mem_len}")
        check_span_fields(self)
        if self.adaptive:
            check_adaptive_softmax_fields(self)
        check_gate_fields(self)
        if self.memory_init not in ("zeros", "empty"):
            raise ValueError(f"memory_init must be 'zeros' or 'empty', got {self.memory_init!r}")
        check_probabilities(self, "dropout", "attention_dropout")


__all__ = ["AdaptiveSpanConfig"]
