"""Shaw Transformer configuration: relation-aware self-attention with clipped relative positions (Shaw, Uszkoreit
and Vaswani 2018, "Self-Attention with Relative Position Representations"); no absolute positions."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvEncoderOrDecoderConfig
from .txv_config_checks import check_positive


@strict
class ShawConfig(TxvEncoderOrDecoderConfig):
    r"""
    The standard fields and the papers' names for them are `TxvTransformerConfig`'s; the encoder / decoder switches
    (`is_decoder`, `add_cross_attention`), `scale_embedding`, `pre_lnorm` and `classifier_dropout` are
    `TxvEncoderOrDecoderConfig`'s.

    Args:
        max_relative_position: the clipping distance k: 2k + 1 learned relative embeddings (of size head_dim,
            shared by all heads and, per layer, by keys and values separately) for distances clip(j - i, k).
        relative_values: also add the relative embeddings to the values (a^V); False keeps only the key term
            (then any attention function, e.g. sdpa, is used; with it the eager one is).
        add_cross_attention: the cross-attention sub-layer is plain (position-free).
    """

    model_type = "txv_shaw"

    max_relative_position: int = 16
    relative_values: bool = True

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "max_relative_position")


__all__ = ["ShawConfig"]
