"""The one Transformer-XL backbone of the XL family (Transformer-XL, Gated Transformer-XL, Adaptive Span).

A forward pass over a segment, whatever the variant:

    memory  = the cache (a `MemoryCache`), or the memory a first segment starts with (`config.memory_init`)
    allowed = causal over [memory; segment], within the attention window, without padding or masked memory slots
    R       = the sinusoid table of relative distances (Dai et al. 2019, section 3.3)
    h^0     = dropout(embeddings);  h^n = layer_n(h^{n-1}, memory_n, R, allowed)     (`XLLayer`)
    memory_n <- the last mem_len of [memory_n; h^{n-1}] (stop-gradient)              (`MemoryCache.update_memories`)

The variants differ only in their configs, defaults, parameter names and heads. Two mechanisms are options of every
XL-family config, so they compose (a gated XL with adaptive span is a config, not a new file):

- the residual form (`gate_type`, `gate_bias`; Parisotto et al. 2020): "trxl" is the plain Transformer-XL block
  (layer norm after the residual, or on the sub-layer input with transfo-xl's `pre_lnorm`); every other type uses
  the identity map reordering, `E' = g(E, ReLU(MHA(LN([SG(M), E]))))`, `out = g(E', ReLU(FF(LN(E'))))`, with g the
  plain residual ("trxl_i") or a gate of `txv_gates`.
- adaptive span (`adapt_span_enabled`, `attn_span`, `adapt_span_*`; Sukhbaatar et al. 2019): each head's soft span
  mask is an additive attention term (`txv_adaptive_span`), the span penalty is returned, and with
  `adapt_span_cache` every layer attends only to the keys its spans can reach.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput

from .txv_adaptive_span import AdaptiveSpan
from .txv_attention import causal_allowed
from .txv_compat import GradientCheckpointingLayer, model_output
from .txv_gates import GatingLayer, build_gate
from .txv_inputs import segment_padding_mask
from .txv_relative_attention import relative_position_embeddings
from .txv_xl_config import attention_window
from .txv_xl_memory import MemoryCache, memory_for_input
from .txv_xl_step import StepWeights, step_support, xl_step


def residual_form(config) -> str:
    """ "post_norm" (x = LN(x + y)), "pre_norm" (x = x + y, y from LN(x); transfo-xl's pre_lnorm) or "reordered"
    (the identity map reordering with a gate, x = g(x, ReLU(y)), y from LN(x))."""
    if config.gate_type == "trxl":
        return "pre_norm" if getattr(config, "pre_lnorm", False) else "post_norm"
    return "reordered"


def build_adaptive_span(config) -> AdaptiveSpan | None:
    if not config.adapt_span_enabled:
        return None
    return AdaptiveSpan(
        config.num_attention_heads,
        config.attn_span,
        config.adapt_span_ramp,
        config.adapt_span_init,
        dynamic=config.adapt_span_dynamic,
        hidden_size=config.hidden_size,
    )


def init_mechanism_weights(module: nn.Module, std: float):
    """`_init_weights` for the mechanisms' own parameters (their Linear weights are the variant's usual init):
    the gates (Xavier-normal W / U matrices and the gate bias b_g), and the spans (static: `adapt_span_init`; dynamic:
    sigmoid(b) = `adapt_span_init`).

    Why Xavier for the gate matrices, not the N(0, initializer_range = 0.02) of every other Linear (issue 30): a gate
    multiplies by them, so with 0.02 the GRU gate's candidate tanh(W_g y + U_g (r * x)) is ~0.02 * sqrt(hidden) of the
    sub-layer's output and z ~ sigma(-b_g) scales it again; at width 64 and b_g = 2 the memory reached a fresh policy
    ~50x more weakly than through TrXL-I's x + y (Xavier: ~7x; benchmarks/bench_gtrxl_init_reach.py). On
    RepeatPreviousMedium (one seed each) Xavier halved the steps PPO took to find the memory at b_g = 0 (94k vs 184k)
    and changed nothing at b_g = 2 (346k vs 344k), where b_g dominates (benchmarks/RESULTS.md). Xavier-normal is what
    RLlib's GTrXL (`GRUGate`) uses; the paper does not state its initialisation."""
    if isinstance(module, GatingLayer):
        # after the generic init of its Linear children (`smart_apply` visits children first), so this one wins
        for name in module.matrices:
            init.xavier_normal_(getattr(module, name).weight)
        if module.has_bias:
            init.constant_(module.gate_bias, module.initial_bias)
    elif isinstance(module, AdaptiveSpan):
        if module.dynamic:
            init.normal_(module.span_predictor.weight, 0.0, std)
            fraction = min(max(module.init, 1e-4), 1 - 1e-4)
            init.constant_(module.span_predictor.bias, float(torch.logit(torch.tensor(fraction))))
        else:
            init.constant_(module.current_val, module.init)


