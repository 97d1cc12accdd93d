"""Vanilla Transformer (Vaswani et al. 2017) with absolute sinusoidal or learned positions, as the deep
character-level language model of Al-Rfou et al. (2019, "Character-Level Language Modeling with Deeper
Self-Attention") with its three auxiliary losses, and as encoder / decoder of an `EncoderDecoderModel`.

Al-Rfou's evaluation (`hf_txvariants.training.sliding_window`) and the Trainer callback driving the intermediate-loss
schedule (`hf_txvariants.training.callbacks`) live outside this file: it holds model code only.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutputWithPastAndCrossAttentions,
    MaskedLMOutput,
    ModelOutput,
    SequenceClassifierOutputWithPast,
)
from transformers.utils import can_return_tuple

from .configuration_vanilla import VanillaConfig
from .txv_compat import accepts_cache_names, cache_field, model_output, output_cache
from .txv_inputs import embed_inputs
from .txv_losses import (
    causal_lm_head,
    check_causal_lm_targets,
    check_labels,
    masked_lm_loss,
    next_token_targets,
    token_cross_entropy,
)
from .txv_mha import MultiHeadAttention, cache_past_length, cross_attention_mask, self_attention_mask
from .txv_positions import sinusoid_table
from .txv_pretrained import TxvPreTrainedModel
from .txv_sequence_classification import last_token_states, sequence_classification_loss
from .txv_transformer_layer import TransformerLayer


@model_output
class VanillaCausalLMOutput(ModelOutput):
    """`loss` = lm_loss + intermediate_loss_weight * intermediate_loss + future_target_loss_weight * future_loss
    (the auxiliary terms only in training mode); `lm_loss` is the next-token loss of the last layer."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    intermediate_loss: torch.FloatTensor | None = None
    future_loss: torch.FloatTensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


class VanillaPreTrainedModel(TxvPreTrainedModel):
    config_class = VanillaConfig
    _no_split_modules = ["TransformerLayer"]
    _supports_sdpa = True
    auto_classes = {
        "AutoModel": "VanillaModel",
        "AutoModelForCausalLM": "VanillaForCausalLM",
        "AutoModelForMaskedLM": "VanillaForMaskedLM",
        "AutoModelForSequenceClassification": "VanillaForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^future_heads\.", r"^score\.")


