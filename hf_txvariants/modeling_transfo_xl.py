"""Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context").

Segment-level recurrence (the memory is carried as the cache, a `MemoryCache`), relative positional
attention, adaptive input embeddings and a projected adaptive softmax. Parameter names are those of transformers'
legacy TransfoXL (removed in transformers 5), so its checkpoints load unchanged and reproduce its outputs.

This file is the hand-written source of what the XL family runs alike: the layer (`TransfoXLLayer`), the backbone over a
segment (`TransfoXLModel.forward_segment`, with the episode starts GTrXL passes), the one-position step door
(`forward_step` and what it keeps), the LM head's construction, tying and generation methods. `modeling_gtrxl` and
`modeling_adaptive_span` hold generated copies of them (`# Copied from`, `tools/copies.py`); the mechanisms are the
leaf blocks `txv_xl`, `txv_xl_memory`, `txv_xl_reuse`, `txv_xl_step`, `txv_relative_attention`, `txv_gates`,
`txv_adaptive_span` and `txv_adaptive_head`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import ModelOutput, SequenceClassifierOutputWithPast
from transformers.utils import can_return_tuple

from .configuration_transfo_xl import TransfoXLConfig
from .txv_adaptive_head import adaptive_tied_weights_keys, xl_lm_head
from .txv_adaptive_softmax import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, ProjectionList
from .txv_adaptive_span import AdaptiveSpan, with_span_penalty
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, model_output, output_cache
from .txv_gates import build_gate
from .txv_inputs import embed_inputs, segment_padding_mask
from .txv_pretrained import TxvPreTrainedModel
from .txv_relative_attention import RelativePositionAttention, relative_position_embeddings
from .txv_sequence_classification import last_token_states, sequence_classification_loss
from .txv_xl import (
    NormedFeedForward,
    NormedRelativeAttention,
    XLBackboneOutput,
    allowed_keys,
    build_adaptive_span,
    build_final_norm,
    init_mechanism_weights,
    is_all_real,
    keep_last_memory,
    leading_padding_as_zero_memory,
    residual_form,
    restrict_to_episodes,
)
from .txv_xl_config import attention_window
from .txv_xl_memory import MemoryCache, memory_for_input
from .txv_xl_step import STEP_SETTING_FIELDS, StepWeights, parameter_version, step_support, xl_step


@model_output
class TransfoXLModelOutput(ModelOutput):
    """`cache` is the memory for the next segment; `mems` gives it in the legacy time-major layout."""

    last_hidden_state: torch.FloatTensor | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    span_penalty: torch.FloatTensor | None = None  # with adaptive span: sum over layers of the mean span

    @property
    def mems(self) -> list[torch.Tensor] | None:
        memory = output_cache(self)
        return None if memory is None else memory.to_legacy_mems()


@model_output
class TransfoXLLMHeadModelOutput(ModelOutput):
    """`logits` are log-probabilities (the adaptive softmax is normalised); `losses` are the per-token negative
    log-likelihoods `[batch, length - 1]` in position order (0 where the label is -100; `[batch, length]` with
    `shift_labels`); `loss` is their mean (plus `adapt_span_loss * span_penalty` with adaptive span); `lm_loss` is
    that mean alone (the next-token part), `span_penalty` the adaptive span's penalty (None without adaptive span)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    lm_loss: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None

    @property
    def prediction_scores(self) -> torch.FloatTensor | None:
        return self.logits

    @property
    def mems(self) -> list[torch.Tensor] | None:
        memory = output_cache(self)
        return None if memory is None else memory.to_legacy_mems()


class TransfoXLAttention(NormedRelativeAttention):
    """`dec_attn`: relative attention and its layer norm (applied after the residual, or on the input of the
    sub-layer with `pre_lnorm`; with pre-norm the memory is normalised together with the segment)."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config, own_biases=config.untie_r)


class TransfoXLFeedForward(NormedFeedForward):
    """`pos_ff`: the position-wise feed-forward network and its layer norm."""


class TransfoXLLayer(GradientCheckpointingLayer):
    """One XL layer: relative attention over [memory; segment], then the feed-forward network, in the residual form
    of the config (`residual_form`), with the gates and the adaptive span the config asks for.

    Its parts are built under the names of the checkpoints (`dec_attn` holding its layer norm, `pos_ff` holding its
    own) and read under the names of their roles, the properties below (what GTrXL's layer names its modules, and
    what the one-position step `txv_xl_step` reads), when called: a module wrapped later (e.g. by PEFT) is the one
    used."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__()
        self.dec_attn = TransfoXLAttention(config)
        self.pos_ff = TransfoXLFeedForward(config)
        self.add_mechanisms(config)

    @property
    def attention(self) -> TransfoXLAttention:
        return self.dec_attn

    @property
    def attention_norm(self) -> nn.LayerNorm:
        return self.dec_attn.layer_norm

    @property
    def feed_forward(self) -> TransfoXLFeedForward:
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


