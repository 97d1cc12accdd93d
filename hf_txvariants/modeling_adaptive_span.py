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
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import ModelOutput

from .configuration_adaptive_span import AdaptiveSpanConfig
from .txv_adaptive_span import AdaptiveSpan
from .txv_attention import causal_allowed
from .txv_cache import MemoryCache, MemoryGenerationMixin, memory_for_input
from .txv_feedforward import PositionwiseFeedForward
from .txv_inputs import embed_inputs, segment_padding_mask
from .txv_losses import causal_lm_loss, check_labels
from .txv_modeling_utils import TxvModelMixin
from .txv_relative_attention import RelativePositionAttention, relative_position_embeddings


@dataclass
class AdaptiveSpanModelOutput(ModelOutput):
    """span_penalty: sum over layers of the mean span (tokens). attended_keys: per layer, the number of keys the
    layer's attention computed (after trimming)."""

    last_hidden_state: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None
    past_key_values: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    attended_keys: tuple[int, ...] | None = None


@dataclass
class AdaptiveSpanCausalLMOutput(ModelOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None
    past_key_values: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class AdaptiveSpanAttention(RelativePositionAttention):
    """Relative attention with the learned span mask, its residual connection and (post-)layer norm."""

    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config, own_biases=True)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.adaptive_span = (
            AdaptiveSpan(
                config.num_attention_heads,
                config.attn_span,
                config.adapt_span_ramp,
                config.adapt_span_init,
                dynamic=config.adapt_span_dynamic,
                hidden_size=config.hidden_size,
            )
            if config.adapt_span_enabled
            else None
        )

    def forward(self, hidden_states, position_embeddings, allowed, memory=None, output_attentions=False):
        """position_embeddings `[M + Q (+ 1), hidden]` (`relative_position_embeddings`) and allowed `[..., Q, M + Q]` for the full memory `[B, M, hidden]`;
        the memory, the positions and the mask are cut here to the keys the current spans can reach."""
        query_length = hidden_states.shape[1]
        memory_length = 0 if memory is None else memory.shape[1]
        extra_rows = position_embeddings.shape[0] - (memory_length + query_length)  # the masked distance -1, if any
        span_bias, penalty = None, None
        needed_memory = self.config.attn_span - 1
        if self.adaptive_span is not None:
            spans = self.adaptive_span.spans(hidden_states)
            penalty = self.adaptive_span.penalty(spans)
            if self.config.adapt_span_cache:
                # the first query sits at distance memory_length from the first memory slot: it needs only the last
                # required_keys - 1 memory slots (larger distances have weight exactly 0)
                needed_memory = self.adaptive_span.required_keys(spans) - 1
                memory_length = min(memory_length, needed_memory)
        key_length = memory_length + query_length
        memory = memory[:, memory.shape[1] - memory_length :] if memory_length > 0 else None
        position_embeddings = position_embeddings[position_embeddings.shape[0] - key_length - extra_rows :]
        allowed = allowed[..., allowed.shape[-1] - key_length :]
        if self.adaptive_span is not None:
            span_bias = self.adaptive_span.attention_bias(spans, query_length, key_length, hidden_states.dtype)
        output, weights = super().forward(
            hidden_states,
            position_embeddings,
            allowed,
            memory=memory,
            output_attentions=output_attentions,
            attention_bias=span_bias,
        )
        return self.layer_norm(hidden_states + output), weights, penalty, (key_length, needed_memory)


class AdaptiveSpanFeedForward(PositionwiseFeedForward):
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config.hidden_size, config.intermediate_size, config.dropout)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states):
        return self.layer_norm(hidden_states + super().forward(hidden_states))


class AdaptiveSpanLayer(GradientCheckpointingLayer):
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__()
        self.attn = AdaptiveSpanAttention(config)
        self.pos_ff = AdaptiveSpanFeedForward(config)

    def forward(self, hidden_states, position_embeddings, allowed, memory=None, output_attentions=False):
        hidden_states, weights, penalty, key_length = self.attn(
            hidden_states, position_embeddings, allowed, memory, output_attentions
        )
        return self.pos_ff(hidden_states), weights, penalty, key_length