class VanillaModel(VanillaPreTrainedModel):
    """Token embeddings + absolute positions, `num_hidden_layers` Transformer layers (causal when
    `config.is_decoder`), a final layer norm with `pre_lnorm`."""

    def __init__(self, config: VanillaConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        if config.position_embedding_type == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:
            self.embed_positions = None
        self.layer_positions = None
        if config.per_layer_positions:  # Al-Rfou: positions again at the input of layers 2 .. L
            self.layer_positions = nn.ModuleList(
                nn.Embedding(config.max_position_embeddings, config.hidden_size)
                for _ in range(config.num_hidden_layers - 1)
            )
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(config, MultiHeadAttention(config, layer_idx), layer_idx)
            for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_lnorm else None
        self.gradient_checkpointing = False
        self.post_init()

    def position_embeddings(self, position_ids: torch.Tensor, dtype) -> torch.Tensor:
        if self.embed_positions is not None:
            # A check on tensor values: skipped while tracing (torch.compile(fullgraph=True) / torch.export).
            if not torch.compiler.is_compiling() and int(position_ids.max()) >= self.config.max_position_embeddings:
                raise ValueError(
                    f"position {int(position_ids.max())} is beyond config.max_position_embeddings "
                    f"({self.config.max_position_embeddings}) of the learned position embeddings"
                )
            return self.embed_positions(position_ids).to(dtype)
        table = sinusoid_table(position_ids.reshape(-1), self.config.hidden_size)
        return table.view(*position_ids.shape, -1).to(dtype)

    # Copied from hf_txvariants.modeling_shaw.ShawModel._key_value_cache
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

    # Copied from hf_txvariants.modeling_shaw.ShawModel._cross_attention_mask
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
        position_ids: torch.LongTensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """
        attention_mask: `[batch, past + length]` (or `[batch, length]`), 1 = token, 0 = padding.
        position_ids: `[batch, length]` absolute positions; by default counted over the real tokens of
            `attention_mask` (so a left-padded row gets the positions it would have alone), else past + arange.
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

        # the mask first: it checks attention_mask's shape, which the position ids below read
        mask = self_attention_mask(
            attention_mask, batch, length, past_length, config.is_decoder, dtype, device, fused=True
        )
        if position_ids is None:
            if attention_mask is not None and attention_mask.shape[-1] == past_length + length:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
            else:
                position_ids = torch.arange(past_length, past_length + length, device=device)[None].expand(batch, -1)
        position_ids = position_ids.to(device)
        hidden_states = inputs_embeds * self.embed_scale + self.position_embeddings(position_ids, dtype)
        hidden_states = self.dropout(hidden_states)
        cross_mask = self._cross_attention_mask(encoder_hidden_states, encoder_attention_mask, hidden_states)
        all_hidden_states, all_attentions, all_cross_attentions = [], [], []
        for layer_idx, layer in enumerate(self.layers):
            if layer_idx > 0 and self.layer_positions is not None:  # Al-Rfou: positions again at layers 2 .. L
                hidden_states = hidden_states + self.layer_positions[layer_idx - 1](position_ids).to(dtype)
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


class VanillaForCausalLM(VanillaPreTrainedModel, GenerationMixin):
    """The decoder language model with Al-Rfou's auxiliary losses (see `VanillaConfig`), added only in training mode.
    As the decoder of an `EncoderDecoderModel` it reads `encoder_hidden_states` through its cross-attention."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: VanillaConfig):
        super().__init__(config)
        self.model = VanillaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.future_heads = nn.ModuleList(
            nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_future_targets - 1)
        )
        self.training_progress = 0.0
        self.post_init()

    def set_training_progress(self, progress: float):
        """Fraction of training done (step / total steps), which switches the intermediate losses off."""
        if not 0.0 <= progress <= 1.0:
            raise ValueError(f"training progress must be in [0, 1], got {progress}")
        self.training_progress = float(progress)

    def intermediate_layer_weights(self) -> list[float]:
        """Al-Rfou's schedule: the loss of layer l (1-based, l < L) counts while progress < l / (2 L)."""
        layers = self.config.num_hidden_layers
        return [1.0 if self.training_progress < layer / (2 * layers) else 0.0 for layer in range(1, layers)]

    def needs_layer_outputs(self, has_targets: bool) -> bool:
        """The intermediate losses read the output of every layer."""
        config = self.config
        return (
            has_targets
            and self.training
            and config.intermediate_loss_weight > 0
            and config.num_hidden_layers > 1
            and any(self.intermediate_layer_weights())
        )

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
    ) -> VanillaCausalLMOutput:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        encoder_hidden_states / encoder_attention_mask: the encoder output read by cross-attention (as the decoder of an
            `EncoderDecoderModel`; needs `config.add_cross_attention`).
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        Other keyword arguments (e.g. `position_ids`) go to the base model.
        `loss` = lm_loss + intermediate_loss_weight * intermediate_loss + future_target_loss_weight * future_loss, the
        auxiliary terms in training mode only (the intermediate losses read every layer's output, so the base model is
        then asked for its hidden states)."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None and not self.config.add_cross_attention:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        has_targets = labels is not None or shift_labels is not None
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states or self.needs_layer_outputs(has_targets),
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            return_dict=True,
            **kwargs,
        )
        loss = lm_loss = intermediate_loss = future_loss = None
        if has_targets:
            logits, lm_loss, intermediate_loss, future_loss = self._losses(
                outputs, labels, shift_labels, num_items_in_batch
            )
            loss = lm_loss
            if intermediate_loss is not None:
                loss = loss + self.config.intermediate_loss_weight * intermediate_loss
            if future_loss is not None:
                loss = loss + self.config.future_target_loss_weight * future_loss
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
        else:
            logits, _ = causal_lm_head(
                self.lm_head, outputs.last_hidden_state, self.config.vocab_size, None, logits_to_keep
            )
        return VanillaCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            intermediate_loss=intermediate_loss,
            future_loss=future_loss,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states if output_hidden_states else None,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )

    def _losses(self, outputs, labels, shift_labels, num_items_in_batch):
        """`(logits, lm_loss, intermediate_loss, future_loss)` of every position: the next-token loss of the last
        layer, Al-Rfou's losses of the intermediate layers (the weighted sum of each layer's next-token loss, None
        unless `needs_layer_outputs`) and of the `num_future_targets - 1` further tokens (the sum over the future
        heads, None unless training)."""
        config = self.config
        hidden_states = outputs.last_hidden_state
        check_causal_lm_targets(labels, shift_labels, hidden_states.shape[:2], config.vocab_size)
        position_weights, items = None, num_items_in_batch
        if not config.loss_on_all_positions:
            # Only the prediction of the last real target of each row (num_items_in_batch, which counts every
            # target, does not apply).
            items = None
            targets_valid = next_token_targets(labels, shift_labels, 1) != -100
            last = (torch.arange(targets_valid.shape[1], device=targets_valid.device) * targets_valid).argmax(-1)
            position_weights = torch.zeros_like(targets_valid)
            position_weights[torch.arange(targets_valid.shape[0]), last] = True

        def loss_of(logits, offset=1):
            """Cross-entropy of position t predicting the token `offset` ahead, over the weighted positions."""
            targets = next_token_targets(labels, shift_labels, offset)
            if position_weights is not None:
                targets = targets.masked_fill(~position_weights, -100)
            return token_cross_entropy(logits, targets, items)

        logits = self.lm_head(hidden_states)
        lm_loss = loss_of(logits)
        intermediate_loss = future_loss = None
        if self.needs_layer_outputs(True):
            intermediate_loss = hidden_states.new_zeros(())
            layer_outputs = outputs.hidden_states[1:-1]  # the outputs of layers 1 .. L-1
            for weight, layer_output in zip(self.intermediate_layer_weights(), layer_outputs):
                if weight > 0:
                    if self.model.norm is not None:
                        layer_output = self.model.norm(layer_output)
                    intermediate_loss = intermediate_loss + weight * loss_of(self.lm_head(layer_output))
        if self.training and len(self.future_heads):
            future_loss = sum(
                loss_of(head(hidden_states), offset) for offset, head in enumerate(self.future_heads, start=2)
            )
        return logits, lm_loss, intermediate_loss, future_loss