class XLLayer(GradientCheckpointingLayer):
    """One XL layer. A variant's layer builds its sub-modules under the names of its checkpoints, says where they are
    in `part_paths` (role -> dotted name: "attention" (a `RelativePositionAttention`), "attention_norm",
    "feed_forward", "feed_forward_norm", and "adaptive_span" where the span module goes), then calls
    `add_mechanisms(config)`, which adds the gates (`attention_gate`, `feed_forward_gate`) and the span module the
    config asks for. The parts are looked up at call time, so wrapped modules (e.g. PEFT adapters) are used."""

    part_paths: dict[str, str] = {}

    def add_mechanisms(self, config):
        self.residual = residual_form(config)
        if self.residual == "reordered":
            gate_type = "residual" if config.gate_type == "trxl_i" else config.gate_type
            self.attention_gate = build_gate(gate_type, config.hidden_size, config.gate_bias)
            self.feed_forward_gate = build_gate(gate_type, config.hidden_size, config.gate_bias)
        span = build_adaptive_span(config)
        self.has_adaptive_span = span is not None
        if span is not None:
            parent, _, name = self.part_paths["adaptive_span"].rpartition(".")
            (self.get_submodule(parent) if parent else self).add_module(name, span)
        self.span_cache = config.adapt_span_cache

    def part(self, role: str):
        # attribute by attribute (what get_submodule does, without its checks: it runs for every part of every step)
        return operator.attrgetter(self.part_paths[role])(self)

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
        span = self.part("adaptive_span") if self.has_adaptive_span else None
        span_bias = penalty = needed_memory = None
        if span is not None:
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

        attention, attention_norm = self.part("attention"), self.part("attention_norm")
        feed_forward, feed_forward_norm = self.part("feed_forward"), self.part("feed_forward_norm")
        attended, weights = attention(
            hidden_states,
            position_embeddings,
            allowed,
            memory=memory,
            context_norm=None if self.residual == "post_norm" else attention_norm,
            shared_biases=shared_biases,
            output_attentions=output_attentions,
            attention_bias=span_bias,
            key_values=key_values,
            key_window=key_window,
        )
        if self.residual == "post_norm":
            hidden_states = attention_norm(hidden_states + attended)
            hidden_states = feed_forward_norm(hidden_states + feed_forward(hidden_states))
        elif self.residual == "pre_norm":
            hidden_states = hidden_states + attended
            hidden_states = hidden_states + feed_forward(feed_forward_norm(hidden_states))
        else:
            hidden_states = self.attention_gate(hidden_states, torch.relu(attended))
            transformed = feed_forward(feed_forward_norm(hidden_states))
            hidden_states = self.feed_forward_gate(hidden_states, torch.relu(transformed))
        return hidden_states, weights, penalty, (key_length, needed_memory)


def keep_last_memory(memory, position_embeddings, allowed, memory_length: int, query_length: int):
    """Cuts the memory to its last `memory_length` slots, and the position table and the key mask with it (the
    table's rows run from the farthest distance down, with possibly one extra row for distance -1)."""
    full_memory = 0 if memory is None else memory.shape[1]
    extra_rows = position_embeddings.shape[0] - (full_memory + query_length)
    memory_length = min(full_memory, memory_length)
    key_length = memory_length + query_length
    memory = memory[:, full_memory - memory_length :] if memory_length > 0 else None
    position_embeddings = position_embeddings[position_embeddings.shape[0] - key_length - extra_rows :]
    return memory, position_embeddings, allowed[..., allowed.shape[-1] - key_length :]


@model_output
class XLModelOutput(ModelOutput):
    """The base model's output. span_penalty: with adaptive span, the sum over layers of the mean span (tokens)."""

    last_hidden_state: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@model_output