class TransfoXLPreTrainedModel(TxvPreTrainedModel):
    config_class = TransfoXLConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["TransfoXLLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True  # Transformer-XL's relative attention through FlexAttention (txv_relative_attention)
    # Saved by the legacy model but not parameters here: the sinusoid frequencies (recomputed) and, with shared
    # u/v biases (untie_r=False), the per-layer copies of the shared `transformer.r_w_bias` / `r_r_bias`.
    _keys_to_ignore_on_load_unexpected = [r"pos_emb\.inv_freq", r"layers\.\d+\.dec_attn\.r_[wr]_bias"]
    auto_classes = {
        "AutoModel": "TransfoXLModel",
        "AutoModelForCausalLM": "TransfoXLLMHeadModel",
        "AutoModelForSequenceClassification": "TransfoXLForSequenceClassification",
    }
    head_key_patterns = (r"^crit\.", r"^score\.")

    def _init_weight(self, weight):
        if self.config.init == "uniform":
            init.uniform_(weight, -self.config.init_range, self.config.init_range)
        else:
            init.normal_(weight, 0.0, self.config.initializer_range)

    def _init_weights(self, module):
        """The original initialisation (the `init`, `init_range`, `init_std` and `proj_init_std` fields)."""
        if isinstance(module, nn.Linear):
            self._init_weight(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            self._init_weight(module.weight)
        elif isinstance(module, nn.LayerNorm):
            init.normal_(module.weight, 1.0, self.config.initializer_range)
            init.zeros_(module.bias)
        elif isinstance(module, ProjectionList):
            for projection in module:
                init.normal_(projection, 0.0, self.config.proj_init_std)
        elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
            self._init_weight(module.cluster_weight)
            init.zeros_(module.cluster_bias)
        if isinstance(module, (RelativePositionAttention, TransfoXLModel)) and hasattr(module, "r_w_bias"):
            self._init_weight(module.r_w_bias)
            self._init_weight(module.r_r_bias)
        init_mechanism_weights(module, self.config.initializer_range)

    def clamp_spans_(self):
        """Clamps every learned span into [0, attn_span]; call after each optimiser step (original `clamp_param`). A
        no-op without adaptive span."""
        for module in self.modules():
            if isinstance(module, AdaptiveSpan):
                module.clamp_()

    def get_spans(self) -> torch.Tensor | None:
        """`[layers, heads]` the current static spans in tokens (None for dynamic spans or without adaptive span)."""
        spans = [m.spans().detach() for m in self.modules() if isinstance(m, AdaptiveSpan) and not m.dynamic]
        return torch.stack(spans) if spans else None

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resizes the vocabulary of a model with one softmax cluster (`cutoffs=[]`): the input embedding and the LM
        head's softmax keep the rows of the tokens that stay, new rows get the model's initialisation (the
        `init`/`init_std` fields; `mean_resizing` is not used), and the tying is re-applied. With cutoffs the
        vocabulary is split into frequency clusters whose boundaries would have to move: a ValueError says so."""
        if new_num_tokens is None:
            return self.get_input_embeddings()
        if pad_to_multiple_of is not None:
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        config = self.config
        if config.cutoffs:
            raise ValueError(
                f"resize_token_embeddings needs cutoffs=[] (one softmax cluster), this model has cutoffs="
                f"{list(config.cutoffs)}: its adaptive embedding and softmax split the vocabulary into frequency "
                "clusters whose boundaries would move; build a new config with the new vocab_size and cutoffs instead"
            )
        if isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int) or new_num_tokens <= 0:
            raise ValueError(f"new_num_tokens must be a positive integer, got {new_num_tokens!r}")
        sizes = (new_num_tokens, config.d_embed, config.hidden_size, [], config.div_val)
        base = self.base_model
        base.word_emb = self._resized_copy(base.word_emb, AdaptiveEmbedding(*sizes))
        if hasattr(self, "crit"):
            self.crit = self._resized_copy(self.crit, ProjectedAdaptiveLogSoftmax(*sizes))
        config.vocab_size = new_num_tokens
        self.tie_weights()
        return base.word_emb

    def _resized_copy(self, old: nn.Module, new: nn.Module) -> nn.Module:
        """`new` initialised like this model, then given the tensors of `old` (the rows both vocabularies share)."""
        reference = next(old.parameters())
        new.to(device=reference.device, dtype=reference.dtype)
        new.apply(self._init_weights)
        with torch.no_grad():
            new_state = new.state_dict()
            for name, tensor in old.state_dict().items():
                rows = min(tensor.shape[0], new_state[name].shape[0])
                new_state[name][:rows] = tensor[:rows]
        return new


class TransfoXLModel(TransfoXLPreTrainedModel):
    """The adaptive input embedding (`word_emb`), `num_hidden_layers` XL layers over [memory; segment] and the memory
    update (`forward_segment`, see `txv_xl`); with `untie_r=False` the u / v position biases are shared by all layers
    (`r_w_bias`, `r_r_bias`)."""

    _input_embed_layer = "word_emb"

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        self.word_emb = AdaptiveEmbedding(
            config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val
        )
        if not config.untie_r:
            self.r_w_bias = nn.Parameter(torch.zeros(config.num_attention_heads, config.head_dim))
            self.r_r_bias = nn.Parameter(torch.zeros(config.num_attention_heads, config.head_dim))
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransfoXLLayer(config) for _ in range(config.num_hidden_layers))
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
        mems: list[torch.Tensor] | None = None,
        **kwargs,
    ) -> TransfoXLModelOutput:
        """
        input_ids `[batch, length]`, or inputs_embeds `[batch, length, hidden_size]`.
        attention_mask: `[batch, >= length]`, 1 for real tokens and 0 for padding; its last `length` columns describe
            the segment (generation passes the whole sequence).
        cache (also accepted as `past_key_values`): the `MemoryCache` returned by the previous segment, updated in
            place and returned.
        mems: the legacy memory (a list of `[mem_len, batch, hidden]` tensors), instead of the cache.
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.word_emb, config.vocab_size, config.hidden_size)
        if mems is not None:
            if cache is not None:
                raise ValueError("Pass either the cache or the legacy mems, not both")
            cache = MemoryCache.from_legacy_mems(mems, config.mem_len, config.memory_init, config.model_type)
        backbone = self.forward_segment(
            inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            shared_biases=None if config.untie_r else (self.r_w_bias, self.r_r_bias),
        )
        hidden_states = backbone.last_hidden_state
        return TransfoXLModelOutput(
            last_hidden_state=hidden_states,
            **cache_field(backbone.cache if use_cache else None),
            hidden_states=tuple(backbone.layer_inputs) + (hidden_states,) if output_hidden_states else None,
            attentions=tuple(backbone.attentions) if output_attentions else None,
            span_penalty=backbone.span_penalty,
        )

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

    @property
    def carries_memory(self) -> bool:
        """Whether the cache is a memory carried from one segment to the next (`mem_len` > 0), as training and
        evaluation streams carry it."""
        return self.config.mem_len > 0

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

    # ----------------------------------------------------------------------------------------------------------------
    # the one-step path (`txv_xl_step`): what a model keeps for it, forgotten when it is moved, cast or switches mode
    # (replace a part, e.g. wrap it with PEFT, before either, or call `forget_step_cache`)
    def forget_step_cache(self):
        """Drops whether this model can step (`step_support`), its parameter list and its `StepWeights`."""
        self._step_support = self._step_parameters = self._step_weights = None

    def train(self, mode: bool = True):
        self.forget_step_cache()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):
        self.forget_step_cache()
        return super()._apply(fn, *args, **kwargs)

    def _step_setting(self) -> tuple:
        """The config fields the one-step path depends on (`STEP_SETTING_FIELDS`), read from the config's instance
        dict: reading a `PretrainedConfig` attribute costs 1-2 us, and an acting agent checks these on every call."""
        return tuple(map(vars(self.config).get, STEP_SETTING_FIELDS))

    def step_unsupported(self) -> str:
        """Why `txv_xl_step` cannot step this model as configured now ("" if it can), kept per setting it reads."""
        setting = self._step_setting()
        known = getattr(self, "_step_support", None)
        if known is None or known[0] != setting:
            known = self._step_support = (setting, step_support(self) or "")
        return known[1]

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


