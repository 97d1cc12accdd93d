"""The task heads every variant puts on its base model, written once (as transformers 5's
`GenericForSequenceClassification`): a variant keeps its named classes (`<V>ForCausalLM`, `<V>ForMaskedLM`,
`<V>ForSequenceClassification`) with the standard signatures and only says what differs:

    backbone_class     the base model (built under `base_model_prefix`, so checkpoint names are unchanged)
    output_class       the output dataclass; every field it shares with the base model's output is passed on
    backbone_kwargs    fixed keyword arguments of the base model call (e.g. {"is_causal": False})
    build_heads(config)  the task layers (`lm_head`, `score`, ...) built after the base model
    add_auxiliary_losses(loss, outputs, attention_mask)   the variant's extra terms (ponder cost, span penalty)

Mixed in before the variant's PreTrainedModel: `class ShawForCausalLM(CausalLMHeadMixin, ShawPreTrainedModel,
GenerationMixin)`. The losses are `txv_losses`' (one causal-LM loss, one masked-LM loss)."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast, MaskedLMOutput, SequenceClassifierOutputWithPast
from transformers.utils import can_return_tuple

from .txv_compat import CACHE_NAME, accepts_cache_names
from .txv_losses import causal_lm_head, check_labels, masked_lm_loss
from .txv_sequence_classification import last_token_states, sequence_classification_loss


def head_output(output_class, backbone_outputs, **fields):
    """`output_class(**fields)`, completed with every field of `backbone_outputs` that `output_class` also has
    (the cache, `hidden_states`, `attentions`, `ponder_cost`, ...). `fields` that `output_class` lacks (e.g.
    `lm_loss` for a plain `CausalLMOutputWithPast`) are left out."""
    names = output_class.__dataclass_fields__.keys()
    values = {name: backbone_outputs.get(name) for name in names if name not in fields}
    values.update({name: value for name, value in fields.items() if name in names})
    return output_class(**values)


class TxvHeadMixin:
    """What every head shares: its base model (`backbone_class`, under `base_model_prefix`) and the hooks."""

    backbone_class: type = None
    output_class: type = None
    backbone_kwargs: dict = {}

    def __init__(self, config):
        super().__init__(config)
        self.build_backbone(config)
        self.build_heads(config)
        self.post_init()

    def build_backbone(self, config):
        setattr(self, self.base_model_prefix, self.backbone_class(config))

    def build_heads(self, config):
        """The task layers on the base model; by default the token-prediction `lm_head`."""
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def call_base_model(self, **inputs):
        """The base model's output for the head's inputs (and `backbone_kwargs`), as a ModelOutput."""
        return self.base_model(**inputs, **self.backbone_kwargs, return_dict=True)

    def add_auxiliary_losses(self, loss: torch.Tensor, outputs, attention_mask) -> torch.Tensor:
        """The variant's extra loss terms (added with their config weight); none by default."""
        return loss


class CausalLMHeadMixin(TxvHeadMixin):
    """`lm_head` (tied to the input embeddings where the variant says so) over the base model's last hidden state; the
    loss of `txv_losses.causal_lm_head` (taken over every position, then the logits cut to `logits_to_keep`)."""

    output_class = CausalLMOutputWithPast
    head_options: tuple[str, ...] = ()  # keyword arguments read by `lm_outputs`, not passed to the base model

    def needs_layer_outputs(self, has_targets: bool) -> bool:
        """Whether the loss reads every layer's output (then the base model is asked for its hidden states)."""
        return False

    def lm_outputs(self, outputs, labels, logits_to_keep: int, attention_mask, **loss_kwargs) -> dict:
        """The head's output fields from the base model's `outputs`: `logits`, `loss` and `lm_loss` (the next-token
        loss before the variant's auxiliary terms)."""
        logits, lm_loss = causal_lm_head(
            self.lm_head, outputs.last_hidden_state, self.config.vocab_size, labels, logits_to_keep, **loss_kwargs
        )
        loss = None if lm_loss is None else self.add_auxiliary_losses(lm_loss, outputs, attention_mask)
        return {"loss": loss, "logits": logits, "lm_loss": lm_loss}

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache=None,
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
    ):
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        encoder_hidden_states / encoder_attention_mask: the encoder output read by cross-attention (as the decoder of an
            `EncoderDecoderModel`; needs `config.add_cross_attention`).
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        The keyword arguments named in `head_options` go to `lm_outputs`, the others (e.g. `position_ids`) to the base
        model."""
        head_kwargs = {name: kwargs.pop(name) for name in self.head_options if name in kwargs}
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None and not getattr(self.config, "add_cross_attention", False):
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        outputs = self.call_base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states
            or self.needs_layer_outputs(labels is not None or shift_labels is not None),
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            **kwargs,
        )
        fields = self.lm_outputs(
            outputs,
            labels,
            logits_to_keep,
            attention_mask,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
            **head_kwargs,
        )
        if not output_hidden_states:
            fields["hidden_states"] = None
        return head_output(self.output_class, outputs, **fields)


class MaskedLMHeadMixin(TxvHeadMixin):
    """A bidirectional base model with a tied token-prediction head; labels are not shifted."""

    output_class = MaskedLMOutput
    decoder_config_allowed = False

    def __init__(self, config):
        if getattr(config, "is_decoder", False) and not self.decoder_config_allowed:
            raise ValueError(f"{type(self).__name__} needs a bidirectional encoder: set is_decoder=False in the config")
        super().__init__(config)

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
    ):
        """labels: `[batch, length]` token ids at the masked positions and -100 elsewhere (not shifted)."""
        outputs = self.call_base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            check_labels(labels, logits.shape[:2], self.config.vocab_size)
            loss = masked_lm_loss(logits, labels, num_items_in_batch)
            loss = self.add_auxiliary_losses(loss, outputs, attention_mask)
        return head_output(self.output_class, outputs, loss=loss, logits=logits)


class SequenceClassificationHeadMixin(TxvHeadMixin):
    """A linear classifier (`score`) on a pooled hidden state: by default the last real token of each row
    (`txv_sequence_classification.last_token_states`). Regression, single- or multi-label as transformers decides."""

    output_class = SequenceClassifierOutputWithPast
    score_bias: bool = False

    def build_heads(self, config):
        self.num_labels = config.num_labels
        classifier_dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(classifier_dropout if classifier_dropout is not None else 0.0)
        self.score = nn.Linear(self.pooled_size(config), config.num_labels, bias=self.score_bias)

    def pooled_size(self, config) -> int:
        return config.hidden_size

    def pool(self, hidden_states, input_ids, attention_mask) -> torch.Tensor:
        return last_token_states(hidden_states, input_ids, attention_mask, self.config.pad_token_id)

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ):
        """labels: `[batch]` class ids (float `[batch, num_labels]` for multi-label, `[batch]` floats for
        regression). A head whose output has no cache field asks its base model for no cache."""
        if CACHE_NAME not in self.output_class.__dataclass_fields__:
            cache, use_cache = None, False
        outputs = self.call_base_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        pooled = self.pool(outputs.last_hidden_state, input_ids, attention_mask)
        logits = self.score(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(self.config, logits, labels)
            loss = self.add_auxiliary_losses(loss, outputs, attention_mask)
        return head_output(self.output_class, outputs, loss=loss, logits=logits)


__all__ = [
    "CausalLMHeadMixin",
    "MaskedLMHeadMixin",
    "SequenceClassificationHeadMixin",
    "TxvHeadMixin",
    "head_output",
]
