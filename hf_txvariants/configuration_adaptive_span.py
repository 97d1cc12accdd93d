"""Adaptive-span Transformer configuration (Sukhbaatar et al. 2019). model_type `txv_adaptive_span`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_xl_config import XLFamilyConfig


@strict
class AdaptiveSpanConfig(XLFamilyConfig):
    r"""
    A Transformer-XL-style decoder (segment memory as `cache`, relative positions, post-layer-norm) whose
    heads learn their attention span.

    Standard names are stored; the papers' and the original code's names are accepted through `attribute_map`
    (`d_model`/`hid_sz`, `n_head`/`nheads`, `d_head`, `d_inner`/`inner_hid_sz`, `n_layer`/`nlayers`, `dropatt`).

    Args:
        vocab_size, hidden_size, num_attention_heads, head_dim, intermediate_size, num_hidden_layers.
        attn_span: S, the largest span; a query sees at most the S keys at distances 0 .. S - 1 (None: no window,
            then mem_len must be given and adaptive span disabled).
        mem_len: positions kept as memory (default S - 1, all a full span needs); trimmed further to what the
            current spans need when `adapt_span_cache`.
        adapt_span_enabled: False gives the plain model with a hard window of S keys (the other `adapt_span_*`
            settings must then keep their defaults: they would be ignored).
        adapt_span_ramp: R, the length of the soft mask's ramp. adapt_span_init: initial span as a fraction of S.
        adapt_span_loss: weight of the L1 span penalty in the loss (the original enwik8 recipes use 2e-6).
        adapt_span_cache: drop the memory and keys that the current spans give weight 0 (saves compute and memory).
        adapt_span_dynamic: spans computed per query, z_t = S * sigmoid(v . x_t + b).
        memory_init: "empty" (no memory before the first segment) or "zeros" (S - 1 zero vectors, attended to).
        gate_type, gate_bias: the residual form (default "trxl": the plain post-layer-norm block); "trxl_i" or a
            gate ("gru", ...) gives the Gated Transformer-XL layer of Parisotto et al., see `GTrXLConfig`.
        final_layer_norm: a layer norm on the last hidden state (default False, as the original; set it with a gate).
        adaptive, cutoffs, div_val, d_embed, tie_projs: the adaptive input embedding and projected adaptive softmax
            of Transformer-XL for large vocabularies (same fields as `TransfoXLConfig`), off by default.
        dropout, attention_dropout, layer_norm_eps, initializer_range.
    """

    model_type = "txv_adaptive_span"
    attribute_map = XLFamilyConfig.attribute_map | {
        "hid_sz": "hidden_size",
        "nheads": "num_attention_heads",
        "inner_hid_sz": "intermediate_size",
        "nlayers": "num_hidden_layers",
    }

    hidden_size: int = 256
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    attn_span: int | None = 1024
    mem_len: int | None = None
    adapt_span_enabled: bool = True
    dropout: float | int = 0.0

    def derive_defaults(self, kwargs: dict):
        super().derive_defaults(kwargs)
        if self.mem_len is None and isinstance(self.attn_span, int) and self.attn_span > 0:
            self.mem_len = self.attn_span - 1

    def validate_architecture(self):
        if self.mem_len is None:
            raise ValueError("mem_len must be given when attn_span is None")
        super().validate_architecture()


__all__ = ["AdaptiveSpanConfig"]