class TransfoXLLMHeadModel(TransfoXLPreTrainedModel, GenerationMixin):
    """Transformer-XL with the projected adaptive softmax head (`crit`, tied to the base model's adaptive input
    embedding as transfo-xl ties it; `lm_head` where the config has no adaptive softmax). Memory is kept across
    `generate()` steps, so each new token costs O(mem_len), and a left-padded batch generates the same tokens as each
    row alone; a model without memory (`mem_len=0`) gets the whole sequence at every step instead, since nothing else
    would carry the context. The model is stateful for transformers (`_is_stateful`): a memory trimmed to `mem_len`
    cannot be rolled back, so assisted decoding gets transformers' own clear error instead of failing inside.

    Besides the standard arguments: `mems`, the legacy memory (a list of `[mem_len, batch, hidden]` tensors, see
    `TransfoXLModel`), and `return_logits`: False skips the log-probabilities (with labels, the adaptive softmax then
    only evaluates the clusters of the targets, which is what makes it fast to train)."""

    _is_stateful = True
    head_options = ("return_logits",)  # keyword arguments read by the head, not passed to the base model

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        self.transformer = TransfoXLModel(config)
        if config.uses_adaptive_softmax:
            self.crit = ProjectedAdaptiveLogSoftmax(
                config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val
            )
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        embedding_path = f"{self.base_model_prefix}.{TransfoXLModel._input_embed_layer}"
        if self.config.uses_adaptive_softmax:
            return adaptive_tied_weights_keys(self.config, embedding_path)
        return {"lm_head.weight": f"{embedding_path}.weight"}

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        if self.config.uses_adaptive_softmax:  # the legacy rules decide (`tie_word_embeddings`, `tie_projs`)
            return self._tied_weights_keys
        return super().get_expanded_tied_weights_keys(all_submodels)

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
    ) -> TransfoXLLMHeadModelOutput:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        return_logits (keyword): False leaves the logits out (with labels, the adaptive softmax then evaluates only the
            clusters of the targets and never makes the `[tokens, vocabulary]` log-probabilities).
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        Other keyword arguments (`mems`) go to the base model."""
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
        logits, losses, lm_loss = xl_lm_head(
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
        return TransfoXLLMHeadModelOutput(
            loss=loss,
            logits=logits,
            losses=losses,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            lm_loss=lm_loss,
            span_penalty=outputs.span_penalty,
        )

    @property
    def carries_memory(self) -> bool:
        """Whether the cache is a memory carried from one segment to the next (`mem_len` > 0)."""
        return self.transformer.carries_memory

    def initial_cache(self, batch_size: int, dtype=None, device=None) -> MemoryCache:
        """The memory a first segment starts with (see `config.memory_init`)."""
        return self.transformer.initial_cache(batch_size, dtype, device)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # `generate()` keeps the model's own `MemoryCache`, never a `DynamicCache`

    @accepts_cache_names
    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, cache=None, **kwargs):
        """One new token per step against the memory; the whole sequence at every step without memory."""
        if self.config.mem_len == 0:
            next_sequence_length, cache = None, None
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, **cache_field(cache), **kwargs
        )

    def reset_memory_length(self, mem_len: int):
        """Changes how many positions are remembered (e.g. longer at evaluation, as in the paper)."""
        self.config.mem_len = mem_len


class TransfoXLForSequenceClassification(TransfoXLPreTrainedModel):
    """Transformer-XL with a linear classifier (`score`) on the hidden state of the last real token of each row;
    regression, single- or multi-label as transformers decides (`config.problem_type`). The legacy `mems` are passed
    to `TransfoXLModel`."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = TransfoXLModel(config)
        # (a Transformer-XL config has no `classifier_dropout` field: no dropout unless one is set)
        self.dropout = nn.Dropout(getattr(config, "classifier_dropout", None) or 0.0)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    # Copied from hf_txvariants.modeling_shaw.ShawForSequenceClassification.forward with model->transformer
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
    "TransfoXLPreTrainedModel",
    "TransfoXLModel",
    "TransfoXLLMHeadModel",
    "TransfoXLForSequenceClassification",
    "TransfoXLModelOutput",
    "TransfoXLLMHeadModelOutput",
]
