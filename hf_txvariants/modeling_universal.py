"""Universal Transformer (Dehghani et al. 2019, "Universal Transformers").

One shared layer (self-attention, optional cross-attention, transition) is applied recurrently over depth. Before
every step t the coordinate embedding is added to the state of position i:

    x_i^t = h_i^{t-1} + P_i + T_t        P, T: sinusoids of the position i and of the step t (t = 1..T)

`layer_norm_position="pre"` (the default) runs h^t = x + SubLayer(LN(x)) per sub-layer and a final layer norm;
`"post"` is the paper's A^t = LN(x^t + MHA(x^t)), h^t = LN(A^t + Transition(A^t)). The transition is a position-wise
feed-forward network or the paper's depthwise-separable convolution (`transition="separable_conv"`).

With `use_act` each position halts with Adaptive Computation Time (txv_act.py): a position that has halted is copied,
not updated, while the others go on, and the mean ponder cost N + R is added to the loss with `act_loss_weight`.
Without ACT the model runs `num_hidden_layers` steps, which is exactly a stack of that many weight-tied layers.

Generation reuses the past: `UniversalStepCache` keeps, for every step, the step inputs x^t of the positions already
processed (a position that halted keeps its final state, so its later step inputs are recomputed from it), and each
new token attends to them, which gives exactly the outputs of a pass over the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.modeling_outputs import MaskedLMOutput, SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .configuration_universal import UniversalTransformerConfig
from .txv_act import ACTCausalLMOutput, ACTModelOutput, AdaptiveComputationTime, add_ponder_cost, init_halting_unit
from .txv_cache import RowStateCache
from .txv_compat import CACHE_NAME, GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_feedforward import PositionwiseFeedForward
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head, check_labels, masked_lm_loss
from .txv_mha import MultiHeadAttention, cross_attention_mask, self_attention_mask
from .txv_positions import sinusoid_table
from .txv_pretrained import TxvPreTrainedModel
from .txv_sequence_classification import sequence_classification_loss

# ---------------------------------------------------------------------------------------------------------- outputs


@dataclass
class UniversalTransformerModelOutput(ACTModelOutput):
    """ponder_cost: `[batch, length]` rho = N + R of every position (0 at padding; None without ACT); the loss adds
    its mean over the real positions. n_updates: `[batch, length]` the number of steps each position took.
    cache: the `UniversalStepCache`. hidden_states: the state before the first step and after every step."""

    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class UniversalTransformerCausalLMOutput(ACTCausalLMOutput):
    """loss = lm_loss + act_loss_weight * (mean of ponder_cost over the real positions); cache: the
    `UniversalStepCache`."""

    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class UniversalTransformerMaskedLMOutput(MaskedLMOutput):
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None


# Copied from hf_txvariants.modeling_act_rnn.ACTRNNSequenceClassifierOutput with ACTRNN->UniversalTransformer
@dataclass
class UniversalTransformerSequenceClassifierOutput(SequenceClassifierOutput):
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None


# ------------------------------------------------------------------------------------------------------------ cache


class UniversalStepCache(RowStateCache):
    """The past of a causal Universal Transformer, carried as `cache`.

    `step_inputs[t]` is `[batch, past, hidden]`: the input x^t of step t of every cached position. Every cached
    position has halted after the steps stored (the loop of its call ran until all had halted); for a later step t it
    is a frozen copy, x^t = final + P + T_t, recomputed from `final` (its output before the final layer norm) and
    `positions` (P). `key_mask` marks the cached positions that may be attended to (not padding). A position's entries
    depend only on the positions before it, so `crop` (assisted decoding) just drops the last positions."""

    def __init__(self):
        super().__init__()
        self.step_inputs: list[torch.Tensor] = []
        self.final: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.key_mask: torch.Tensor | None = None

    @property
    def past_length(self) -> int:
        return 0 if self.final is None else self.final.shape[1]

    def step_input(self, step: int, time_embedding: torch.Tensor) -> torch.Tensor:
        if step < len(self.step_inputs):
            return self.step_inputs[step]
        return self.final + self.positions + time_embedding

    def append(self, step_inputs, final, positions, key_mask, time_embedding_fn):
        """Adds the new positions: their step inputs of the steps run, their final state, P and padding mask."""
        if self.final is None:
            self.step_inputs = [x.detach() for x in step_inputs]
            self.final, self.positions, self.key_mask = final.detach(), positions.detach(), key_mask
            return
        merged = []
        for step in range(max(len(self.step_inputs), len(step_inputs))):
            time = time_embedding_fn(step)
            old = self.step_input(step, time)
            new = step_inputs[step] if step < len(step_inputs) else final + positions + time
            merged.append(torch.cat([old, new.detach()], dim=1))
        self.step_inputs = merged
        self.final = torch.cat([self.final, final.detach()], dim=1)
        self.positions = torch.cat([self.positions, positions.detach()], dim=1)
        self.key_mask = torch.cat([self.key_mask, key_mask], dim=1)

    def __len__(self):
        return len(self.step_inputs)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.past_length

    def crop(self, tokens_to_remove: int):
        """Drops the last `-tokens_to_remove` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove < 0:
            self._map_rows(lambda tensor: tensor[:, :tokens_to_remove])

    def reset(self):
        self.step_inputs, self.final, self.positions, self.key_mask = [], None, None, None

    STATE_FIELDS = ("step_inputs", "final", "positions", "key_mask")

    def to_state(self) -> dict:
        """`step_inputs` (a list, one `[batch, past, hidden]` per step), `final`, `positions` and `key_mask` (None
        while empty)."""
        return {
            "step_inputs": list(self.step_inputs),
            "final": self.final,
            "positions": self.positions,
            "key_mask": self.key_mask,
        }

    @classmethod
    def from_state(cls, state: dict) -> UniversalStepCache:
        step_inputs, final, positions, key_mask = cls._state_fields(state, *cls.STATE_FIELDS)
        cache = cls()
        cache.step_inputs, cache.final, cache.positions, cache.key_mask = list(step_inputs), final, positions, key_mask
        return cache

    def _row_tensors(self) -> dict:
        if self.final is None:
            return {}
        return {
            "step_inputs": self.step_inputs,
            "final": self.final,
            "positions": self.positions,
            "key_mask": self.key_mask,
        }

    @property
    def is_croppable(self) -> bool:
        return True


