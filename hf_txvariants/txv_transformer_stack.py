"""The body of a base model made of `txv_transformer_layer.TransformerLayer`s (the Shaw and vanilla Transformers):
the key/value cache, the cross-attention mask, the layer loop with its recorded outputs and the final layer norm.
A variant's `<V>Model` embeds its inputs and builds its self-attention mask, then calls `run_stack`."""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

from .txv_compat import cache_field
from .txv_inputs import embed_inputs
from .txv_mha import cache_past_length, cross_attention_mask
from .txv_transformer_layer import TransformerLayer


class TransformerStackMixin:
    """For a base model with `config` (`add_cross_attention`), `embed_tokens`, `layers` (`TransformerLayer`s) and
    `norm` (or None), as `build_stack` makes them."""

    def build_stack(self, config, attention_class):
        """After the variant's embeddings: `embed_scale` (sqrt(hidden_size) with `scale_embedding`), `dropout`,
        `num_hidden_layers` `TransformerLayer`s around `attention_class(config, layer_idx)` and the final `norm`
        (a layer norm with `pre_lnorm`, else None)."""
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(config, attention_class(config, layer_idx), layer_idx)
            for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_lnorm else None
        self.gradient_checkpointing = False

    def prepare_stack(self, input_ids, inputs_embeds, cache, use_cache: bool | None):
        """`(token embeddings, cache, cache length, use_cache)`. `use_cache` defaults to `config.use_cache` for a
        decoder; it is off while training with gradient checkpointing (a checkpointed layer is run twice: it would
        write its keys/values twice)."""
        config = self.config
        use_cache = use_cache if use_cache is not None else (config.use_cache and config.is_decoder)
        if self.gradient_checkpointing and self.training:
            use_cache = False
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        cache, past_length = self.key_value_cache(cache, use_cache)
        return inputs_embeds, cache, past_length, use_cache

    def key_value_cache(self, cache, use_cache: bool) -> tuple[Cache | None, int]:
        """The cache this call reads and extends (a new one when `use_cache` and none is given) and its length."""
        if use_cache and cache is None:
            cache = (
                EncoderDecoderCache(DynamicCache(), DynamicCache())
                if self.config.add_cross_attention
                else DynamicCache()
            )
        if cache is not None and not isinstance(cache, Cache):
            raise ValueError(f"cache must be a transformers Cache, got {type(cache).__name__}")
        return cache, cache_past_length(cache)

    def run_stack(
        self,
        hidden_states: torch.Tensor,
        mask,
        cache: Cache | None,
        use_cache: bool,
        output_attentions: bool,
        output_hidden_states: bool,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        layer_input=None,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """The layers over the embedded `hidden_states` with the self-attention `mask`, cross-attending to
        `encoder_hidden_states` (masked by `encoder_attention_mask`) when given, then the final norm.
        `layer_input(layer_idx, hidden_states)`, when given, is what enters each layer (e.g. plus per-layer
        positions)."""
        batch = hidden_states.shape[0]
        cross_mask = None
        if encoder_hidden_states is not None:
            if not self.config.add_cross_attention:
                raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
            cross_mask = cross_attention_mask(
                encoder_attention_mask, batch, encoder_hidden_states.shape[1], hidden_states.dtype, hidden_states.device
            )

        def call_layer(layer_idx, layer, hidden_states):
            return layer(
                hidden_states,
                mask,
                encoder_hidden_states,
                cross_mask,
                cache=cache,
                output_attentions=output_attentions,
            )

        fields = run_layers(
            self.layers,
            hidden_states,
            call_layer,
            output_attentions,
            output_hidden_states,
            self.norm,
            layer_input,
            weight_fields=("attentions", "cross_attentions"),
        )
        if encoder_hidden_states is None:
            fields["cross_attentions"] = None
        return BaseModelOutputWithPastAndCrossAttentions(**fields, **cache_field(cache if use_cache else None))


def run_layers(
    layers,
    hidden_states: torch.Tensor,
    call_layer,
    output_attentions: bool,
    output_hidden_states: bool,
    norm=None,
    layer_input=None,
    weight_fields: tuple[str, ...] = ("attentions",),
) -> dict:
    """The layer loop of a stacked base model, with what it records. For each layer, `layer_input(layer_idx,
    hidden_states)` (when given) is what enters it (e.g. plus per-layer positions), and `call_layer(layer_idx, layer,
    hidden_states)` returns `(hidden_states, *weights)`; `norm` (when given) follows the last layer. Returns the
    output fields: `last_hidden_state`, `hidden_states` (what entered each layer, then the final hidden states) with
    `output_hidden_states`, and per name in `weight_fields` the tuple of every layer's weights of that kind (the
    first kind, `attentions`, is the self-attention's) with `output_attentions`."""
    all_hidden, all_weights = [], []
    for layer_idx, layer in enumerate(layers):
        if layer_input is not None:
            hidden_states = layer_input(layer_idx, hidden_states)
        all_hidden.append(hidden_states)
        hidden_states, *weights = call_layer(layer_idx, layer, hidden_states)
        all_weights.append(weights)
    if norm is not None:
        hidden_states = norm(hidden_states)
    all_hidden.append(hidden_states)
    weights_by_kind = tuple(zip(*all_weights)) if all_weights else ((),) * len(weight_fields)
    fields = {"last_hidden_state": hidden_states, "hidden_states": tuple(all_hidden) if output_hidden_states else None}
    fields.update(
        {name: weights if output_attentions else None for name, weights in zip(weight_fields, weights_by_kind)}
    )
    return fields


__all__ = ["TransformerStackMixin", "run_layers"]
