"""Configuration of the original adaptive-span Transformer (Sukhbaatar et al. 2019, facebookresearch/adaptive-span)
and its all-attention network (Sukhbaatar et al. 2019b). model_type `txv_adaptive_span_original`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvTransformerConfig
from .txv_config_checks import check_left_at_default, check_non_negative, check_positive

# The settings that mean something only with the adaptive span on (`adapt_span_enabled`).
ADAPTIVE_SPAN_SETTINGS = ("adapt_span_ramp", "adapt_span_init", "adapt_span_loss", "adapt_span_cache")


@strict
class AdaptiveSpanOriginalConfig(TxvTransformerConfig):
    r"""
    The model of facebookresearch/adaptive-span (`models.py`) as its authors built it, which its published
    checkpoints need: every query attends to the `attn_span` (S) previous positions and never to itself; one learned
    position table `key_pe` `[head_dim, S]` shared by all layers and heads, added as q . key_pe; bias-free
    projections; post-layer-norm; each layer carries its own cache of past hidden states, zeros at the start; the soft
    span mask multiplies the softmax output and renormalises; keys and cache are trimmed in steps of 64.

    Standard names are stored; the original's command-line names are accepted through `attribute_map` (`hid_sz`,
    `nheads`, `inner_hid_sz`, `nlayers`) as are the papers' (`d_model`, `n_head`, `d_inner`, `n_layer`).

    Args:
        vocab_size, hidden_size, num_attention_heads (head_dim = hidden_size / num_attention_heads),
            intermediate_size (the feed-forward width; unused by the all-attention network), num_hidden_layers.
        attn_span: S, the number of previous positions a query attends to (the largest span).
        block_size: the block length the model was trained and is evaluated with (`--block-sz`); the forward pass
            takes any length, `conversion.evaluate_adaptive_span` reads it.
        adapt_span_enabled: learn each head's span (`--adapt-span`); False gives the fixed span S.
        adapt_span_ramp: R, the ramp of the soft mask (`--adapt-span-ramp`, 32). adapt_span_init: the initial span as
            a fraction of S. adapt_span_loss: the weight of the span penalty in the loss (`--adapt-span-loss`).
        adapt_span_cache: keep only the positions the current spans reach, plus one 64-position step
            (`--adapt-span-cache`); without it every layer keeps S positions.
        persistent_memory_size: N > 0 gives the all-attention network (`--pers-mem-size`): N persistent key/value
            vectors per layer and head, sharing the softmax with the context, and no feed-forward sublayer.
        dropout: of the feed-forward ReLU output; attention_dropout: of the attention weights (the original uses
            `--dropout` for both); emb_dropout: of the input embeddings and the last hidden state (`--emb-dropout`).
        layer_norm_eps, initializer_range.
    """

    model_type = "txv_adaptive_span_original"
    attribute_map = TxvTransformerConfig.attribute_map | {
        "hid_sz": "hidden_size",
        "nheads": "num_attention_heads",
        "inner_hid_sz": "intermediate_size",
        "nlayers": "num_hidden_layers",
        "pers_mem_size": "persistent_memory_size",
    }

    hidden_size: int = 256
    num_attention_heads: int = 2
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    attn_span: int = 32
    block_size: int = 64
    adapt_span_enabled: bool = False
    adapt_span_ramp: int = 32
    adapt_span_init: float | int = 0.0
    adapt_span_loss: float | int = 0.0
    adapt_span_cache: bool = False
    persistent_memory_size: int = 0
    dropout: float | int = 0.0
    emb_dropout: float | int = 0.0
    tie_word_embeddings: bool = False

    @property
    def all_attention(self) -> bool:
        """Whether this is the all-attention network (persistent memory, no feed-forward sublayer)."""
        return self.persistent_memory_size > 0

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "attn_span", "block_size")
        check_non_negative(self, "persistent_memory_size")
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ValueError(
                f"head_dim ({self.head_dim}) * num_attention_heads ({self.num_attention_heads}) must equal hidden_size "
                f"({self.hidden_size}): the original splits hidden_size into the heads"
            )
        if self.tie_word_embeddings:
            raise ValueError(
                "tie_word_embeddings=True is not the original model: its output layer has its own weights and bias"
            )
        if not 0.0 <= self.emb_dropout < 1.0:
            raise ValueError(f"emb_dropout must be a number in [0, 1), got {self.emb_dropout!r}")
        if isinstance(self.adapt_span_ramp, bool) or self.adapt_span_ramp < 1:
            raise ValueError(f"adapt_span_ramp must be a positive integer, got {self.adapt_span_ramp!r}")
        if not 0.0 <= self.adapt_span_init <= 1.0:
            raise ValueError(f"adapt_span_init must be in [0, 1] (a fraction of attn_span), got {self.adapt_span_init}")
        check_non_negative(self, "adapt_span_loss")
        if not self.adapt_span_enabled:
            check_left_at_default(self, ADAPTIVE_SPAN_SETTINGS, "adaptive span is off (adapt_span_enabled=False)")
        if self.all_attention:
            check_left_at_default(
                self,
                ["intermediate_size"],
                "the all-attention network (persistent_memory_size > 0) has no feed-forward sublayer",
            )


__all__ = ["AdaptiveSpanOriginalConfig"]
