"""Adaptive Attention Span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers").

A Transformer-XL-style decoder language model: segment memory carried as the cache (the shared
`MemoryCache`), the shared Transformer-XL relative attention, and in every head the learned soft span mask of
`txv_adaptive_span.AdaptiveSpan`, passed to the attention as an exact additive term (so SDPA stays exact). The L1 span
penalty is added to the loss with `adapt_span_loss` and returned as `span_penalty`. With `adapt_span_cache` each layer
attends only to the keys its current spans can reach, and the memory keeps only what the longest span needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import GenerationMixin

from .configuration_adaptive_span import AdaptiveSpanConfig
from .txv_pretrained import TxvPreTrainedModel
from .txv_xl import (
    XLBackboneMixin,
    XLCausalLMOutput,
    XLLayer,
    XLModelOutput,
    XLSpanMethodsMixin,
)
from .txv_xl_model import (
    MemoryGenerationMixin,
    NormedFeedForward,
    NormedRelativeAttention,
    XLCausalLMHeadMixin,
    XLModelMixin,
    build_token_embeddings,
    init_xl_weights,
)


@dataclass
class AdaptiveSpanModelOutput(XLModelOutput):
    """attended_keys: per layer, the number of keys the layer's attention computed (after trimming)."""

    attended_keys: tuple[int, ...] | None = None


class AdaptiveSpanCausalLMOutput(XLCausalLMOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty."""


class AdaptiveSpanAttention(NormedRelativeAttention):
    """`attn`: relative attention with its layer norm and, when enabled, the learned spans (`adaptive_span`)."""


class AdaptiveSpanFeedForward(NormedFeedForward):
    """`pos_ff`: the position-wise feed-forward network and its layer norm."""


class AdaptiveSpanLayer(XLLayer):
    part_paths = {
        "attention": "attn",
        "attention_norm": "attn.layer_norm",
        "feed_forward": "pos_ff",
        "feed_forward_norm": "pos_ff.layer_norm",
        "adaptive_span": "attn.adaptive_span",
    }

    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__()
        self.attn = AdaptiveSpanAttention(config)
        self.pos_ff = AdaptiveSpanFeedForward(config)
        self.add_mechanisms(config)


class AdaptiveSpanPreTrainedModel(XLSpanMethodsMixin, TxvPreTrainedModel):
    config_class = AdaptiveSpanConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["AdaptiveSpanLayer"]
    _supports_sdpa = True  # the span mask is an exact additive term
    _supports_flex_attn = True  # the span mask is an additive term of the score_mod (txv_relative_attention)
    auto_classes = {"AutoModel": "AdaptiveSpanModel", "AutoModelForCausalLM": "AdaptiveSpanForCausalLM"}
    head_key_patterns = (r"^lm_head\.", r"^crit\.")

    def _init_weights(self, module):
        super()._init_weights(module)
        init_xl_weights(module, self.config.initializer_range)


class AdaptiveSpanModel(XLModelMixin, XLBackboneMixin, AdaptiveSpanPreTrainedModel):
    output_class = AdaptiveSpanModelOutput

    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config)
        self.embed_tokens = build_token_embeddings(config)
        self.build_stack(config, AdaptiveSpanLayer)
        self.post_init()


class AdaptiveSpanForCausalLM(MemoryGenerationMixin, XLCausalLMHeadMixin, AdaptiveSpanPreTrainedModel, GenerationMixin):
    """The adaptive-span language model; the output layer is tied to the input embeddings. The memory is kept across
    `generate()` steps (a `MemoryCache`), trimmed to what the learned spans need."""

    backbone_class = AdaptiveSpanModel
    output_class = AdaptiveSpanCausalLMOutput


__all__ = [
    "AdaptiveSpanPreTrainedModel",
    "AdaptiveSpanModel",
    "AdaptiveSpanForCausalLM",
    "AdaptiveSpanModelOutput",
    "AdaptiveSpanCausalLMOutput",
]
