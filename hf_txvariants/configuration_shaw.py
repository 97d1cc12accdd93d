"""Shaw Transformer configuration: relation-aware self-attention with clipped relative positions (Shaw, Uszkoreit
and Vaswani 2018, "Self-Attention with Relative Position Representations"); no absolute positions."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvTransformerConfig
from .txv_config_checks import check_cross_attention, check_positive, check_probabilities


@strict
class ShawConfig(TxvTransformerConfig):
    r"""
    Standard names are stored; the papers' names are accepted through `attribute_map`
    (`d_model`, `n_head`, `d_head`, `d_inner`, `n_layer`, `dropatt`).

    Args:
        vocab_size, hidden_size (`d_model`), num_hidden_layers (`n_layer`), num_attention_heads (`n_head`),
        head_dim (`d_head`, default hidden_size // num_attention_heads), intermediate_size (`d_inner`).
        max_relative_position: the clipping distance k: 2k + 1 learned relative embeddings (of size head_dim,
            shared by all heads and, per layer, by keys and values separately) for distances clip(j - i, k).
        relative_values: also add the relative embeddings to the values (a^V); False keeps only the key term
            (then any attention function, e.g. sdpa, is used; with it the eager one is).
        scale_embedding: multiply token embeddings by sqrt(hidden_size).
        pre_lnorm: layer norm on each sub-layer input (plus a final norm) instead of after the residual.
        is_decoder: causal self-attention (the language model); False gives a bidirectional encoder.
        add_cross_attention: a (plain, position-free) cross-attention sub-layer over `encoder_hidden_states`
            (decoder of an `EncoderDecoderModel`); needs is_decoder.
    """

    model_type = "txv_shaw"
    keys_to_ignore_at_inference = ["past_key_values"]

    max_relative_position: int = 16
    relative_values: bool = True
    scale_embedding: bool = False
    pre_lnorm: bool = False
    is_decoder: bool = True
    add_cross_attention: bool = False
    classifier_dropout: float | int | None = None

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "max_relative_position")
        check_probabilities(self, "classifier_dropout")
        check_cross_attention(self)


__all__ = ["ShawConfig"]
