"""Shaw Transformer (Shaw, Uszkoreit and Vaswani 2018, "Self-Attention with Relative Position Representations"):
the Transformer with relation-aware self-attention (clipped relative positions added to keys and values, see
`txv_shaw_attention`) and no absolute positions. Encoder (`ShawForMaskedLM`, `ShawForSequenceClassification`),
decoder language model (`ShawForCausalLM`, a key/value cache for generate), and encoder / decoder of transformers'
`EncoderDecoderModel` (cross-attention is plain, as in the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, CausalLMOutputWithCrossAttentions
from transformers.utils import can_return_tuple

from .configuration_shaw import ShawConfig
from .txv_compat import accepts_cache_names
from .txv_heads import CausalLMHeadMixin, MaskedLMHeadMixin, SequenceClassificationHeadMixin
from .txv_mha import self_attention_mask
from .txv_pretrained import TxvPreTrainedModel
from .txv_shaw_attention import RelationAwareSelfAttention
from .txv_transformer_stack import TransformerStackMixin


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


class ShawModel(TransformerStackMixin, ShawPreTrainedModel):
    """Token embeddings (no positions), `num_hidden_layers` Transformer layers with relation-aware self-attention
    (causal when `config.is_decoder`), a final layer norm with `pre_lnorm`."""

    def __init__(self, config: ShawConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.build_stack(config, RelationAwareSelfAttention)
        self.post_init()

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
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        inputs_embeds, cache, past_length, use_cache = self.prepare_stack(input_ids, inputs_embeds, cache, use_cache)
        batch, length = inputs_embeds.shape[:2]
        device, dtype = inputs_embeds.device, inputs_embeds.dtype

        hidden_states = self.dropout(inputs_embeds * self.embed_scale)
        mask = self_attention_mask(attention_mask, batch, length, past_length, config.is_decoder, dtype, device)
        return self.run_stack(
            hidden_states,
            mask,
            cache,
            use_cache,
            output_attentions,
            output_hidden_states,
            encoder_hidden_states,
            encoder_attention_mask,
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
