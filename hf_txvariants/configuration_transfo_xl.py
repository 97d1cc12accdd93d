"""Transformer-XL configuration (Dai et al. 2019). model_type `transfo-xl`, so configs saved by transformers' legacy
TransfoXL (removed in transformers 5) load unchanged."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_compat import CACHE_OUTPUT_KEYS
from .txv_config_checks import check_choice
from .txv_xl_config import XLFamilyConfig


@strict
class TransfoXLConfig(XLFamilyConfig):
    r"""
    The standard fields and the papers' names for them are `TxvTransformerConfig`'s, the memory, gate and
    adaptive-span fields `XLFamilyConfig`'s; the legacy names `n_token`, `init_std` and `layer_norm_epsilon` are also
    accepted.

    Args:
        vocab_size: number of tokens.
        cutoffs: vocabulary cluster boundaries of the adaptive softmax/embedding; `[]` gives a plain softmax.
        hidden_size (`d_model`), d_embed (defaults to hidden_size), num_attention_heads (`n_head`),
        head_dim (`d_head`), intermediate_size (`d_inner`), num_hidden_layers (`n_layer`).
        div_val: cluster i has embedding size `d_embed // div_val**i`.
        pre_lnorm: layer norm on the input of each sub-layer instead of after the residual.
        mem_len: number of past positions kept as memory. clamp_len: relative distances above it use the
            embedding of clamp_len (<= 0: no clamping). same_length: every query sees the same number of keys.
        tie_projs: per cluster, whether the softmax projection is the input embedding's projection
            (default from `proj_share_all_but_first`, legacy: True -> `[False, True, ...]`).
        untie_r: per-layer (True) or shared (False) u/v position biases.
        dropout, attention_dropout (`dropatt`), init ("normal"/"uniform"), init_range, initializer_range
            (`init_std`), proj_init_std, layer_norm_eps (`layer_norm_epsilon`).
        memory_init: memory of a first segment: "zeros" (transformers' legacy model and the TF code: `mem_len`
            zero vectors that are attended to) or "empty" (the original PyTorch code).
        same_length_extra_key: with same_length, each query sees `mem_len + 1` keys (the TF code) instead of
            `mem_len` (PyTorch code and legacy transformers).
        gate_type, gate_bias: the residual form, default "trxl" (the Transformer-XL block, post- or pre-layer-norm
            by `pre_lnorm`); "trxl_i" or a gate ("gru", ...) gives the Gated Transformer-XL layer (Parisotto et
            al. 2020, identity map reordering, itself pre-norm: `pre_lnorm` must then stay False), see `GTrXLConfig`
            (gate_bias only with a gate that has a bias).
        final_layer_norm: a layer norm on the last hidden state (default False, as the original; set it with a gate,
            whose stack never normalises its residual stream, see `GTrXLConfig`).
        attn_span, adapt_span_enabled, adapt_span_ramp, adapt_span_init, adapt_span_loss, adapt_span_cache,
            adapt_span_dynamic: adaptive attention span (Sukhbaatar et al. 2019), off by default; see
            `AdaptiveSpanConfig`. `attn_span` alone is a hard window of that many keys; the `adapt_span_*` settings
            need `adapt_span_enabled=True`.
    """

    model_type = "transfo-xl"
    keys_to_ignore_at_inference = [*CACHE_OUTPUT_KEYS, "mems"]
    attribute_map = XLFamilyConfig.attribute_map | {
        "n_token": "vocab_size",
        "init_std": "initializer_range",
        "layer_norm_epsilon": "layer_norm_eps",
    }

    vocab_size: int = 267735
    cutoffs: list[int] | tuple[int, ...] = (20000, 40000, 200000)
    hidden_size: int = 1024
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    div_val: int = 4
    pre_lnorm: bool = False
    num_hidden_layers: int = 18
    mem_len: int = 1600
    clamp_len: int = 1000
    same_length: bool = True
    attn_type: int = 0
    sample_softmax: int = -1
    adaptive: bool = True
    untie_r: bool = True
    init: str = "normal"
    init_range: float = 0.01
    proj_init_std: float = 0.01
    memory_init: str = "zeros"
    same_length_extra_key: bool = False
    eos_token_id: int | list[int] | None = 0

    @property
    def uses_adaptive_softmax(self) -> bool:
        """Transformer-XL's embedding and softmax are always the adaptive ones (`adaptive` is a legacy field)."""
        return True

    def validate_architecture(self):
        """Called at construction and before saving: a wrong config is a ValueError naming the field."""
        super().validate_architecture()
        if self.attn_type != 0:
            raise ValueError(f"attn_type={self.attn_type} is not supported; only 0 (relative attention) is")
        if self.sample_softmax > 0:
            raise ValueError(f"sample_softmax={self.sample_softmax} is not supported; use -1")
        if self.same_length and self.mem_len == 0:
            raise ValueError("same_length=True needs mem_len > 0 (every query would see no key)")
        check_choice(self, "init", ("normal", "uniform"))
        if self.pre_lnorm and self.gate_type != "trxl":
            raise ValueError(
                f"pre_lnorm=True applies to gate_type='trxl' only; gate_type={self.gate_type!r} uses the identity map "
                "reordering, which already normalises the sub-layer inputs"
            )


__all__ = ["TransfoXLConfig"]