# -------------------------------------------------------------------------------------------------------- attention


class UniversalTransformerSelfAttention(MultiHeadAttention):
    """The shared multi-head attention. With a step cache, keys and values come from `key_value_states`: the step
    inputs of the cached positions followed by the new ones (recomputed with the current weights, like
    Transformer-XL's memory); without, from `hidden_states`. Its parameters and `attend` are `MultiHeadAttention`'s."""

    def forward(self, hidden_states, attention_mask, key_value_states=None, output_attentions=False):
        """`attention_mask`: additive, broadcastable to `[batch, heads, length, keys]`, or None. Returns the output
        and, with `output_attentions`, the weights."""
        batch, query_length = hidden_states.shape[:2]
        source = hidden_states if key_value_states is None else key_value_states
        query = self._heads(self.q_proj(hidden_states))
        key, value = self._heads(self.k_proj(source)), self._heads(self.v_proj(source))
        output, weights = self.attend(query, key, value, attention_mask, output_attentions)
        output = self.o_proj(output.reshape(batch, query_length, -1))
        return output, (weights if output_attentions else None)


# ------------------------------------------------------------------------------------------------------- transition


def zero_padding(hidden_states: torch.Tensor, position_mask: torch.Tensor | None) -> torch.Tensor:
    """Padding positions set to 0 before a convolution reads them (tensor2tensor's `maybe_zero_out_padding`)."""
    if position_mask is None:
        return hidden_states
    return hidden_states * position_mask.unsqueeze(-1).to(hidden_states.dtype)


