"""Gated Transformer-XL configuration (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning").
model_type `txv_gtrxl`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_gates import GATE_TYPES
from .txv_xl_config import XLFamilyConfig


@strict
class GTrXLConfig(XLFamilyConfig):
    r"""
    The standard fields and the papers' names for them are `TxvTransformerConfig`'s (and `init_std` for
    `initializer_range`); the memory, gate and adaptive-span fields are `XLFamilyConfig`'s, with the defaults below.

    Args:
        vocab_size: number of tokens for `input_ids` and the causal-LM head (RL agents pass `inputs_embeds`).
        hidden_size (`d_model`), num_attention_heads (`n_head`), head_dim (`d_head`, default hidden/heads),
        intermediate_size (`d_inner`), num_hidden_layers (`n_layer`).
        gate_type: the residual form, one of
            "trxl" (x + y then layer norm), "trxl_i" (identity map reordering: x + ReLU(y), y from LN(x)),
            or a GTrXL gate on top of the reordering: "input", "output", "highway", "sigmoid_tanh", "gru".
        gate_bias: the paper's b_g, initial value of the gate bias (> 0 starts each layer close to the identity);
            only the output, highway, sigmoid_tanh and gru gates have one (another value with another gate_type is
            refused: it would be ignored).
        mem_len: number of past time steps kept as memory (`cache`); 0 gives a memory-less model.
        same_length: every query attends to at most `mem_len + 1` steps (itself and `mem_len` before), exactly what
            step-by-step inference with a `mem_len` memory sees, so training on stored segments sees the same
            context as acting. False: a segment also sees all of its own earlier steps (plain Transformer-XL).
        same_length_extra_key: with same_length, `mem_len + 1` keys (True, the default) or `mem_len` keys.
        clamp_len: relative distances above it use the encoding of clamp_len (<= 0: no clamping).
        memory_init: "empty" (default: a fresh row, a reset row and an episode start attend only to their own
            steps, exactly alike) or "zeros" (`mem_len` zero vectors attended to, as Transformer-XL's TF code).
        attn_span, adapt_span_enabled, adapt_span_ramp, adapt_span_init, adapt_span_loss, adapt_span_cache,
            adapt_span_dynamic: adaptive attention span (Sukhbaatar et al. 2019), off by default; see
            `AdaptiveSpanConfig`. `attn_span` alone is a hard window of that many keys; the `adapt_span_*` settings
            need `adapt_span_enabled=True` (set without it they are refused: they would be ignored).
        final_layer_norm: a layer norm on the last hidden state (default True; GPT-2's `ln_f`). The gated layers
            never normalise their residual stream, so without it the LM head reads vectors of the embeddings' scale
            and a language model learns very slowly (benchmarks/RESULTS.md). False gives the bare layer stack.
        adaptive, cutoffs, div_val, d_embed, tie_projs: the adaptive input embedding and projected adaptive softmax
            of Transformer-XL for large vocabularies (same fields as `TransfoXLConfig`), off by default.
        dropout, attention_dropout (`dropatt`), initializer_range (`init_std`), layer_norm_eps.
    """

    model_type = "txv_gtrxl"
    attribute_map = XLFamilyConfig.attribute_map | {"init_std": "initializer_range"}

    vocab_size: int = 32000
    hidden_size: int = 256
    intermediate_size: int = 1024
    num_hidden_layers: int = 4
    gate_type: str = "gru"
    same_length: bool = True
    same_length_extra_key: bool = True
    clamp_len: int = 0
    final_layer_norm: bool = True
    dropout: float | int = 0.0


__all__ = ["GTrXLConfig", "GATE_TYPES"]
