"""Adaptive Attention Span (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers").

A Transformer-XL-style decoder language model: segment memory carried as the cache (the shared
`MemoryCache`), the shared Transformer-XL relative attention, and in every head the learned soft span mask of
`txv_adaptive_span.AdaptiveSpan`, passed to the attention as an exact additive term (so SDPA stays exact). The L1 span
penalty is added to the loss with `adapt_span_loss` and returned as `span_penalty`. With `adapt_span_cache` each layer
attends only to the keys its current spans can reach, and the memory keeps only what the longest span needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.utils import can_return_tuple

from .configuration_adaptive_span import AdaptiveSpanConfig
from .txv_adaptive_head import adaptive_tied_weights_keys, xl_lm_head
from .txv_adaptive_softmax import ProjectedAdaptiveLogSoftmax
from .txv_adaptive_span import AdaptiveSpan, with_span_penalty
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_gates import build_gate
from .txv_inputs import embed_inputs, segment_padding_mask
from .txv_pretrained import TxvPreTrainedModel
from .txv_relative_attention import relative_position_embeddings
from .txv_xl import (
    NormedFeedForward,
    NormedRelativeAttention,
    XLBackboneOutput,
    XLCausalLMOutput,
    XLModelOutput,
    allowed_keys,
    build_adaptive_span,
    build_final_norm,
    build_token_embeddings,
    init_xl_weights,
    is_all_real,
    keep_last_memory,
    leading_padding_as_zero_memory,
    residual_form,
    restrict_to_episodes,
)
from .txv_xl_config import attention_window
from .txv_xl_memory import MemoryCache, memory_for_input
from .txv_xl_step import STEP_SETTING_FIELDS, StepWeights, parameter_version, step_support, xl_step


@dataclass
class AdaptiveSpanModelOutput(XLModelOutput):
    """attended_keys: per layer, the number of keys the layer's attention computed (after trimming)."""

    attended_keys: tuple[int, ...] | None = None


