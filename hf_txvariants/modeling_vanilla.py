"""Vanilla Transformer (Vaswani et al. 2017) with absolute sinusoidal or learned positions, as the deep
character-level language model of Al-Rfou et al. (2019, "Character-Level Language Modeling with Deeper
Self-Attention") with its three auxiliary losses, and as encoder / decoder of an `EncoderDecoderModel`.

Al-Rfou's evaluation (`hf_txvariants.training.sliding_window`) and the Trainer callback driving the intermediate-loss
schedule (`hf_txvariants.training.callbacks`) live outside this file: it holds model code only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, ModelOutput
from transformers.utils import can_return_tuple

from .configuration_vanilla import VanillaConfig
from .txv_compat import accepts_cache_names, model_output
from .txv_heads import CausalLMHeadMixin, MaskedLMHeadMixin, SequenceClassificationHeadMixin
from .txv_losses import check_causal_lm_targets, next_token_targets, token_cross_entropy
from .txv_mha import MultiHeadAttention, self_attention_mask
from .txv_positions import sinusoid_table
from .txv_pretrained import TxvPreTrainedModel
from .txv_transformer_stack import TransformerStackMixin


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


class VanillaModel(TransformerStackMixin, VanillaPreTrainedModel):
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
        self.build_stack(config, MultiHeadAttention)
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
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        inputs_embeds, cache, past_length, use_cache = self.prepare_stack(input_ids, inputs_embeds, cache, use_cache)
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
        hidden_states = inputs_embeds * self.embed_scale + self.position_embeddings(position_ids.to(device), dtype)
        hidden_states = self.dropout(hidden_states)

        def layer_input(layer_idx, hidden_states):
            if layer_idx > 0 and self.layer_positions is not None:  # Al-Rfou: positions again at layers 2 .. L
                hidden_states = hidden_states + self.layer_positions[layer_idx - 1](position_ids.to(device)).to(dtype)
            return hidden_states

        return self.run_stack(
            hidden_states,
            mask,
            cache,
            use_cache,
            output_attentions,
            output_hidden_states,
            encoder_hidden_states,
            encoder_attention_mask,
            layer_input,
        )


class VanillaForCausalLM(CausalLMHeadMixin, VanillaPreTrainedModel, GenerationMixin):
    """The decoder language model with Al-Rfou's auxiliary losses (see `VanillaConfig`), added only in training mode.
    As the decoder of an `EncoderDecoderModel` it reads `encoder_hidden_states` through its cross-attention."""

    backbone_class = VanillaModel
    output_class = VanillaCausalLMOutput
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def build_heads(self, config: VanillaConfig):
        super().build_heads(config)
        self.future_heads = nn.ModuleList(
            nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_future_targets - 1)
        )
        self.training_progress = 0.0

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

    def lm_outputs(self, outputs, labels, logits_to_keep, attention_mask, shift_labels=None, num_items_in_batch=None):
        """`loss` = lm_loss + intermediate_loss_weight * intermediate_loss + future_target_loss_weight * future_loss."""
        config = self.config
        hidden_states = outputs.last_hidden_state
        if labels is None and shift_labels is None:
            return super().lm_outputs(outputs, None, logits_to_keep, attention_mask)
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
        lm_loss = loss = loss_of(logits)
        intermediate_loss = future_loss = None
        if self.needs_layer_outputs(True):
            intermediate_loss = hidden_states.new_zeros(())
            layer_outputs = outputs.hidden_states[1:-1]  # the outputs of layers 1 .. L-1
            for weight, layer_output in zip(self.intermediate_layer_weights(), layer_outputs):
                if weight > 0:
                    if self.model.norm is not None:
                        layer_output = self.model.norm(layer_output)
                    intermediate_loss = intermediate_loss + weight * loss_of(self.lm_head(layer_output))
            loss = loss + config.intermediate_loss_weight * intermediate_loss
        if self.training and len(self.future_heads):
            future_loss = sum(
                loss_of(head(hidden_states), offset) for offset, head in enumerate(self.future_heads, start=2)
            )
            loss = loss + config.future_target_loss_weight * future_loss
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return {
            "loss": loss,
            "logits": logits,
            "lm_loss": lm_loss,
            "intermediate_loss": intermediate_loss,
            "future_loss": future_loss,
        }


class VanillaForMaskedLM(MaskedLMHeadMixin, VanillaPreTrainedModel):
    """Bidirectional encoder (`config.is_decoder=False`) with a tied token-prediction head; labels are not shifted."""

    backbone_class = VanillaModel
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}


class VanillaForSequenceClassification(SequenceClassificationHeadMixin, VanillaPreTrainedModel):
    """A linear classifier on the hidden state of the last real token of each row (causal or bidirectional)."""

    backbone_class = VanillaModel


__all__ = [
    "VanillaPreTrainedModel",
    "VanillaModel",
    "VanillaForCausalLM",
    "VanillaForMaskedLM",
    "VanillaForSequenceClassification",
    "VanillaCausalLMOutput",
]