class DepthwiseSeparableConv1d(nn.Module):
    """A depthwise convolution (one kernel of `kernel_size` positions per channel, no bias) followed by a pointwise
    linear map (Chollet 2017): y_i = W_p (sum_m w_m * x_{i - offset + m}) + b_p, elementwise in the channels.

    Causal: offset = kernel_size - 1 (a position reads itself and the ones before it); otherwise "SAME" padding,
    offset = (kernel_size - 1) // 2. Positions outside the sequence read zeros."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.depthwise = nn.Conv1d(in_channels, in_channels, kernel_size, groups=in_channels, bias=False)
        self.pointwise = nn.Linear(in_channels, out_channels)

    def forward(self, hidden_states: torch.Tensor, causal: bool) -> torch.Tensor:
        before = self.kernel_size - 1 if causal else (self.kernel_size - 1) // 2
        after = self.kernel_size - 1 - before
        channels_first = nn.functional.pad(hidden_states.transpose(1, 2), (before, after))
        return self.pointwise(self.depthwise(channels_first).transpose(1, 2))


class SeparableConvTransition(nn.Module):
    """The paper's separable-convolution transition, as tensor2tensor's `sepconv_relu_sepconv`:
    SepConv_{k2}(dropout(ReLU(SepConv_{k1}(x)))), `hidden_size -> intermediate_size -> hidden_size`."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__()
        first_kernel, second_kernel = config.separable_conv_kernel_sizes
        self.first = DepthwiseSeparableConv1d(config.hidden_size, config.intermediate_size, first_kernel)
        self.second = DepthwiseSeparableConv1d(config.intermediate_size, config.hidden_size, second_kernel)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, hidden_states, position_mask=None, causal=False):
        inner = torch.relu(self.first(zero_padding(hidden_states, position_mask), causal))
        inner = zero_padding(self.drop(inner), position_mask)
        return self.drop(self.second(inner, causal))


class PositionwiseTransition(PositionwiseFeedForward):
    """The position-wise feed-forward transition (`CoreNet`, as before); ignores the padding mask and causality."""

    def forward(self, hidden_states, position_mask=None, causal=False):
        return super().forward(hidden_states)


# ------------------------------------------------------------------------------------------------------------ layer