class XLCausalLMOutput(ModelOutput):
    """The causal LM's output: loss = lm_loss + adapt_span_loss * span_penalty (just lm_loss without adaptive span)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class XLSpanMethodsMixin:
    """For every XL-family PreTrainedModel: the adaptive-span helpers (no-ops without adaptive span)."""

    def clamp_spans_(self):
        """Clamps every learned span into [0, attn_span]; call after each optimiser step (original `clamp_param`)."""
        for module in self.modules():
            if isinstance(module, AdaptiveSpan):
                module.clamp_()

    def get_spans(self) -> torch.Tensor | None:
        """`[layers, heads]` the current static spans in tokens (None for dynamic spans or without adaptive span)."""
        spans = [m.spans().detach() for m in self.modules() if isinstance(m, AdaptiveSpan) and not m.dynamic]
        return torch.stack(spans) if spans else None


@dataclass
class XLBackboneOutput:
    """What `XLBackboneMixin.forward_segment` returns to the variant's model: the last hidden state (after dropout),
    the memory (updated when `use_cache`), the inputs of every layer, the attention weights, the summed span
    penalty (None without adaptive span) and the key count each layer attended."""

    last_hidden_state: torch.Tensor
    cache: MemoryCache
    layer_inputs: list
    attentions: list
    span_penalty: torch.Tensor | None
    attended_keys: tuple


def build_final_norm(config) -> nn.LayerNorm | None:
    """The layer norm on the last hidden state (`config.final_layer_norm`), as GPT-2's `ln_f`. A stack with the
    identity map reordering never normalises its residual stream: without it, a tied LM head reads vectors of the
    embeddings' scale (std ~ initializer_range) through gates that start near the identity, and learns very slowly."""
    if not config.final_layer_norm:
        return None
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


# the config fields that decide whether and how `txv_xl_step` steps a model (`attention_window`, `step_support`)
STEP_SETTING_FIELDS = ("mem_len", "same_length", "same_length_extra_key", "attn_span", "adapt_span_enabled")
_VERSION = operator.attrgetter("_version")  # a tensor's in-place version counter