class AdaptiveSpanCausalLMOutput(XLCausalLMOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty."""


class AdaptiveSpanAttention(NormedRelativeAttention):
    """`attn`: relative attention with its layer norm and, when enabled, the learned spans (`adaptive_span`)."""


# Copied from hf_txvariants.modeling_transfo_xl.TransfoXLFeedForward with TransfoXL->AdaptiveSpan
class AdaptiveSpanFeedForward(NormedFeedForward):
    """`pos_ff`: the position-wise feed-forward network and its layer norm."""


# Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLayer with TransfoXL->AdaptiveSpan, dec_attn->attn
class AdaptiveSpanLayer(GradientCheckpointingLayer):
    """One XL layer: relative attention over [memory; segment], then the feed-forward network, in the residual form
    of the config (`residual_form`), with the gates and the adaptive span the config asks for.

    Its parts are built under the names of the checkpoints (`attn` holding its layer norm, `pos_ff` holding its
    own) and read under the names of their roles, the properties below (what GTrXL's layer names its modules, and
    what the one-position step `txv_xl_step` reads), when called: a module wrapped later (e.g. by PEFT) is the one
    used."""

    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__()
        self.attn = AdaptiveSpanAttention(config)
        self.pos_ff = AdaptiveSpanFeedForward(config)
        self.add_mechanisms(config)

    @property
    def attention(self) -> AdaptiveSpanAttention:
        return self.attn

    @property
    def attention_norm(self) -> nn.LayerNorm:
        return self.attn.layer_norm

    @property
    def feed_forward(self) -> AdaptiveSpanFeedForward:
        return self.pos_ff

    @property
    def feed_forward_norm(self) -> nn.LayerNorm:
        return self.pos_ff.layer_norm

    def add_mechanisms(self, config):
        """The gates of the identity map reordering (`attention_gate`, `feed_forward_gate`) and the span module of the
        attention (`adaptive_span`), as the config asks for them."""
        self.residual = residual_form(config)
        if self.residual == "reordered":
            gate_type = "residual" if config.gate_type == "trxl_i" else config.gate_type
            self.attention_gate = build_gate(gate_type, config.hidden_size, config.gate_bias)
            self.feed_forward_gate = build_gate(gate_type, config.hidden_size, config.gate_bias)
        span = build_adaptive_span(config)
        self.has_adaptive_span = span is not None
        if span is not None:
            self.attention.adaptive_span = span
        self.span_cache = config.adapt_span_cache

    def forward(
        self,
        hidden_states,
        position_embeddings,
        allowed,
        memory=None,
        shared_biases=None,
        output_attentions=False,
        key_values=None,
        key_window=None,
    ):
        """position_embeddings `[M + Q (+ 1), hidden]` and allowed `[..., Q, M + Q]` for the full memory
        `[B, M, hidden]`; key_values: the layer's `KeyValueSlot` in evaluation and key_window the distances `allowed`
        lets a query see (`attention_window`), see `RelativePositionAttention`.
        Returns the output, the attention weights (or None), the layer's span penalty (or None) and
        `(attended key count, memory the layer needs or None)`."""
        span_bias = penalty = needed_memory = None
        if self.has_adaptive_span:
            span = self.attention.adaptive_span
            spans = span.spans(hidden_states)
            penalty = span.penalty(spans)
            if self.span_cache and not torch.compiler.is_compiling():
                # keys at distance >= required_keys have weight exactly 0: drop the memory that only they use
                needed_memory = span.required_keys(spans) - 1
                memory, position_embeddings, allowed = keep_last_memory(
                    memory, position_embeddings, allowed, needed_memory, hidden_states.shape[1]
                )
            span_bias = span.attention_bias(spans, hidden_states.shape[1], allowed.shape[-1], hidden_states.dtype)
        key_length = allowed.shape[-1]

        attended, weights = self.attention(
            hidden_states,
            position_embeddings,
            allowed,
            memory=memory,
            context_norm=None if self.residual == "post_norm" else self.attention_norm,
            shared_biases=shared_biases,
            output_attentions=output_attentions,
            attention_bias=span_bias,
            key_values=key_values,
            key_window=key_window,
        )
        if self.residual == "post_norm":
            hidden_states = self.attention_norm(hidden_states + attended)
            hidden_states = self.feed_forward_norm(hidden_states + self.feed_forward(hidden_states))
        elif self.residual == "pre_norm":
            hidden_states = hidden_states + attended
            hidden_states = hidden_states + self.feed_forward(self.feed_forward_norm(hidden_states))
        else:
            hidden_states = self.attention_gate(hidden_states, torch.relu(attended))
            transformed = self.feed_forward(self.feed_forward_norm(hidden_states))
            hidden_states = self.feed_forward_gate(hidden_states, torch.relu(transformed))
        return hidden_states, weights, penalty, (key_length, needed_memory)


class AdaptiveSpanPreTrainedModel(TxvPreTrainedModel):
    config_class = AdaptiveSpanConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["AdaptiveSpanLayer"]
    _supports_sdpa = True  # the span mask is an exact additive term
    _supports_flex_attn = True  # the span mask is an additive term of the score_mod (txv_relative_attention)
    auto_classes = {"AutoModel": "AdaptiveSpanModel", "AutoModelForCausalLM": "AdaptiveSpanForCausalLM"}
    head_key_patterns = (r"^lm_head\.", r"^crit\.")

    # Copied from hf_txvariants.modeling_gtrxl.GTrXLPreTrainedModel._init_weights
    def _init_weights(self, module):
        super()._init_weights(module)
        init_xl_weights(module, self.config.initializer_range)

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLPreTrainedModel.clamp_spans_
    def clamp_spans_(self):
        """Clamps every learned span into [0, attn_span]; call after each optimiser step (original `clamp_param`). A
        no-op without adaptive span."""
        for module in self.modules():
            if isinstance(module, AdaptiveSpan):
                module.clamp_()

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLPreTrainedModel.get_spans
    def get_spans(self) -> torch.Tensor | None:
        """`[layers, heads]` the current static spans in tokens (None for dynamic spans or without adaptive span)."""
        spans = [m.spans().detach() for m in self.modules() if isinstance(m, AdaptiveSpan) and not m.dynamic]
        return torch.stack(spans) if spans else None


class AdaptiveSpanModel(AdaptiveSpanPreTrainedModel):
    """The token embeddings (`embed_tokens`), `num_hidden_layers` XL layers with learned spans over [memory;
    segment] and the memory update (`forward_segment`, see `txv_xl`)."""

    # Copied from hf_txvariants.modeling_gtrxl.GTrXLModel.__init__ with GTrXL->AdaptiveSpan
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config)
        self.embed_tokens = build_token_embeddings(config)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(AdaptiveSpanLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = build_final_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

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
    ) -> AdaptiveSpanModelOutput:
        """
        input_ids `[batch, length]`, or inputs_embeds `[batch, length, hidden_size]`.
        attention_mask: `[batch, >= length]`, 1 for real tokens and 0 for padding; its last `length` columns describe
            the segment (generation passes the whole sequence).
        cache (also accepted as `past_key_values`): the `MemoryCache` returned by the previous segment, updated in
            place and returned (trimmed to what the learned spans need with `adapt_span_cache`).
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        backbone = self.forward_segment(
            inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
        )
        hidden_states = backbone.last_hidden_state
        return AdaptiveSpanModelOutput(
            last_hidden_state=hidden_states,
            span_penalty=backbone.span_penalty,
            **cache_field(backbone.cache if use_cache else None),
            hidden_states=tuple(backbone.layer_inputs) + (hidden_states,) if output_hidden_states else None,
            attentions=tuple(backbone.attentions) if output_attentions else None,
            attended_keys=backbone.attended_keys,
        )

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.forward_segment
    def forward_segment(
        self,
        inputs_embeds: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        cache: MemoryCache | None = None,
        use_cache: bool = True,
        output_attentions: bool = False,
        episode_starts: torch.Tensor | None = None,
        shared_biases=None,
    ) -> XLBackboneOutput:
        """The XL backbone over a segment `inputs_embeds [batch, length, hidden]` against the memory (`cache`, a fresh
        one when None), which `use_cache` updates in place (see `txv_xl`). A call of one position per row that keeps
        the cache and wants no attention weights goes through the one-position step where it can (`forward_step`),
        which computes the same within float rounding.

        episode_starts: `[batch, length]` bool, True where a new episode begins: that step and the later ones attend to
        nothing before it (neither memory nor earlier steps), and the memory keeps only the new episode.
        shared_biases: the u / v position biases `(r_w_bias, r_r_bias)` shared by all layers (None: each layer's)."""
        config = self.config
        batch, query_length = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        cache = memory_for_input(
            cache,
            lambda: self.initial_cache(batch, inputs_embeds.dtype, device),
            batch_size=batch,
            hidden_size=config.hidden_size,
            num_layers=len(self.layers),
            model_type=config.model_type,
        )
        if use_cache and not output_attentions and query_length == 1:
            layer_inputs = []
            hidden = self.forward_step(
                inputs_embeds,
                cache,
                episode_starts=episode_starts,
                attention_mask=attention_mask,
                layer_inputs=layer_inputs,
            )
            if hidden is not None:
                return XLBackboneOutput(
                    last_hidden_state=hidden,
                    cache=cache,
                    layer_inputs=layer_inputs,
                    attentions=[None] * len(layer_inputs),
                    span_penalty=None,
                    attended_keys=(None,) * len(layer_inputs),
                )
        input_mask = segment_padding_mask(attention_mask, batch, query_length, device)
        memory_length = cache.memory_length
        leading_padding = None
        if input_mask is not None and cache.memory_init == "zeros" and cache.seen_tokens == 0 and memory_length > 0:
            leading_padding, zero_slots, cache.memory_mask = leading_padding_as_zero_memory(input_mask, memory_length)
            input_mask = input_mask | zero_slots
        window = attention_window(config)
        allowed = allowed_keys(cache, query_length, input_mask, device, window)
        restarted = in_episode = None
        if episode_starts is not None:
            allowed, restarted, in_episode = restrict_to_episodes(allowed, episode_starts, batch, memory_length)

        # In evaluation the memory's keys and values are reused (exact: same weights, same memory vectors), and so are
        # the relative position table and its projections (the cache's `reuse`); a pass that records gradients or
        # trains drops them, since the weights change and the gradient must reach W_k, W_v, W_r
        clamp_len, hidden_size = getattr(config, "clamp_len", 0), config.hidden_size

        def position_table(key_length: int) -> torch.Tensor:
            return relative_position_embeddings(key_length, hidden_size, clamp_len, inputs_embeds.dtype, device)

        key_value_slots = [None] * len(self.layers)
        if not self.training and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            key_value_slots = cache.reuse.key_value_slots()
            table_key = (clamp_len, hidden_size, inputs_embeds.dtype, device)
            position_embeddings = cache.reuse.relative_table(
                memory_length + query_length, position_table, table_key, cache.mem_len + 1
            )
        else:
            cache.forget_key_values()
            position_embeddings = self.drop(position_table(memory_length + query_length))

        hidden_states = self.drop(inputs_embeds)
        layer_inputs, attentions, penalties, attended_keys = [], [], [], []
        for layer_idx, layer in enumerate(self.layers):
            if leading_padding is not None:
                hidden_states = hidden_states.masked_fill(leading_padding[..., None], 0.0)
            layer_inputs.append(hidden_states)
            hidden_states, weights, penalty, keys = layer(
                hidden_states,
                position_embeddings,
                allowed,
                memory=cache.layer_memory(layer_idx),
                shared_biases=shared_biases,
                output_attentions=output_attentions,
                key_values=key_value_slots[layer_idx],
                key_window=window,
            )
            attentions.append(weights)
            penalties.append(penalty)
            attended_keys.append(keys)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        hidden_states = self.drop(hidden_states)
        span_penalty = torch.stack(penalties).sum() if penalties and penalties[0] is not None else None

        if use_cache:
            needed = [needed for _, needed in attended_keys if needed is not None]
            if needed and not config.adapt_span_dynamic:
                # keep only the memory the longest learned span needs (every layer's memory has the same length);
                # dynamic spans depend on future queries, so their memory is not trimmed (only their keys are)
                cache.mem_len = min(config.mem_len, max(needed))
            if restarted is not None:
                # rows whose episode restarted forget everything before the restart
                cache.reset_rows(restarted, memory_init="empty")
                if in_episode is not None:
                    input_mask = in_episode if input_mask is None else input_mask & in_episode
            cache.update_memories(layer_inputs, input_mask)
        return XLBackboneOutput(
            last_hidden_state=hidden_states,
            cache=cache,
            layer_inputs=layer_inputs,
            attentions=attentions,
            span_penalty=span_penalty,
            attended_keys=tuple(keys for keys, _ in attended_keys),
        )

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.carries_memory
    @property
    def carries_memory(self) -> bool:
        """Whether the cache is a memory carried from one segment to the next (`mem_len` > 0), as training and
        evaluation streams carry it."""
        return self.config.mem_len > 0

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.initial_cache
    def initial_cache(self, batch_size: int, dtype=None, device=None) -> MemoryCache:
        """The memory a first segment starts with (see `config.memory_init`)."""
        parameter = next(self.parameters())
        return MemoryCache.initial(
            self.config.num_hidden_layers,
            self.config.mem_len,
            batch_size,
            self.config.hidden_size,
            self.config.memory_init,
            dtype or parameter.dtype,
            device or parameter.device,
            model_type=self.config.model_type,
        )

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.forget_step_cache
    def forget_step_cache(self):
        """Drops whether this model can step (`step_support`), its parameter list and its `StepWeights`."""
        self._step_support = self._step_parameters = self._step_weights = None

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.train
    def train(self, mode: bool = True):
        self.forget_step_cache()
        return super().train(mode)

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel._apply
    def _apply(self, fn, *args, **kwargs):
        self.forget_step_cache()
        return super()._apply(fn, *args, **kwargs)

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel._step_setting
    def _step_setting(self) -> tuple:
        """The config fields the one-step path depends on (`STEP_SETTING_FIELDS`), read from the config's instance
        dict: reading a `PretrainedConfig` attribute costs 1-2 us, and an acting agent checks these on every call."""
        return tuple(map(vars(self.config).get, STEP_SETTING_FIELDS))

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.step_unsupported
    def step_unsupported(self) -> str:
        """Why `txv_xl_step` cannot step this model as configured now ("" if it can), kept per setting it reads."""
        setting = self._step_setting()
        known = getattr(self, "_step_support", None)
        if known is None or known[0] != setting:
            known = self._step_support = (setting, step_support(self) or "")
        return known[1]

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.step_weights
    def step_weights(self) -> StepWeights:
        """This model's `txv_xl_step.StepWeights`, made again whenever a parameter changed (an optimiser step or a
        load writes in place, which moves its version) or a field of `STEP_SETTING_FIELDS` did."""
        if getattr(self, "_step_parameters", None) is None:
            self._step_parameters = list(self.parameters())
        token = (self._step_setting(), *map(parameter_version, self._step_parameters))
        weights = getattr(self, "_step_weights", None)
        if weights is None or weights.token != token:
            weights = self._step_weights = StepWeights(self, token)
        return weights

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.forward_step
    def forward_step(
        self,
        inputs_embeds: torch.Tensor,
        cache: MemoryCache,
        *,
        episode_starts: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        layer_inputs: list | None = None,
    ) -> torch.Tensor | None:
        """The one door into the one-position step (`txv_xl_step`), taken by `generate()` (through `forward_segment`)
        and by acting agents (`hf_txvariants.rl.GTrXLBody`): the last hidden state `[rows, 1, hidden]` of one new
        position per row (`inputs_embeds [rows, 1, hidden]`), the `cache` advanced by it in place (its step layout,
        `MemoryCache.step_layout`). episode_starts `[rows, 1]` bool: True where an episode begins (that position
        attends to nothing before it, as `forward_segment`); attention_mask: a row whose new position is padding
        cannot step; `layer_inputs`, a list, gets each layer's input `[rows, 1, hidden]`.

        None (nothing changed) where the step cannot serve this call, and `forward_segment` computes the same: the
        model (`step_unsupported()`), more than one position, a pass that trains, records gradients, runs under
        autocast or torch.compile, a cache of other rows, layers or model, or a memory empty or longer than mem_len."""
        rows, length = inputs_embeds.shape[:2]
        mem_len = self.config.mem_len
        if (
            length != 1
            or self.training
            or torch.is_grad_enabled()
            or torch.is_autocast_enabled(inputs_embeds.device.type)
            or torch.compiler.is_compiling()
            or cache.batch_size != rows
            or not 0 < cache.memory_length <= mem_len
            or cache.num_layers != len(self.layers)
            or cache.model_type not in (None, self.config.model_type)
            or (episode_starts is not None and tuple(episode_starts.shape) != (rows, 1))
            or self.step_unsupported()
            or not is_all_real(segment_padding_mask(attention_mask, rows, 1, inputs_embeds.device))
        ):
            return None
        starts = None if episode_starts is None else episode_starts[:, 0].to(inputs_embeds.device, torch.bool)
        inputs = [] if layer_inputs is not None else None
        # inference mode skips autograd's bookkeeping on each of the step's ~100 small ops (~15 % of a step); its
        # tensors stay in the cache's step layout, and what leaves is copied into ordinary tensors, which a caller
        # may change in place (an inference tensor refuses that)
        with torch.inference_mode():
            hidden = xl_step(self.step_weights(), cache.step_layout(mem_len), inputs_embeds[:, 0], starts, inputs)
        cache.stepped()
        if layer_inputs is not None:
            layer_inputs.extend(layer_input[:, None].clone() for layer_input in inputs)
        return hidden[:, None].clone()


class AdaptiveSpanForCausalLM(AdaptiveSpanPreTrainedModel, GenerationMixin):
    """The adaptive-span language model; the output layer is tied to the input embeddings. The memory is kept across
    `generate()` steps (a `MemoryCache`), trimmed to what the learned spans need; stateful for transformers
    (`_is_stateful`: assisted decoding is refused). `return_logits=False` (keyword) leaves the logits out."""

    _is_stateful = True
    head_options = ("return_logits",)  # keyword arguments read by the head, not passed to the base model

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel.__init__ with TransfoXL->AdaptiveSpan
    def __init__(self, config: AdaptiveSpanConfig):
        super().__init__(config)
        self.transformer = AdaptiveSpanModel(config)
        if config.uses_adaptive_softmax:
            self.crit = ProjectedAdaptiveLogSoftmax(
                config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val
            )
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel._tied_weights_keys with TransfoXL->AdaptiveSpan
    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        embedding_path = f"{self.base_model_prefix}.{AdaptiveSpanModel._input_embed_layer}"
        if self.config.uses_adaptive_softmax:
            return adaptive_tied_weights_keys(self.config, embedding_path)
        return {"lm_head.weight": f"{embedding_path}.weight"}

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel.get_expanded_tied_weights_keys
    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        if self.config.uses_adaptive_softmax:  # the legacy rules decide (`tie_word_embeddings`, `tie_projs`)
            return self._tied_weights_keys
        return super().get_expanded_tied_weights_keys(all_submodels)

    # Copied from hf_txvariants.modeling_gtrxl.GTrXLForCausalLM.forward with GTrXL->AdaptiveSpan, model->transformer
    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: MemoryCache | None = None,
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
    ) -> AdaptiveSpanCausalLMOutput:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        return_logits (keyword): False leaves the logits out (with labels, the adaptive softmax then evaluates only the
            clusters of the targets and never makes the `[tokens, vocabulary]` log-probabilities).
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        Other keyword arguments (e.g. `episode_starts`) go to `AdaptiveSpanModel`.
        loss = lm_loss + adapt_span_loss * span_penalty (just lm_loss without adaptive span)."""
        return_logits = kwargs.pop("return_logits", True)
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None and not getattr(self.config, "add_cross_attention", False):
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        outputs = self.transformer(
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
        logits, _, lm_loss = xl_lm_head(
            self.crit if self.config.uses_adaptive_softmax else self.lm_head,
            outputs.last_hidden_state,
            self.config,
            labels,
            logits_to_keep,
            return_logits=return_logits,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )
        loss = with_span_penalty(lm_loss, outputs.span_penalty, self.config.adapt_span_loss)
        return AdaptiveSpanCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            span_penalty=outputs.span_penalty,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel.carries_memory
    @property
    def carries_memory(self) -> bool:
        """Whether the cache is a memory carried from one segment to the next (`mem_len` > 0)."""
        return self.transformer.carries_memory

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel.initial_cache
    def initial_cache(self, batch_size: int, dtype=None, device=None) -> MemoryCache:
        """The memory a first segment starts with (see `config.memory_init`)."""
        return self.transformer.initial_cache(batch_size, dtype, device)

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel._supports_default_dynamic_cache
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # `generate()` keeps the model's own `MemoryCache`, never a `DynamicCache`

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLLMHeadModel.prepare_inputs_for_generation
    @accepts_cache_names
    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, cache=None, **kwargs):
        """One new token per step against the memory; the whole sequence at every step without memory."""
        if self.config.mem_len == 0:
            next_sequence_length, cache = None, None
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, **cache_field(cache), **kwargs
        )


__all__ = [
    "AdaptiveSpanPreTrainedModel",
    "AdaptiveSpanModel",
    "AdaptiveSpanForCausalLM",
    "AdaptiveSpanModelOutput",
    "AdaptiveSpanCausalLMOutput",
]
