"""Gated Transformer-XL (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning"), and its
ungated ablations TrXL and TrXL-I, as a memory backbone for reinforcement learning.

One layer with identity map reordering (TrXL-I and every gate), M the layer's memory, E its input:

    Y  = RelativeMultiHeadAttention(LayerNorm([StopGrad(M), E]))      (Transformer-XL relative attention)
    E' = g_MHA(E, ReLU(Y))
    F  = PositionwiseFeedForward(LayerNorm(E'))
    E_out = g_MLP(E', ReLU(F))

with g a gate from `txv_gates` (plain residual `x + y` for TrXL-I). TrXL is the original post-LN block:
`E' = LayerNorm(E + Y)`, `E_out = LayerNorm(E' + F)`.

RL use: `inputs_embeds` are embedded observations; the memory (`cache`, a `MemoryCache` of the inputs each
layer saw at the last `mem_len` time steps) carries the past across calls, one step at a time while acting or a stored
segment at a time while learning. `episode_starts` (or `MemoryCache.reset_rows(done)`, the default
memory_init="empty") makes an episode's first step attend to nothing before it, so a row whose episode restarts behaves
exactly like a fresh row.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin

from .configuration_gtrxl import GTrXLConfig
from .txv_feedforward import PositionwiseFeedForward
from .txv_pretrained import TxvPreTrainedModel
from .txv_relative_attention import RelativePositionAttention
from .txv_xl import (
    XLBackboneMixin,
    XLCausalLMOutput,
    XLLayer,
    XLModelOutput,
    XLSpanMethodsMixin,
)
from .txv_xl_model import (
    MemoryGenerationMixin,
    XLCausalLMHeadMixin,
    XLModelMixin,
    build_token_embeddings,
    init_xl_weights,
)


class GTrXLModelOutput(XLModelOutput):
    """span_penalty: with adaptive span, the sum over layers of the mean span (tokens); None otherwise."""


class GTrXLCausalLMOutput(XLCausalLMOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty (just lm_loss without adaptive span)."""


class GTrXLLayer(XLLayer):
    part_paths = {
        "attention": "attention",
        "attention_norm": "attention_norm",
        "feed_forward": "feed_forward",
        "feed_forward_norm": "feed_forward_norm",
        "adaptive_span": "attention.adaptive_span",
    }

    def __init__(self, config: GTrXLConfig):
        super().__init__()
        self.attention = RelativePositionAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.add_mechanisms(config)


class GTrXLPreTrainedModel(XLSpanMethodsMixin, TxvPreTrainedModel):
    config_class = GTrXLConfig
    _no_split_modules = ["GTrXLLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True  # Transformer-XL's relative attention through FlexAttention (txv_relative_attention)
    auto_classes = {"AutoModel": "GTrXLModel", "AutoModelForCausalLM": "GTrXLForCausalLM"}
    head_key_patterns = (r"^lm_head\.", r"^crit\.")

    def _init_weights(self, module):
        super()._init_weights(module)
        init_xl_weights(module, self.config.initializer_range)


class GTrXLModel(XLModelMixin, XLBackboneMixin, GTrXLPreTrainedModel):
    output_class = GTrXLModelOutput

    def __init__(self, config: GTrXLConfig):
        super().__init__(config)
        self.embed_tokens = build_token_embeddings(config)
        self.build_stack(config, GTrXLLayer)
        self.post_init()

    def backbone_inputs(self, cache, episode_starts: torch.Tensor | None = None, **kwargs):
        """episode_starts: `[batch, length]` bool, True where a new episode begins: that step and the later ones attend
        to nothing before it (neither memory nor earlier steps), and the memory keeps only the new episode."""
        return cache, {"episode_starts": episode_starts}


class GTrXLForCausalLM(MemoryGenerationMixin, XLCausalLMHeadMixin, GTrXLPreTrainedModel, GenerationMixin):
    """GTrXL with a language-model head (tied to the input embeddings by default). The memory is kept across
    `generate()` steps, so each new token costs O(mem_len); `episode_starts` is passed to `GTrXLModel`."""

    backbone_class = GTrXLModel
    output_class = GTrXLCausalLMOutput


__all__ = [
    "GTrXLPreTrainedModel",
    "GTrXLModel",
    "GTrXLForCausalLM",
    "GTrXLLayer",
    "GTrXLModelOutput",
    "GTrXLCausalLMOutput",
]