class XLBackboneMixin:
    """For the base model of an XL-family variant, which has `config`, `layers` (`XLLayer`s), `drop` and `norm`
    (`build_final_norm`)."""

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

    def step_weights(self):
        """This model's `txv_xl_step.StepWeights`, made again whenever a parameter changed (an optimiser step or a
        load writes in place, which moves its version) or a field of `STEP_SETTING_FIELDS` did."""
        if getattr(self, "_step_parameters", None) is None:
            self._step_parameters = list(self.parameters())
        token = (self._step_setting(), *map(_VERSION, self._step_parameters))
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

    def memory_for_input(self, memory, batch_size: int, dtype, device) -> MemoryCache:
        config = self.config
        return memory_for_input(
            memory,
            lambda: self.initial_cache(batch_size, dtype, device),
            batch_size=batch_size,
            hidden_size=config.hidden_size,
            num_layers=len(self.layers),
            model_type=config.model_type,
        )

    def allowed_keys(self, cache: MemoryCache, query_length: int, input_mask, device, window: int | None):
        """`[batch or 1, 1, Q, M + Q]` bool: causal over `[memory; segment]`, inside the window (`attention_window`),
        without padding."""
        key_mask = cache.key_mask(input_mask, query_length)
        memory_length = cache.memory_length
        if query_length == 1 and (window is None or window > memory_length) and key_mask is not None:
            return key_mask[:, None, None, :]  # one query sees every key of [memory; itself]: the key mask only
        allowed = causal_allowed(query_length, memory_length, device, window)[None, None]
        return allowed if key_mask is None else allowed & key_mask[:, None, None, :]

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
        one when None), which `use_cache` updates in place (see the module's docstring). A call of one position per
        row that keeps the cache and wants no attention weights goes through the one-position step where it can
        (`forward_step`), which computes the same within float rounding."""
        config = self.config
        batch, query_length = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        cache = self.memory_for_input(cache, batch, inputs_embeds.dtype, device)
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
        allowed = self.allowed_keys(cache, query_length, input_mask, device, window)
        restarted = in_episode = None
        if episode_starts is not None:
            allowed, restarted, in_episode = restrict_to_episodes(allowed, episode_starts, batch, memory_length)

        # In evaluation the memory's keys and values are reused (exact: same weights, same memory vectors), and so are
        # the relative position table and its projections; a pass that records gradients or trains drops them, since
        # the weights change and the gradient must reach W_k, W_v, W_r
        clamp_len, hidden_size = getattr(config, "clamp_len", 0), config.hidden_size

        def position_table(key_length: int) -> torch.Tensor:
            return relative_position_embeddings(key_length, hidden_size, clamp_len, inputs_embeds.dtype, device)

        key_value_slots = [None] * len(self.layers)
        if not self.training and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
            key_value_slots = cache.key_value_slots()
            table_key = (clamp_len, hidden_size, inputs_embeds.dtype, device)
            position_embeddings = cache.relative_table(memory_length + query_length, position_table, table_key)
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


def is_all_real(input_mask: torch.Tensor | None) -> bool:
    """Whether a `segment_padding_mask` marks every position real (None: no mask, all real; `generate()` passes a
    mask of ones)."""
    return input_mask is None or bool(input_mask.all())


def leading_padding_as_zero_memory(input_mask: torch.Tensor, memory_length: int):
    """Left padding made exact under `memory_init="zeros"`: a row alone starts with `mem_len` zero vectors right
    before its first token. A left-padded row gets exactly that: its leading padding positions are zero vectors (at
    every layer's input), and of the zeros [initial memory; leading padding] it attends to the last `memory_length`
    only, so every key it sees sits at the same relative distance as when the row is alone.

    Returns `leading [B, Q]` (the leading padding), `zero_slots [B, Q]` (the padding positions attended as zeros) and
    the `[B, M]` mask of the initial memory slots still attended."""
    leading = input_mask.cumsum(dim=1) == 0
    pads = leading.sum(dim=1, keepdim=True)
    positions = torch.arange(input_mask.shape[1], device=input_mask.device)
    # index in the zero sequence [memory (M); padding (P)]: memory slot k is k, padding j is M + j; keep those >= P
    zero_slots = leading & (positions + memory_length >= pads)
    memory_mask = torch.arange(memory_length, device=input_mask.device) >= pads
    return leading, zero_slots, memory_mask


def restrict_to_episodes(allowed: torch.Tensor, episode_starts: torch.Tensor, batch: int, memory_length: int):
    """Each step attends to nothing before the latest episode start at or before it (neither memory nor earlier
    steps). Returns the narrowed mask, `restarted [batch]` (the rows with a start in the segment, whose memory is
    forgotten) and `in_episode [batch, Q]`, the steps at or after the row's last start (None: all of them)."""
    query_length = allowed.shape[-2]
    if episode_starts.shape != (batch, query_length):
        raise ValueError(
            f"episode_starts must be [batch, length] = {(batch, query_length)}, got shape {tuple(episode_starts.shape)}"
        )
    device = allowed.device
    starts = episode_starts.to(device=device, dtype=torch.bool)
    if query_length == 1:  # a starting step sees itself only: its row's memory keys are masked
        memory_keys = (~starts).expand(batch, memory_length)
        keys = torch.cat([memory_keys, starts.new_ones(batch, allowed.shape[-1] - memory_length)], dim=1)
        return allowed & keys[:, None, None, :], starts[:, 0], None
    steps = torch.arange(query_length, device=device)
    last_start = torch.where(starts, steps, -1).cummax(dim=1).values
    first_key = torch.where(last_start >= 0, last_start + memory_length, 0)  # in [memory; segment] coordinates
    keys = torch.arange(allowed.shape[-1], device=device)
    in_episode = steps >= last_start[:, -1:]
    return allowed & (keys >= first_key[:, :, None])[:, None], last_start[:, -1] >= 0, in_episode


__all__ = [
    "XLBackboneMixin",
    "XLBackboneOutput",
    "XLCausalLMOutput",
    "XLModelOutput",
    "XLLayer",
    "XLSpanMethodsMixin",
    "build_adaptive_span",
    "build_final_norm",
    "init_mechanism_weights",
    "keep_last_memory",
    "leading_padding_as_zero_memory",
    "residual_form",
    "restrict_to_episodes",
]
