"""The base-model forward and the causal-LM head of the XL family (Transformer-XL, Gated Transformer-XL, Adaptive
Span), written once around `txv_xl`'s backbone: a variant's `<V>Model` and `<V>ForCausalLM` keep their names,
parameter names and output classes and only say what differs (`output_class`, `backbone_inputs`)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init
from transformers.utils import can_return_tuple

from .txv_adaptive_head import adaptive_lm_outputs, adaptive_tied_weights_keys
from .txv_adaptive_softmax import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, ProjectionList
from .txv_compat import accepts_cache_names, cache_field
from .txv_feedforward import PositionwiseFeedForward
from .txv_heads import CausalLMHeadMixin, head_output
from .txv_inputs import embed_inputs
from .txv_relative_attention import RelativePositionAttention
from .txv_xl import XLCausalLMOutput, XLModelOutput, build_final_norm, init_mechanism_weights
from .txv_xl_memory import MemoryCache


class NormedRelativeAttention(RelativePositionAttention):
    """Relative attention holding the layer norm of its sub-layer (`layer_norm`), as transfo-xl's `dec_attn`."""

    def __init__(self, config, own_biases: bool = True):
        super().__init__(config, own_biases=own_biases)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class NormedFeedForward(PositionwiseFeedForward):
    """The position-wise feed-forward network holding the layer norm of its sub-layer (`layer_norm`)."""

    def __init__(self, config):
        super().__init__(config.hidden_size, config.intermediate_size, config.dropout)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


def init_xl_weights(module: nn.Module, std: float):
    """`_init_weights` for what the XL family adds to the standard modules: the u / v biases of the relative
    attention, the adaptive embedding / softmax projections and cluster logits (N(0, std)) and the mechanisms'
    parameters (gates, spans)."""
    if isinstance(module, RelativePositionAttention) and hasattr(module, "r_w_bias"):
        init.normal_(module.r_w_bias, 0.0, std)
        init.normal_(module.r_r_bias, 0.0, std)
    elif isinstance(module, ProjectionList):
        for projection in module:
            init.normal_(projection, 0.0, std)
    elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
        init.normal_(module.cluster_weight, 0.0, std)
        init.zeros_(module.cluster_bias)
    init_mechanism_weights(module, std)


def build_token_embeddings(config) -> nn.Module:
    """The input embeddings `embed_tokens`: the adaptive embedding with `config.adaptive`, else one table."""
    if config.adaptive:
        return AdaptiveEmbedding(config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val)
    return nn.Embedding(config.vocab_size, config.hidden_size)