class VanillaForMaskedLM(VanillaPreTrainedModel):
    """Bidirectional encoder (`config.is_decoder=False`) with a tied token-prediction head; labels are not shifted."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    # Copied from hf_txvariants.modeling_shaw.ShawForMaskedLM.__init__ with Shaw->Vanilla
    def __init__(self, config: VanillaConfig):
        if config.is_decoder:
            raise ValueError(f"{type(self).__name__} needs a bidirectional encoder: set is_decoder=False in the config")
        super().__init__(config)
        self.model = VanillaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    # Copied from hf_txvariants.modeling_shaw.ShawForMaskedLM.forward
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


class VanillaForSequenceClassification(VanillaPreTrainedModel):
    """A linear classifier on the hidden state of the last real token of each row (causal or bidirectional)."""

    # Copied from hf_txvariants.modeling_shaw.ShawForSequenceClassification.__init__ with Shaw->Vanilla
    def __init__(self, config: VanillaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = VanillaModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    # Copied from hf_txvariants.modeling_shaw.ShawForSequenceClassification.forward
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
    "VanillaPreTrainedModel",
    "VanillaModel",
    "VanillaForCausalLM",
    "VanillaForMaskedLM",
    "VanillaForSequenceClassification",
    "VanillaCausalLMOutput",
]
