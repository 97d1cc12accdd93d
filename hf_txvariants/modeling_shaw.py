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
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, ModelOutput
from transformers.utils import can_return_tuple

from .configuration_shaw import ShawConfig
from .txv_inputs import embed_inputs
from .txv_heads import CausalLMHeadMixin, MaskedLMHeadMixin, SequenceClassificationHeadMixin
from .txv_mha import cache_past_length, cross_attention_mask, self_attention_mask
from .txv_pretrained import TxvModelMixin
from .txv_shaw_attention import RelationAwareSelfAttention
from .txv_transformer_layer import TransformerLayer


@dataclass
class ShawCausalLMOutput(ModelOutput):
    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    past_key_values: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


class ShawPreTrainedModel(TxvModelMixin, PreTrainedModel):
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

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
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
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (config.use_cache and config.is_decoder)
        if self.gradient_checkpointing and self.training:
            use_cache = False  # a checkpointed layer is run twice: it would write its keys/values twice

        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size
        )
        batch, length = inputs_embeds.shape[:2]
        device, dtype = inputs_embeds.device, inputs_embeds.dtype

        if use_cache and past_key_values is None:
            past_key_values = (
                EncoderDecoderCache(DynamicCache(), DynamicCache()) if config.add_cross_attention else DynamicCache()
            )
        if past_key_values is not None and not isinstance(past_key_values, Cache):
            raise ValueError(f"past_key_values must be a transformers Cache, got {type(past_key_values).__name__}")
        past_length = cache_past_length(past_key_values)

        hidden_states = inputs_embeds * self.embed_scale
        hidden_states = self.dropout(hidden_states)

        mask = self_attention_mask(attention_mask, batch, length, past_length, config.is_decoder, dtype, device)
        cross_mask = None
        if encoder_hidden_states is not None:
            if not config.add_cross_attention:
                raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
            cross_mask = cross_attention_mask(
                encoder_attention_mask, batch, encoder_hidden_states.shape[1], dtype, device
            )

        all_hidden, all_self, all_cross = [], [], []
        for layer in self.layers:
            all_hidden.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                mask,
                encoder_hidden_states,
                cross_mask,
                past_key_values=past_key_values,
                output_attentions=output_attentions,
            )
            all_self.append(self_weights)
            all_cross.append(cross_weights)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        all_hidden.append(hidden_states)

        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            past_key_values=past_key_values if use_cache else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions and encoder_hidden_states is not None else None,
        )


class ShawForCausalLM(CausalLMHeadMixin, ShawPreTrainedModel, GenerationMixin):
    """The decoder language model; `generate()` keeps a `DynamicCache` of keys and values (the relative terms are
    recomputed from positions, so the cache holds only x W^K and x W^V). As the decoder of an `EncoderDecoderModel`
    it reads `encoder_hidden_states` / `encoder_attention_mask` through its cross-attention."""

    backbone_class = ShawModel
    output_class = ShawCausalLMOutput
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}


class ShawForMaskedLM(MaskedLMHeadMixin, ShawPreTrainedModel):
    """Bidirectional encoder (`config.is_decoder=False`) with a tied token-prediction head; labels are not shifted."""

    backbone_class = ShawModel
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}


class ShawForSequenceClassification(SequenceClassificationHeadMixin, ShawPreTrainedModel):
    """A linear classifier on the hidden state of the last real token of each row (causal or bidirectional)."""

    backbone_class = ShawModel


__all__ = [
    "ShawPreTrainedModel",
    "ShawModel",
    "ShawForCausalLM",
    "ShawForMaskedLM",
    "ShawForSequenceClassification",
    "ShawCausalLMOutput",
]
