"""Shaw Transformer (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with Relative Position Representations"):
the Transformer with relation-aware self-attention (clipped relative positions added to keys and values, see
`txv_shaw_attention`) and no absolute positions. Encoder (`ShawForMaskedLM`, `ShawForSequenceClassification`),
decoder language model (`ShawForCausalLM`, a key/value cache for generate), and encoder / decoder of transformers'
`EncoderDecoderModel` (cross-attention is plain, as in the paper).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    MaskedLMOutput,
    SequenceClassifierOutputWithPast,
)
from transformers.utils import can_return_tuple

from .configuration_shaw import ShawConfig
from .txv_compat import accepts_cache_names, cache_field, output_cache
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head, check_labels, masked_lm_loss
from .txv_mha import cache_past_length, cross_attention_mask, self_attention_mask
from .txv_pretrained import TxvPreTrainedModel
from .txv_sequence_classification import last_token_states, sequence_classification_loss
from .txv_shaw_attention import RelationAwareSelfAttention
from .txv_transformer_layer import TransformerLayer


@dataclass
class ShawCausalLMOutput(CausalLMOutputWithCrossAttentions):
    """transformers' causal-LM output with cross-attentions (the fields a Shaw decoder returns), under the variant's
    name."""


class ShawPreTrainedModel(TxvPreTrainedModel):
    config_class = ShawConfig
    _no_split_modules = ["TransformerLayer"]
    _supports_sdpa = True
    auto_classes = {
        "AutoModel": "ShawModel",
        "AutoModelForCausalLM": "ShawForCausalLM",
        "AutoModelForMaskedLM": "ShawForMaskedLM",
        "AutoModelForSequenceClassification": "ShawForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")


class ShawModel(ShawPreTrainedModel):
    """Token embeddings (no positions), `num_hidden_layers` Transformer layers with relation-aware self-attention
    (causal when `config.is_decoder`), a final layer norm with `pre_lnorm`."""

    def __init__(self, config: ShawConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(config, RelationAwareSelfAttention(config, layer_idx), layer_idx)
            for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_lnorm else None
        self.gradient_checkpointing = False
        self.post_init()

    def _key_value_cache(self, cache: Cache | None, use_cache: bool) -> Cache | None:
        """The cache this call reads and extends: the one given, or a new one when `use_cache` (with a cache for the
        cross-attention's keys/values when `config.add_cross_attention`)."""
        if use_cache and cache is None:
            cache = (
                EncoderDecoderCache(DynamicCache(), DynamicCache())
                if self.config.add_cross_attention
                else DynamicCache()
            )
        if cache is not None and not isinstance(cache, Cache):
            raise ValueError(f"cache must be a transformers Cache, got {type(cache).__name__}")
        return cache

    def _cross_attention_mask(self, encoder_hidden_states, encoder_attention_mask, hidden_states):
        """The additive mask over the encoder positions that cross-attention reads (None without an encoder output or
        without padding in it)."""
        if encoder_hidden_states is None:
            return None
        if not self.config.add_cross_attention:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        return cross_attention_mask(
            encoder_attention_mask,
            hidden_states.shape[0],
            encoder_hidden_states.shape[1],
            hidden_states.dtype,
            hidden_states.device,
        )

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """
        attention_mask: `[batch, past + length]` (or `[batch, length]`), 1 = token, 0 = padding.
        Relative distances are counted in positions of the (cached + new) sequence; padding does not change them.
        encoder_hidden_states / encoder_attention_mask: the encoder output for cross-attention.
        use_cache defaults to `config.use_cache` for a decoder; it is off while training with gradient checkpointing
        (a checkpointed layer is run twice: it would write its keys/values twice).
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else (config.use_cache and config.is_decoder)
        if self.gradient_checkpointing and self.training:
            use_cache = False
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        cache = self._key_value_cache(cache, use_cache)
        past_length = cache_past_length(cache)
        batch, length = inputs_embeds.shape[:2]
        device, dtype = inputs_embeds.device, inputs_embeds.dtype

        hidden_states = self.dropout(inputs_embeds * self.embed_scale)
        mask = self_attention_mask(attention_mask, batch, length, past_length, config.is_decoder, dtype, device)
        cross_mask = self._cross_attention_mask(encoder_hidden_states, encoder_attention_mask, hidden_states)
        all_hidden_states, all_attentions, all_cross_attentions = [], [], []
        for layer in self.layers:
            all_hidden_states.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                mask,
                encoder_hidden_states,
                cross_mask,
                cache=cache,
                output_attentions=output_attentions,
            )
            all_attentions.append(self_weights)
            all_cross_attentions.append(cross_weights)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        all_hidden_states.append(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            **cache_field(cache if use_cache else None),
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
            cross_attentions=(
                tuple(all_cross_attentions) if output_attentions and encoder_hidden_states is not None else None
            ),
        )


class ShawForCausalLM(ShawPreTrainedModel, GenerationMixin):
    """The decoder language model; `generate()` keeps a `DynamicCache` of keys and values (the relative terms are
    recomputed from positions, so the cache holds only x W^K and x W^V). As the decoder of an `EncoderDecoderModel`
    it reads `encoder_hidden_states` / `encoder_attention_mask` through its cross-attention."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: ShawConfig):
        super().__init__(config)
        self.model = ShawModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> ShawCausalLMOutput:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        encoder_hidden_states / encoder_attention_mask: the encoder output read by cross-attention (as the decoder of an
            `EncoderDecoderModel`; needs `config.add_cross_attention`).
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        Other keyword arguments go to the base model."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None and not self.config.add_cross_attention:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits, loss = causal_lm_head(
            self.lm_head,
            outputs.last_hidden_state,
            self.config.vocab_size,
            labels,
            logits_to_keep,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )
        return ShawCausalLMOutput(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )


class ShawForMaskedLM(ShawPreTrainedModel):
    """Bidirectional encoder (`config.is_decoder=False`) with a tied token-prediction head; labels are not shifted."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: ShawConfig):
        if config.is_decoder:
            raise ValueError(f"{type(self).__name__} needs a bidirectional encoder: set is_decoder=False in the config")
        super().__init__(config)
        self.model = ShawModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> MaskedLMOutput:
        """labels: `[batch, length]` token ids at the masked positions and -100 elsewhere (not shifted)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            check_labels(labels, logits.shape[:2], self.config.vocab_size)
            loss = masked_lm_loss(logits, labels, num_items_in_batch)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class ShawForSequenceClassification(ShawPreTrainedModel):
    """A linear classifier (`score`) on the hidden state of the last real token of each row (causal or
    bidirectional); regression, single- or multi-label as transformers decides (`config.problem_type`)."""

    def __init__(self, config: ShawConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ShawModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        """labels: `[batch]` class ids (float `[batch, num_labels]` for multi-label, `[batch]` floats for
        regression)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        pooled = last_token_states(outputs.last_hidden_state, input_ids, attention_mask, self.config.pad_token_id)
        logits = self.score(self.dropout(pooled))
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


__all__ = [
    "ShawPreTrainedModel",
    "ShawModel",
    "ShawForCausalLM",
    "ShawForMaskedLM",
    "ShawForSequenceClassification",
    "ShawCausalLMOutput",
]