class AdaptiveSpanPreTrainedModel(TxvModelMixin, PreTrainedModel):
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
        if isinstance(module, AdaptiveSpan):
            if module.dynamic:
                init.normal_(module.span_predictor.weight, 0.0, std)
                # sigmoid(b) = init: the initial span fraction
                fraction = min(max(module.init, 1e-4), 1 - 1e-4)
                init.constant_(module.span_predictor.bias, float(torch.logit(torch.tensor(fraction))))
            else:
                init.constant_(module.current_val, module.init)

    def clamp_spans_(self):
        """Clamps every learned span into [0, attn_span]; call after each optimiser step (original `clamp_param`)."""
        for module in self.modules():
            if isinstance(module, AdaptiveSpan):
                module.clamp_()

    def get_spans(self) -> torch.Tensor | None:
        """`[layers, heads]` the current static spans in tokens (None for dynamic spans or without adaptive span)."""
        spans = [m.spans().detach() for m in self.modules() if isinstance(m, AdaptiveSpan) and not m.dynamic]
        return torch.stack(spans) if spans else None


class AdaptiveSpanModel(AdaptiveSpanPreTrainedModel):
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(AdaptiveSpanLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

    def init_memory(self, batch_size: int, dtype=None, device=None) -> MemoryCache:
        weight = self.embed_tokens.weight
        return MemoryCache.initial(
            self.config.num_hidden_layers,
            self.config.mem_len,
            batch_size,
            self.config.hidden_size,
            self.config.memory_init,
            dtype or weight.dtype,
            device or weight.device,
        )

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
        batch, query_length = inputs_embeds.shape[:2]
        device = inputs_embeds.device

        cache = memory_for_input(
            past_key_values,
            lambda: self.init_memory(batch, inputs_embeds.dtype, device),
            batch_size=batch,
            hidden_size=config.hidden_size,
            num_layers=len(self.layers),
        )
        input_mask = segment_padding_mask(attention_mask, batch, query_length, device)

        memory_length = cache.memory_length
        # a query sees the keys at distances 0 .. attn_span - 1 (the original's window), causal over [memory; segment]
        allowed = causal_allowed(query_length, memory_length, device, window=config.attn_span)[None, None]
        key_mask = cache.key_mask(input_mask, query_length)
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]

        position_embeddings = self.drop(
            relative_position_embeddings(
                memory_length + query_length, config.hidden_size, 0, inputs_embeds.dtype, device
            )
        )

        hidden_states = self.drop(inputs_embeds)
        layer_inputs, attentions, penalties, attended_keys = [], [], [], []
        for layer_idx, layer in enumerate(self.layers):
            layer_inputs.append(hidden_states)
            hidden_states, weights, penalty, keys = layer(
                hidden_states,
                position_embeddings,
                allowed,
                memory=cache.layer_memory(layer_idx),
                output_attentions=output_attentions,
            )
            attentions.append(weights)
            penalties.append(penalty)
            attended_keys.append(keys)
        hidden_states = self.drop(hidden_states)
        span_penalty = torch.stack(penalties).sum() if config.adapt_span_enabled else None

        if use_cache:
            if config.adapt_span_enabled and config.adapt_span_cache and not config.adapt_span_dynamic:
                # keep only the memory the longest learned span needs (every layer's memory has the same length);
                # dynamic spans depend on future queries, so their memory is not trimmed (only their keys are)
                cache.mem_len = min(config.mem_len, max(needed for _, needed in attended_keys))
            cache.update_memories(layer_inputs, input_mask)
        output = AdaptiveSpanModelOutput(
            last_hidden_state=hidden_states,
            span_penalty=span_penalty,
            past_key_values=cache if use_cache else None,
            hidden_states=tuple(layer_inputs) + (hidden_states,) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            attended_keys=tuple(keys for keys, _ in attended_keys),
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
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
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
        loss = lm_loss = None
        if labels is not None:
            check_labels(labels, hidden_states.shape[:2], self.config.vocab_size)
            logits = self.lm_head(hidden_states)
            lm_loss = causal_lm_loss(logits, labels, num_items_in_batch)
            loss = lm_loss
            if outputs.span_penalty is not None:
                loss = loss + self.config.adapt_span_loss * outputs.span_penalty
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
        else:
            logits = self.lm_head(hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states)
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