class UniversalTransformerLayer(GradientCheckpointingLayer):
    """The shared recurrent block: self-attention, [cross-attention over the encoder,] transition, each sub-layer
    with a residual connection and a layer norm, before it (`"pre"`: x + f(LN(x))) or after it (`"post"`:
    LN(x + f(x)), the paper)."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__()
        self.post_layer_norm = config.layer_norm_position == "post"
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = UniversalTransformerSelfAttention(config, layer_idx=0)
        self.has_cross_attention = config.add_cross_attention
        if self.has_cross_attention:
            self.cross_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            self.cross_attn = MultiHeadAttention(config, layer_idx=0, is_cross_attention=True)
        self.transition_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if config.transition == "separable_conv":
            self.transition = SeparableConvTransition(config)
        else:
            self.transition = PositionwiseTransition(config.hidden_size, config.intermediate_size, config.dropout)
        self.drop = nn.Dropout(config.dropout)

    def _residual(self, hidden_states, layer_norm, sublayer):
        if self.post_layer_norm:
            return layer_norm(hidden_states + sublayer(hidden_states))
        return hidden_states + sublayer(layer_norm(hidden_states))

    def forward(
        self,
        hidden_states,
        self_attention_mask,
        encoder_hidden_states=None,
        cross_attention_mask=None,
        output_attentions=False,
        self_context=None,
        position_mask=None,
        causal=False,
    ):
        """self_context: `[batch, past + length, hidden]` the step inputs of the cached positions followed by
        `hidden_states` (incremental decoding); the self-attention reads its keys and values from it.
        position_mask: `[batch, length]` True for real positions (the convolution transition zeroes the others)."""
        if self_context is not None and not self.post_layer_norm:
            self_context = self.self_attn_layer_norm(self_context)
        weights = {}

        def self_attention(states):
            attended, weights["self"] = self.self_attn(
                states, self_attention_mask, key_value_states=self_context, output_attentions=output_attentions
            )
            return self.drop(attended)

        def cross_attention(states):
            attended, weights["cross"] = self.cross_attn(
                states,
                cross_attention_mask,
                key_value_states=encoder_hidden_states,
                output_attentions=output_attentions,
            )
            return self.drop(attended)

        hidden_states = self._residual(hidden_states, self.self_attn_layer_norm, self_attention)
        if self.has_cross_attention and encoder_hidden_states is not None:
            hidden_states = self._residual(hidden_states, self.cross_attn_layer_norm, cross_attention)
        transition = partial(self.transition, position_mask=position_mask, causal=causal)
        hidden_states = self._residual(hidden_states, self.transition_layer_norm, transition)
        return hidden_states, weights.get("self"), weights.get("cross")


# ------------------------------------------------------------------------------------------------------------ model


class UniversalTransformerPreTrainedModel(TxvPreTrainedModel):
    config_class = UniversalTransformerConfig
    _no_split_modules = ["UniversalTransformerLayer"]
    _supports_sdpa = True
    auto_classes = {
        "AutoModel": "UniversalTransformerModel",
        "AutoModelForCausalLM": "UniversalTransformerForCausalLM",
        "AutoModelForMaskedLM": "UniversalTransformerForMaskedLM",
        "AutoModelForSequenceClassification": "UniversalTransformerForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")

    def _init_weights(self, module):
        std = self.config.initializer_range
        if init_halting_unit(module, std):
            return
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, 0.0, std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


@dataclass
class _StepInputs:
    """What every step of one forward pass reads (the same at every step), and what it records."""

    positions: torch.Tensor  # [batch, length, hidden]: P
    self_attention_mask: torch.Tensor | None
    encoder_hidden_states: torch.Tensor | None
    cross_attention_mask: torch.Tensor | None
    position_mask: torch.Tensor | None
    causal: bool
    cache: UniversalStepCache | None
    output_attentions: bool
    attentions: list = field(default_factory=list)
    cross_attentions: list = field(default_factory=list)
    step_inputs: list = field(default_factory=list)


def _config_default(value, config, name):
    return getattr(config, name) if value is None else value


class UniversalTransformerModel(UniversalTransformerPreTrainedModel):
    """The embeddings, the shared layer run over depth (fixed steps or ACT) and, pre-LN, a final layer norm.

    Self-attention is causal when `config.is_decoder` (or when `is_causal=True` is passed, as the LM head does)."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_scale = config.hidden_size**0.5 if config.scale_embedding else 1.0
        self.layer = UniversalTransformerLayer(config)
        if config.use_act:
            self.act = AdaptiveComputationTime(
                config.hidden_size, config.num_hidden_layers, config.act_threshold, config.halting_bias_init
            )
        # post-LN: the last step's output is already normalised (H^T = LN(A^T + Transition(A^T)))
        pre = config.layer_norm_position == "pre"
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if pre else nn.Identity()
        self.drop = nn.Dropout(config.dropout)
        self.gradient_checkpointing = False
        self.post_init()

    @property
    def keeps_step_cache(self) -> bool:
        """False with the convolution transition: it mixes neighbouring positions, which the step cache (the step
        inputs of the past positions) cannot serve."""
        return self.config.transition == "feed_forward"

    def initial_cache(self, batch_size: int | None = None, dtype=None, device=None) -> UniversalStepCache:
        """The cache a first call starts with: an empty `UniversalStepCache` (rows, dtype and device come with the
        first positions it keeps)."""
        return UniversalStepCache()

    def time_embedding(self, step: int, device, dtype) -> torch.Tensor:
        """T_t, `[1, hidden]`, for t = step + 1."""
        return sinusoid_table(torch.tensor([step + 1.0], device=device), self.config.hidden_size).to(dtype)

    def coordinate_embedding(self, position_ids: torch.Tensor, step: int, dtype) -> torch.Tensor:
        """P_i + T_t for every position (`[batch, length, hidden]`); t = step + 1."""
        batch, length = position_ids.shape
        positions = sinusoid_table(position_ids.reshape(-1), self.config.hidden_size).view(batch, length, -1)
        return positions.to(dtype) + self.time_embedding(step, position_ids.device, dtype)

    def _step_cache(self, cache, use_cache: bool, causal: bool, batch: int) -> UniversalStepCache | None:
        """The cache this pass reads and extends (None when it keeps none)."""
        if cache is not None and not isinstance(cache, UniversalStepCache):
            raise ValueError(
                f"cache must be the UniversalStepCache returned by this model, got "
                f"{type(cache).__name__} (with EncoderDecoderModel.generate pass use_cache=False)"
            )
        wants_cache = cache is not None or use_cache
        if wants_cache and not self.keeps_step_cache:
            raise ValueError(
                "config.transition='separable_conv' keeps no UniversalStepCache (the convolution mixes positions): "
                "pass use_cache=False and no cache"
            )
        if cache is not None:
            if not causal and cache.past_length:
                raise ValueError("cache (a UniversalStepCache) needs causal self-attention")
            cache.check_batch(batch)
            return cache
        return self.initial_cache(batch) if use_cache and causal else None

    @staticmethod
    def _new_positions(attention_mask, batch: int, length: int, past: int, device) -> torch.Tensor | None:
        """`[batch, length]` bool, True for the real new tokens (None when there is no mask)."""
        if attention_mask is None:
            return None
        if (
            attention_mask.dim() != 2
            or attention_mask.shape[0] != batch
            or attention_mask.shape[1]
            not in (
                length,
                past + length,
            )
        ):
            raise ValueError(
                f"attention_mask must be [batch={batch}, length={length}] or [batch, past + length={past + length}]"
                f" (1 = token, 0 = padding), got shape {tuple(attention_mask.shape)}"
            )
        return attention_mask[:, -length:].to(device=device, dtype=torch.bool)

    def _cross_attention_mask(self, encoder_hidden_states, encoder_attention_mask, batch: int, dtype, device):
        if encoder_hidden_states is None:
            return None
        if not self.config.add_cross_attention:
            raise ValueError("encoder_hidden_states were given but config.add_cross_attention is False")
        if encoder_hidden_states.dim() != 3 or encoder_hidden_states.shape[0] != batch:
            raise ValueError(
                f"encoder_hidden_states must be [batch={batch}, source_length, {self.config.hidden_size}], "
                f"got shape {tuple(encoder_hidden_states.shape)}"
            )
        source_length = encoder_hidden_states.shape[1]
        return cross_attention_mask(encoder_attention_mask, batch, source_length, dtype, device)

    def _step(self, inputs: _StepInputs, state: torch.Tensor, step: int):
        """One application of the shared layer: x^t = h^{t-1} + P + T_t, then Layer(x^t). Returns (x^t, h^t)."""
        time = self.time_embedding(step, state.device, state.dtype)
        step_input = state + inputs.positions + time
        dropped = self.drop(step_input)
        context = None
        if inputs.cache is not None and inputs.cache.past_length:
            context = torch.cat([inputs.cache.step_input(step, time), dropped], dim=1)
        step_output, self_weights, cross_weights = self.layer(
            dropped,
            inputs.self_attention_mask,
            inputs.encoder_hidden_states,
            inputs.cross_attention_mask,
            output_attentions=inputs.output_attentions,
            self_context=context,
            position_mask=inputs.position_mask,
            causal=inputs.causal,
        )
        inputs.attentions.append(self_weights)
        inputs.cross_attentions.append(cross_weights)
        if inputs.cache is not None:
            inputs.step_inputs.append(step_input)
        return step_input, step_output

    def _run_steps(self, inputs: _StepInputs, state, output_hidden_states):
        """The recurrence over depth. Returns (h^T, ponder_cost or None, n_updates, states or None)."""
        batch, length = state.shape[:2]
        if self.config.use_act:
            ponder = self.act.start(state, inputs.position_mask, return_step_states=output_hidden_states)
            for step in range(self.act.max_steps):
                ponder.update(*self._step(inputs, ponder.state, step))
                if ponder.halted:
                    break
            result = ponder.result()
            states = (state, *result.step_states) if output_hidden_states else None
            return result.output, result.ponder_cost, result.n_updates, states
        states = [state]
        for step in range(self.config.num_hidden_layers):
            _, state = self._step(inputs, state, step)
            states.append(state)
        n_updates = torch.full((batch, length), float(self.config.num_hidden_layers), device=state.device)
        return state, None, n_updates, tuple(states) if output_hidden_states else None

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        inputs_embeds: torch.FloatTensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        is_causal: bool | None = None,
        **kwargs,
    ) -> UniversalTransformerModelOutput:
        """
        attention_mask: `[batch, length]`, 1 for real tokens and 0 for padding (left or right). Positions count the
            real tokens only, so a left-padded row gives the outputs of the row alone.
        encoder_hidden_states / encoder_attention_mask: the encoder output and its padding mask, for the
            cross-attention (`config.add_cross_attention`).
        cache: the `UniversalStepCache` of the previous call (causal only); use_cache: return one
            (default `config.use_cache`; `generate()` turns it on). attention_mask may then cover past + new tokens.
        """
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        causal = _config_default(is_causal, config, "is_decoder")
        use_cache = _config_default(use_cache, config, "use_cache") and causal
        state = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        batch, length = state.shape[:2]
        device, dtype = state.device, state.dtype
        cache = self._step_cache(cache, use_cache, causal, batch)
        past = cache.past_length if cache is not None else 0

        real = self._new_positions(attention_mask, batch, length, past, device)
        new_real = real if real is not None else torch.ones(batch, length, dtype=torch.bool, device=device)
        # positions count real tokens only (a left-padded row equals the row alone)
        offset = (
            cache.key_mask.sum(-1, keepdim=True) if past else torch.zeros(batch, 1, dtype=torch.long, device=device)
        )
        position_ids = (offset + new_real.long().cumsum(-1) - 1).clamp(min=0)
        key_mask = torch.cat([cache.key_mask, new_real], dim=1) if past else real
        inputs = _StepInputs(
            positions=sinusoid_table(position_ids.reshape(-1), config.hidden_size).view(batch, length, -1).to(dtype),
            self_attention_mask=self_attention_mask(key_mask, batch, length, past, causal, dtype, device),
            encoder_hidden_states=encoder_hidden_states,
            cross_attention_mask=self._cross_attention_mask(
                encoder_hidden_states, encoder_attention_mask, batch, dtype, device
            ),
            position_mask=real,
            causal=causal,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states, ponder_cost, n_updates, states = self._run_steps(
            inputs, state * self.embed_scale, output_hidden_states
        )
        if cache is not None:
            time_fn = partial(self.time_embedding, device=device, dtype=dtype)
            cache.append(inputs.step_inputs, hidden_states, inputs.positions, new_real, time_fn)
        return UniversalTransformerModelOutput(
            last_hidden_state=self.final_layer_norm(hidden_states),
            **cache_field(cache),
            ponder_cost=ponder_cost,
            n_updates=n_updates,
            hidden_states=states,
            attentions=tuple(inputs.attentions) if output_attentions else None,
            cross_attentions=(
                tuple(inputs.cross_attentions) if output_attentions and encoder_hidden_states is not None else None
            ),
        )


# ------------------------------------------------------------------------------------------------------------ heads
# With ACT every head adds the mean ponder cost to its loss (`act_loss_weight`, `txv_act.add_ponder_cost`). The
# heads ask their base model for the attention they want (`is_causal`), whatever `config.is_decoder` says.


class UniversalTransformerForCausalLM(UniversalTransformerPreTrainedModel, GenerationMixin):
    """The causal (decoder) Universal Transformer with a language-model head tied to the input embeddings.

    As the decoder of an `EncoderDecoderModel` it reads `encoder_hidden_states` through its cross-attention."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.model = UniversalTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        # generate() keeps the step cache (config.use_cache stays False for training) unless told use_cache=False
        if self.generation_config is not None:
            self.generation_config.use_cache = self.model.keeps_step_cache

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own UniversalStepCache; generate() must not swap it for a DynamicCache

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """A fresh `UniversalStepCache` before the first step, so that assisted decoding finds a cache to crop."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if generation_config.use_cache and self.model.keeps_step_cache and model_kwargs.get(CACHE_NAME) is None:
            model_kwargs[CACHE_NAME] = self.model.initial_cache()

    @accepts_cache_names
    def prepare_inputs_for_generation(
        self, input_ids, next_sequence_length=None, cache=None, inputs_embeds=None, **kwargs
    ):
        """transformers' own preparation (new tokens only, `inputs_embeds` on the first step, every output flag
        passed on); without a step cache (the convolution transition) the whole sequence at every step."""
        if not self.model.keeps_step_cache:
            next_sequence_length, cache = None, None
            kwargs["use_cache"] = False
        return super().prepare_inputs_for_generation(
            input_ids,
            next_sequence_length=next_sequence_length,
            **cache_field(cache),
            inputs_embeds=inputs_embeds,
            **kwargs,
        )

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: UniversalStepCache | None = None,
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
    ) -> UniversalTransformerCausalLMOutput:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        encoder_hidden_states / encoder_attention_mask: the encoder output read by cross-attention (as the decoder of an
            `EncoderDecoderModel`; needs `config.add_cross_attention`).
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        loss = lm_loss (the next-token loss) + act_loss_weight * the mean ponder cost of the real positions (with
        ACT). Other keyword arguments go to the base model."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None and not self.config.add_cross_attention:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            is_causal=True,
            return_dict=True,
            **kwargs,
        )
        logits, lm_loss = causal_lm_head(
            self.lm_head,
            outputs.last_hidden_state,
            self.config.vocab_size,
            labels,
            logits_to_keep,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )
        loss = add_ponder_cost(lm_loss, outputs.ponder_cost, self.config.act_loss_weight, attention_mask)
        return UniversalTransformerCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )


