"""Gated Transformer-XL configuration (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning").
model_type `txv_gtrxl`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

from .txv_adaptive_head import adaptive_softmax_defaults, check_adaptive_softmax_fields
from .txv_adaptive_span import check_span_fields
from .txv_config_checks import apply_paper_names, check_positive, check_probabilities, default_head_dim
from .txv_gates import GATE_TYPES, check_gate_fields


@strict
class GTrXLConfig(PreTrainedConfig):
    r"""
    Standard names are stored; the papers' names are accepted through `attribute_map`
    (`d_model`, `n_head`, `d_head`, `d_inner`, `n_layer`, `dropatt`, `init_std`).

    Args:
        vocab_size: number of tokens for `input_ids` and the causal-LM head (RL agents pass `inputs_embeds`).
        hidden_size (`d_model`), num_attention_heads (`n_head`), head_dim (`d_head`, default hidden/heads),
        intermediate_size (`d_inner`), num_hidden_layers (`n_layer`).
        gate_type: the residual form, one of
            "trxl" (x + y then layer norm), "trxl_i" (identity map reordering: x + ReLU(y), y from LN(x)),
            or a GTrXL gate on top of the reordering: "input", "output", "highway", "sigmoid_tanh", "gru".
        gate_bias: the paper's b_g, initial value of the gate bias (> 0 starts each layer close to the identity).
        mem_len: number of past time steps kept as memory (`past_key_values`); 0 gives a memory-less model.
        same_length: every query attends to at most `mem_len + 1` steps (itself and `mem_len` before), exactly what
            step-by-step inference with a `mem_len` memory sees, so training on stored segments sees the same
            context as acting. False: a segment also sees all of its own earlier steps (plain Transformer-XL).
        same_length_extra_key: with same_length, `mem_len + 1` keys (True, the default) or `mem_len` keys.
        clamp_len: relative distances above it use the encoding of clamp_len (<= 0: no clamping).
        memory_init: "empty" (default: a fresh row, a reset row and an episode start attend only to their own
            steps, exactly alike) or "zeros" (`mem_len` zero vectors attended to, as Transformer-XL's TF code).
        attn_span, adapt_span_enabled, adapt_span_ramp, adapt_span_init, adapt_span_loss, adapt_span_cache,
            adapt_span_dynamic: adaptive attention span (Sukhbaatar et al. 2019), off by default; see
            `AdaptiveSpanConfig`. `attn_span` alone is a hard window of that many keys.
        adaptive, cutoffs, div_val, d_embed, tie_projs: the adaptive input embedding and projected adaptive softmax
            of Transformer-XL for large vocabularies (same fields as `TransfoXLConfig`), off by default.
        final_layer_norm: a layer norm on the last hidden state (default True; GPT-2's `ln_f`). The gated layers
            never normalise their residual stream, so without it the LM head reads vectors of the embeddings' scale
            and a language model learns very slowly (benchmarks/RESULTS.md). False gives the bare layer stack.
        dropout, attention_dropout (`dropatt`), initializer_range (`init_std`), layer_norm_eps.
    """

    model_type = "txv_gtrxl"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "d_model": "hidden_size",
        "n_head": "num_attention_heads",
        "d_head": "head_dim",
        "d_inner": "intermediate_size",
        "n_layer": "num_hidden_layers",
        "dropatt": "attention_dropout",
        "init_std": "initializer_range",
    }

    vocab_size: int = 32000
    hidden_size: int = 256
    num_attention_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 1024
    num_hidden_layers: int = 4
    gate_type: str = "gru"
    gate_bias: float | int = 2.0
    mem_len: int = 64
    same_length: bool = True
    same_length_extra_key: bool = True
    clamp_len: int = 0
    memory_init: str = "empty"
    final_layer_norm: bool = True
    attn_span: int | None = None
    adapt_span_enabled: bool = False
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
    dropout: float | int = 0.0
    attention_dropout: float | int = 0.0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    use_cache: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        apply_paper_names(self, kwargs)
        adaptive_softmax_defaults(self)
        default_head_dim(self)
        super().__post_init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        """Called at construction and before saving: a wrong config is a ValueError naming the field."""
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
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {self.mem_len}")
        if self.memory_init not in ("zeros", "empty"):
            raise ValueError(f"memory_init must be 'zeros' or 'empty', got {self.memory_init!r}")
        check_gate_fields(self)
        check_span_fields(self)
        if self.adaptive:
            check_adaptive_softmax_fields(self)
        check_probabilities(self, "dropout", "attention_dropout")


__all__ = ["GTrXLConfig", "GATE_TYPES"]
