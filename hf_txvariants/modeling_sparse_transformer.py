"""Sparse Transformer (Child, Gray, Radford and Sutskever 2019, "Generating Long Sequences with Sparse Transformers").

A pre-activation decoder (x + attn(LN(x)), x + FF(LN(x)), GELU, output projections initialised with std / sqrt(2N))
whose attention is restricted to a factorised pattern from `txv_patterns` (strided or fixed), used one of the
paper's three ways (`pattern_mode`): interleaved per residual block, merged, or per head. Every pattern runs as tiles
of dense attention through the fused kernel (trains on CPU), FlexAttention or a dense reference mask, with equal
results; "auto" picks the fastest for the device. Decoding with a key/value cache attends from the new positions with
the same pattern (dense mask over the cached keys, O(L) per token).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
)
from transformers.utils import can_return_tuple

from .configuration_sparse_transformer import SparseTransformerConfig
from .txv_attention import all_tokens_real
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_inputs import check_right_padding, embed_inputs
from .txv_losses import causal_lm_head
from .txv_mha import cache_past_length
from .txv_pattern_attention import PatternSelfAttention
from .txv_patterns import Causal, Fixed, Local1D, PerHead, SlidingWindow, Strided
from .txv_pretrained import TxvPreTrainedModel
from .txv_sequence_classification import last_token_states, sequence_classification_loss


def layer_patterns(config: SparseTransformerConfig) -> list:
    """The attention pattern of every layer, from `attention_pattern` and `pattern_mode`."""
    paper = config.pattern_convention == "paper"
    base = {
        "strided": lambda: Strided(config.stride, paper),
        "fixed": lambda: Fixed(config.stride, config.summary_size, paper),
        "causal": Causal,
        "sliding_window": lambda: SlidingWindow(config.stride),
        "local1d": lambda: Local1D(config.stride),
    }[config.attention_pattern]()
    factors = base.factors()
    if len(factors) == 1 or config.pattern_mode == "merged":
        return [base] * config.num_hidden_layers
    if config.pattern_mode == "per_head":
        return [PerHead(tuple(factors))] * config.num_hidden_layers
    return [factors[i % len(factors)] for i in range(config.num_hidden_layers)]


class SparseTransformerMLP(nn.Module):
    def __init__(self, config: SparseTransformerConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states):
        return self.dropout(self.fc_out(self.act(self.fc_in(hidden_states))))


class SparseTransformerLayer(GradientCheckpointingLayer):
    """Paper eq. (pre-activation residual block): H_k = H_{k-1} + attn(LN(H_{k-1})), then + ff(LN(.))."""

    def __init__(self, config: SparseTransformerConfig, layer_idx: int, pattern):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = PatternSelfAttention(config, layer_idx, pattern)
        self.ln_mlp = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SparseTransformerMLP(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states, key_padding_mask=None, cache=None, output_attentions=False):
        attention_output, weights = self.attn(self.ln_attn(hidden_states), key_padding_mask, cache, output_attentions)
        hidden_states = hidden_states + self.dropout(attention_output)
        hidden_states = hidden_states + self.mlp(self.ln_mlp(hidden_states))
        return hidden_states, weights


class SparseTransformerPreTrainedModel(TxvPreTrainedModel):
    config_class = SparseTransformerConfig
    _no_split_modules = ["SparseTransformerLayer"]
    _supports_sdpa = True
    auto_classes = {
        "AutoModel": "SparseTransformerModel",
        "AutoModelForCausalLM": "SparseTransformerForCausalLM",
        "AutoModelForSequenceClassification": "SparseTransformerForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")

    def _init_weights(self, module):
        super()._init_weights(module)
        # Paper section 5.2: residual-branch output projections scaled by 1 / sqrt(2N).
        if isinstance(module, (PatternSelfAttention, SparseTransformerMLP)):
            output = module.o_proj if isinstance(module, PatternSelfAttention) else module.fc_out
            init.normal_(
                output.weight, 0.0, self.config.initializer_range / math.sqrt(2 * self.config.num_hidden_layers)
            )


class SparseTransformerModel(SparseTransformerPreTrainedModel):
    def __init__(self, config: SparseTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.image_shape is None:
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        else:
            height, width, channels = config.image_shape
            self.embed_rows = nn.Embedding(height, config.hidden_size)
            self.embed_cols = nn.Embedding(width, config.hidden_size)
            self.embed_channels = nn.Embedding(channels, config.hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            SparseTransformerLayer(config, i, pattern) for i, pattern in enumerate(layer_patterns(config))
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()
        if 0 < config.gradient_checkpointing_min_layers <= config.num_hidden_layers:
            self.activation_checkpointing_enable()

    def position_embeddings(self, positions: torch.Tensor) -> torch.Tensor:
        if self.config.image_shape is None:
            return self.embed_positions(positions)
        _, width, channels = self.config.image_shape
        channel = positions % channels
        column = torch.div(positions, channels, rounding_mode="floor") % width
        row = torch.div(positions, channels * width, rounding_mode="floor")
        return self.embed_rows(row) + self.embed_cols(column) + self.embed_channels(channel)

    # Copied from hf_txvariants.modeling_r_transformer.RTransformerModel._run_layers
    def _run_layers(self, hidden_states, output_attentions: bool, output_hidden_states: bool, **layer_inputs):
        """The layers over `hidden_states` (each also given `layer_inputs`, by name), then the final norm (when the
        model has one). Returns `(last hidden states, what entered each layer then the last hidden states, every
        layer's attention weights)`, the last two None unless `output_hidden_states` / `output_attentions`."""
        all_hidden_states, all_attentions = [], []
        for layer in self.layers:
            all_hidden_states.append(hidden_states)
            hidden_states, weights = layer(hidden_states, output_attentions=output_attentions, **layer_inputs)
            all_attentions.append(weights)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        all_hidden_states.append(hidden_states)
        return (
            hidden_states,
            tuple(all_hidden_states) if output_hidden_states else None,
            tuple(all_attentions) if output_attentions else None,
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
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """attention_mask: `[batch, past + length]`, 1 for real tokens, 0 for padding (padded keys are never seen).
        Positions (and the pattern) count from the first column, so padding must end a row (right padding); a
        left-padded row, or one that goes on after padding (batched generation of rows of different lengths), would
        differ from the row alone and is refused with a ValueError."""
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        batch, length = inputs_embeds.shape[:2]
        if self.gradient_checkpointing and self.training:
            use_cache = False
        if use_cache and cache is None:
            cache = DynamicCache(config=config)
        past_length = cache_past_length(cache)
        if past_length + length > config.max_position_embeddings:
            raise ValueError(
                f"input of {past_length + length} positions is longer than max_position_embeddings "
                f"({config.max_position_embeddings})"
            )
        key_padding_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (batch, past_length + length):
                raise ValueError(
                    f"attention_mask must be [batch={batch}, past + length={past_length + length}], "
                    f"got shape {tuple(attention_mask.shape)}"
                )
            if not all_tokens_real(attention_mask):
                key_padding_mask = attention_mask.to(device=inputs_embeds.device, dtype=torch.bool)
                check_right_padding(key_padding_mask, "Sparse Transformer")
        positions = torch.arange(past_length, past_length + length, device=inputs_embeds.device)
        hidden_states = self.dropout(inputs_embeds + self.position_embeddings(positions)[None])
        cache = cache if use_cache else None
        hidden_states, all_hidden_states, all_attentions = self._run_layers(
            hidden_states, output_attentions, output_hidden_states, key_padding_mask=key_padding_mask, cache=cache
        )
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            **cache_field(cache),
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )


class SparseTransformerForCausalLM(SparseTransformerPreTrainedModel, GenerationMixin):
    """Next-token language model over text or flattened images (`config.image_shape`). The loss is in nats per
    token; divide by ln 2 for bits per dimension on images."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: SparseTransformerConfig):
        super().__init__(config)
        self.model = SparseTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    # Copied from hf_txvariants.modeling_r_transformer.RTransformerForCausalLM.forward
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
    ) -> CausalLMOutputWithPast:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        encoder_hidden_states: refused (the model has no cross-attention); encoder_attention_mask: not read.
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        Other keyword arguments go to the base model."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
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
        logits, loss = causal_lm_head(
            self.lm_head,
            outputs.last_hidden_state,
            self.config.vocab_size,
            labels,
            logits_to_keep,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class SparseTransformerForSequenceClassification(SparseTransformerPreTrainedModel):
    """A linear classifier on the hidden state of the last real token of each row."""

    def __init__(self, config: SparseTransformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = SparseTransformerModel(config)
        self.dropout = nn.Dropout(0.0)  # the config has no classifier_dropout: the forward is Shaw's head's
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
    "SparseTransformerPreTrainedModel",
    "SparseTransformerModel",
    "SparseTransformerForCausalLM",
    "SparseTransformerForSequenceClassification",
]