class XLModelMixin:
    """`forward` of an XL-family base model (mixed in before `XLBackboneMixin`): the input embeddings
    (`get_input_embeddings()`), the XL backbone over [memory; segment], then `output_class` with the fields it has
    (`last_hidden_state`, `span_penalty`, the cache, `hidden_states`, `attentions`, `attended_keys`)."""

    output_class = XLModelOutput

    def build_stack(self, config, layer_class):
        """The parts `XLBackboneMixin` runs: `drop`, `num_hidden_layers` layers of `layer_class` and the final
        `norm`."""
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layer_class(config) for _ in range(config.num_hidden_layers))
        self.norm = build_final_norm(config)
        self.gradient_checkpointing = False

    def backbone_inputs(self, cache, **kwargs) -> tuple[MemoryCache | None, dict]:
        """The memory this segment starts from and the variant's extra `forward_segment` options (none by default)."""
        return cache, {}

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: MemoryCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ):
        """
        input_ids `[batch, length]`, or inputs_embeds `[batch, length, hidden_size]` (e.g. embedded observations).
        attention_mask: `[batch, >= length]`, 1 for real tokens and 0 for padding; its last `length` columns describe
            the segment (generation passes the whole sequence).
        cache (also accepted as `past_key_values`): the `MemoryCache` returned by the previous segment, updated in
            place and returned.
        The variant's own inputs (e.g. `episode_starts`, `mems`) are described by its `backbone_inputs`.
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.get_input_embeddings(), config.vocab_size, config.hidden_size
        )
        memory, options = self.backbone_inputs(cache, **kwargs)
        backbone = self.forward_segment(
            inputs_embeds,
            attention_mask=attention_mask,
            cache=memory,
            use_cache=use_cache,
            output_attentions=output_attentions,
            **options,
        )
        hidden_states = backbone.last_hidden_state
        return head_output(
            self.output_class,
            {},
            last_hidden_state=hidden_states,
            span_penalty=backbone.span_penalty,
            **cache_field(backbone.cache if use_cache else None),
            hidden_states=tuple(backbone.layer_inputs) + (hidden_states,) if output_hidden_states else None,
            attentions=tuple(backbone.attentions) if output_attentions else None,
            attended_keys=backbone.attended_keys,
        )


class XLCausalLMHeadMixin(CausalLMHeadMixin):
    """The causal-LM head of the XL family: loss = lm_loss + adapt_span_loss * span_penalty (just lm_loss without
    adaptive span); the memory is kept across `generate()` steps. With the adaptive softmax
    (`config.uses_adaptive_softmax`) the head is Transformer-XL's projected adaptive softmax (`crit`, tied to the
    base model's adaptive input embedding as transfo-xl ties it), whose logits are log-probabilities and which also
    gives the per-token NLLs (`losses`, to an output class that has the field).

    `return_logits=False` (keyword) leaves the logits out: with labels, the adaptive softmax then evaluates only the
    clusters of the targets and never makes the `[tokens, vocabulary]` log-probabilities (what training needs)."""

    output_class = XLCausalLMOutput
    head_options = ("return_logits",)

    def build_heads(self, config):
        if not config.uses_adaptive_softmax:
            return super().build_heads(config)
        self.crit = ProjectedAdaptiveLogSoftmax(
            config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val
        )

    def lm_outputs(self, outputs, labels, logits_to_keep, attention_mask, return_logits=True, **loss_kwargs) -> dict:
        if not self.config.uses_adaptive_softmax:  # the logits are made for the loss anyway
            fields = super().lm_outputs(outputs, labels, logits_to_keep, attention_mask, **loss_kwargs)
            return fields if return_logits else {**fields, "logits": None}
        logits, losses, lm_loss = adaptive_lm_outputs(
            self.crit,
            outputs.last_hidden_state,
            self.config.vocab_size,
            labels,
            logits_to_keep,
            return_logits=return_logits,
            **loss_kwargs,
        )
        loss = None if lm_loss is None else self.add_auxiliary_losses(lm_loss, outputs, attention_mask)
        return {"loss": loss, "logits": logits, "lm_loss": lm_loss, "losses": losses}

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        embedding_path = f"{self.base_model_prefix}.{self.backbone_class._input_embed_layer}"
        if self.config.uses_adaptive_softmax:
            return adaptive_tied_weights_keys(self.config, embedding_path)
        return {"lm_head.weight": f"{embedding_path}.weight"}

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        if self.config.uses_adaptive_softmax:  # the legacy rules decide (`tie_word_embeddings`, `tie_projs`)
            return self._tied_weights_keys
        return super().get_expanded_tied_weights_keys(all_submodels)

    def add_auxiliary_losses(self, loss, outputs, attention_mask):
        if outputs.span_penalty is None:
            return loss
        return loss + self.config.adapt_span_loss * outputs.span_penalty

    @property
    def carries_memory(self) -> bool:
        """Whether the cache is a memory carried from one segment to the next (`mem_len` > 0)."""
        return self.base_model.carries_memory

    def initial_cache(self, batch_size: int, dtype=None, device=None) -> MemoryCache:
        """The memory a first segment starts with (see `config.memory_init`)."""
        return self.base_model.initial_cache(batch_size, dtype, device)


class MemoryGenerationMixin:
    """For the causal LMs of the XL family, placed before `GenerationMixin`: `generate()` keeps the model's own
    `MemoryCache` (never a `DynamicCache`) and feeds one new token per step; a model without memory (`mem_len=0`)
    gets the whole sequence at every step instead, since nothing else would carry the context.

    The models are stateful for transformers (`_is_stateful`): a memory trimmed to `mem_len` cannot be rolled back,
    so assisted decoding gets transformers' own clear error instead of failing inside."""

    _is_stateful = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    @accepts_cache_names
    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, cache=None, **kwargs):
        if self.config.mem_len == 0:
            next_sequence_length, cache = None, None
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, **cache_field(cache), **kwargs
        )


__all__ = [
    "MemoryGenerationMixin",
    "NormedFeedForward",
    "NormedRelativeAttention",
    "XLCausalLMHeadMixin",
    "XLModelMixin",
    "build_token_embeddings",
    "init_xl_weights",
]
