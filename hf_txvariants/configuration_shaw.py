"""Shaw Transformer configuration: relation-aware self-attention with clipped relative positions (Shaw, Uszkoreit
and Vaswani 2018, "Self-Attention with Relative Position Representations"); no absolute positions."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

from .txv_config_checks import apply_paper_names, check_positive, check_probabilities, default_head_dim


@strict
class ShawConfig(PreTrainedConfig):
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
    attribute_map = {
        "d_model": "hidden_size",
        "n_head": "num_attention_heads",
        "d_head": "head_dim",
        "d_inner": "intermediate_size",
        "n_layer": "num_hidden_layers",
        "dropatt": "attention_dropout",
    }

    vocab_size: int = 256
    hidden_size: int = 512
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 2048
    max_relative_position: int = 16
    relative_values: bool = True
    scale_embedding: bool = False
    pre_lnorm: bool = False
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    is_decoder: bool = True
    add_cross_attention: bool = False
    classifier_dropout: float | int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        apply_paper_names(self, kwargs)
        default_head_dim(self)
        super().__post_init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        """Called at construction: a wrong config is a ValueError naming the field."""
        check_positive(
            self,
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "intermediate_size",
            "max_relative_position",
        )
        check_probabilities(self, "dropout", "attention_dropout", "classifier_dropout")
        if self.add_cross_attention and not self.is_decoder:
            raise ValueError("add_cross_attention=True needs is_decoder=True (cross-attention is a decoder sub-layer)")


__all__ = ["ShawConfig"]