class UniversalTransformerForMaskedLM(UniversalTransformerPreTrainedModel):
    """The bidirectional (encoder) Universal Transformer with a masked-LM head tied to the input embeddings (its
    self-attention is bidirectional whatever `config.is_decoder`)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.model = UniversalTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

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
    ) -> UniversalTransformerMaskedLMOutput:
        """labels: `[batch, length]` token ids at the masked positions and -100 elsewhere (not shifted). With ACT the
        loss adds act_loss_weight * the mean ponder cost of the real positions."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            is_causal=False,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            check_labels(labels, logits.shape[:2], self.config.vocab_size)
            loss = masked_lm_loss(logits, labels, num_items_in_batch)
            loss = add_ponder_cost(loss, outputs.ponder_cost, self.config.act_loss_weight, attention_mask)
        return UniversalTransformerMaskedLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
        )


class UniversalTransformerForSequenceClassification(UniversalTransformerPreTrainedModel):
    """The bidirectional Universal Transformer with a linear classifier on the mean of the real positions."""

    # Copied from hf_txvariants.modeling_act_rnn.ACTRNNForSequenceClassification.__init__ with
    #     ACTRNNConfig->UniversalTransformerConfig, ACTRNNModel->UniversalTransformerModel
    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = UniversalTransformerModel(config)
        classifier_dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(classifier_dropout if classifier_dropout is not None else 0.0)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

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
    ) -> UniversalTransformerSequenceClassifierOutput:
        """labels: `[batch]` class ids (float `[batch, num_labels]` for multi-label, `[batch]` floats for
        regression). The classifier keeps no cache: `cache` and `use_cache` are accepted and not used. With ACT the
        loss adds act_loss_weight * the mean ponder cost of the real positions."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=None,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            is_causal=False,
            return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if attention_mask is None:
            pooled = hidden_states.mean(dim=1)
        else:  # the mean of the real positions
            weights = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
            pooled = (hidden_states * weights).sum(1) / weights.sum(1).clamp(min=1)
        logits = self.score(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(self.config, logits, labels)
            loss = add_ponder_cost(loss, outputs.ponder_cost, self.config.act_loss_weight, attention_mask)
        return UniversalTransformerSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
        )


__all__ = [
    "UniversalTransformerPreTrainedModel",
    "UniversalTransformerModel",
    "UniversalTransformerForCausalLM",
    "UniversalTransformerForMaskedLM",
    "UniversalTransformerForSequenceClassification",
    "UniversalTransformerModelOutput",
    "UniversalTransformerCausalLMOutput",
    "UniversalStepCache",
]
