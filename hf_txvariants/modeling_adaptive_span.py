"""Adaptive Attention Span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers").

A Transformer-XL-style decoder language model: segment memory carried as `past_key_values` (the shared
`MemoryCache`), the shared Transformer-XL relative attention, and in every head the learned soft span mask of
`txv_adaptive_span.AdaptiveSpan`, passed to the attention as an exact additive term (so SDPA stays exact). The L1 span
penalty is added to the loss with `adapt_span_loss` and returned as `span_penalty`. With `adapt_span_cache` each layer
attends only to the keys its current spans can reach, and the memory keeps only what the longest span needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init

from .configuration_adaptive_span import AdaptiveSpanConfig
from .txv_cache import MemoryCache, MemoryGenerationMixin
from .txv_feedforward import PositionwiseFeedForward
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head
from .txv_pretrained import TxvModelMixin
from .txv_relative_attention import RelativePositionAttention
from .txv_xl import (
    XLBackboneMixin,
    XLCausalLMOutput,
    XLLayer,
    XLModelOutput,
    XLSpanMethodsMixin,
    build_final_norm,
    init_mechanism_weights,
)


@dataclass
class AdaptiveSpanModelOutput(XLModelOutput):
    """attended_keys: per layer, the number of keys the layer's attention computed (after trimming)."""

    attended_keys: tuple[int, ...] | None = None


class AdaptiveSpanCausalLMOutput(XLCausalLMOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty."""


class AdaptiveSpanAttention(RelativePositionAttention):
    """Relative attention with its layer norm and, when enabled, the learned spans (`adaptive_span`)."""

    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config, own_biases=True)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class AdaptiveSpanFeedForward(PositionwiseFeedForward):
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config.hidden_size, config.intermediate_size, config.dropout)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


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


class AdaptiveSpanPreTrainedModel(XLSpanMethodsMixin, TxvModelMixin, PreTrainedModel):
    config_class = AdaptiveSpanConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["AdaptiveSpanLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True  # the span mask is an exact additive term
    _supports_flash_attn = False
    _supports_flex_attn = False
    auto_classes = {"AutoModel": "AdaptiveSpanModel", "AutoModelForCausalLM": "AdaptiveSpanForCausalLM"}
    head_key_patterns = (r"^lm_head\.",)

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        if isinstance(module, RelativePositionAttention):
            init.normal_(module.r_w_bias, 0.0, std)
            init.normal_(module.r_r_bias, 0.0, std)
        init_mechanism_weights(module, std)


class AdaptiveSpanModel(XLBackboneMixin, AdaptiveSpanPreTrainedModel):
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(AdaptiveSpanLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = build_final_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: MemoryCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> AdaptiveSpanModelOutput | tuple:
        """
        attention_mask: `[batch, >= length]`, 1 for real tokens and 0 for padding; its last `length` columns describe
            the segment (generation passes the whole sequence).
        past_key_values: the `MemoryCache` returned by the previous segment, updated in place and returned.
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else config.use_cache
        return_dict = return_dict if return_dict is not None else config.return_dict

        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size
        )
        backbone = self.run_backbone(inputs_embeds, attention_mask, past_key_values, use_cache, output_attentions)
        output = AdaptiveSpanModelOutput(
            last_hidden_state=backbone.last_hidden_state,
            span_penalty=backbone.span_penalty,
            past_key_values=backbone.cache if use_cache else None,
            hidden_states=tuple(backbone.layer_inputs) + (backbone.last_hidden_state,) if output_hidden_states else None,
            attentions=tuple(backbone.attentions) if output_attentions else None,
            attended_keys=backbone.attended_keys,
        )
        return output if return_dict else output.to_tuple()


class AdaptiveSpanForCausalLM(MemoryGenerationMixin, AdaptiveSpanPreTrainedModel, GenerationMixin):
    """The adaptive-span language model; the output layer is tied to the input embeddings. The memory is kept across
    `generate()` steps (a `MemoryCache`), trimmed to what the learned spans need."""

    _tied_weights_keys = {"lm_head.weight": "transformer.embed_tokens.weight"}

    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config)
        self.transformer = AdaptiveSpanModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: MemoryCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> AdaptiveSpanCausalLMOutput | tuple:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): the targets already shifted (transformers' loss kwarg, e.g. for context parallelism)."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        shift_labels = kwargs.get("shift_labels")  # a loss kwarg, not a named argument (Trainer's label_names)
        outputs = self.transformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        logits, lm_loss = causal_lm_head(
            self.lm_head, hidden_states, self.config.vocab_size, labels, logits_to_keep,
            num_items_in_batch=num_items_in_batch, shift_labels=shift_labels,
        )
        loss = lm_loss
        if lm_loss is not None and outputs.span_penalty is not None:
            loss = loss + self.config.adapt_span_loss * outputs.span_penalty
        output = AdaptiveSpanCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            span_penalty=outputs.span_penalty,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "AdaptiveSpanPreTrainedModel",
    "AdaptiveSpanModel",
    "AdaptiveSpanForCausalLM",
    "AdaptiveSpanModelOutput",
    "AdaptiveSpanCausalLMOutput",
]
