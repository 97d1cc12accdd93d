"""Universal Transformer (Dehghani et al. 2019, "Universal Transformers").

One shared layer (self-attention, optional cross-attention, position-wise transition; pre-layer-norm) is applied
recurrently over depth. Before every step t the coordinate embedding is added to the state of position i:

    x_i^t = h_i^{t-1} + P_i + T_t        P, T: sinusoids of the position i and of the step t (t = 1..T)

With `use_act` each position halts with Adaptive Computation Time (txv_act.py): a position that has halted is copied,
not updated, while the others go on, and the ponder cost N + R is added to the loss with `act_loss_weight`. Without
ACT the model runs `num_hidden_layers` steps, which is exactly a stack of that many weight-tied layers.

Generation reuses the past: `UniversalStepCache` keeps, for every step, the step inputs x^t of the positions already
processed (a position that halted keeps its final state, so its later step inputs are recomputed from it), and each
new token attends to them, which gives exactly the outputs of a pass over the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import MaskedLMOutput, ModelOutput, SequenceClassifierOutput

from .configuration_universal import UniversalTransformerConfig
from .txv_inputs import embed_inputs
from .txv_act import AdaptiveComputationTime
from .txv_attention import additive_mask, causal_allowed, get_attention_function
from .txv_cache import RowStateCache
from .txv_feedforward import PositionwiseFeedForward
from .txv_losses import causal_lm_loss, check_labels
from .txv_modeling_utils import TxvModelMixin
from .txv_positions import sinusoid_table
from .txv_sequence_classification import sequence_classification_loss


@dataclass
class UniversalTransformerModelOutput(ModelOutput):
    """ponder_cost: mean of N(t) + R(t) over the real positions (None without ACT). n_updates: `[batch, length]` the
    number of steps each position took. hidden_states: the state before the first step and after every step."""

    last_hidden_state: torch.FloatTensor | None = None
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None
    past_key_values: "UniversalStepCache | None" = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class UniversalTransformerCausalLMOutput(ModelOutput):
    """loss = lm_loss + act_loss_weight * ponder_cost."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None
    past_key_values: "UniversalStepCache | None" = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    cross_attentions: tuple[torch.FloatTensor, ...] | None = None


class UniversalStepCache(RowStateCache):
    """The past of a causal Universal Transformer, carried as `past_key_values`.

    `step_inputs[t]` is `[batch, past, hidden]`: the input x^t of step t of every cached position. Every cached
    position has halted after the steps stored (the loop of its call ran until all had halted); for a later step t it
    is a frozen copy, x^t = final + P + T_t, recomputed from `final` (its output before the final layer norm) and
    `positions` (P). `key_mask` marks the cached positions that may be attended to (not padding)."""

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
        steps = max(len(self.step_inputs), len(step_inputs))
        merged = []
        for step in range(steps):
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
        raise NotImplementedError("UniversalStepCache cannot be cropped (assisted decoding is not supported)")

    def reset(self):
        self.step_inputs, self.final, self.positions, self.key_mask = [], None, None, None

    def _row_tensors(self) -> dict:
        if self.final is None:
            return {}
        return {"step_inputs": self.step_inputs, "final": self.final, "positions": self.positions, "key_mask": self.key_mask}

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.final is not None

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_sliding(self) -> list[bool]:
        return [False]

    @property
    def is_linear(self) -> list[bool]:
        return [False]

    @property
    def is_dummy(self) -> list[bool]:
        return [False]


@dataclass
class UniversalTransformerMaskedLMOutput(MaskedLMOutput):
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None


@dataclass
class UniversalTransformerSequenceClassifierOutput(SequenceClassifierOutput):
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None


class UniversalTransformerAttention(nn.Module):
    """Multi-head attention through the shared attention functions (eager, SDPA), always with an explicit mask."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        inner = self.num_heads * self.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = False  # the mask is always explicit
        self.q_proj = nn.Linear(config.hidden_size, inner)
        self.k_proj = nn.Linear(config.hidden_size, inner)
        self.v_proj = nn.Linear(config.hidden_size, inner)
        self.o_proj = nn.Linear(inner, config.hidden_size)

    def forward(self, hidden_states, attention_mask, key_value_states=None, output_attentions=False):
        batch, query_length, _ = hidden_states.shape
        context = hidden_states if key_value_states is None else key_value_states
        heads = (self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(batch, query_length, *heads).transpose(1, 2)
        key = self.k_proj(context).view(batch, context.shape[1], *heads).transpose(1, 2)
        value = self.v_proj(context).view(batch, context.shape[1], *heads).transpose(1, 2)
        attention = get_attention_function(self.config, output_attentions)
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.config.attention_dropout if self.training else 0.0,
        )
        return self.o_proj(output.reshape(batch, query_length, -1)), weights


class UniversalTransformerLayer(GradientCheckpointingLayer):
    """The shared recurrent block: x + SelfAttn(LN(x)), [+ CrossAttn(LN(.), encoder)], + Transition(LN(.))."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = UniversalTransformerAttention(config)
        self.has_cross_attention = config.add_cross_attention
        if self.has_cross_attention:
            self.cross_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            self.cross_attn = UniversalTransformerAttention(config)
        self.transition_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.transition = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.drop = nn.Dropout(config.dropout)

    def forward(
        self,
        hidden_states,
        self_attention_mask,
        encoder_hidden_states=None,
        cross_attention_mask=None,
        output_attentions=False,
        self_context=None,
    ):
        """self_context: `[batch, past + length, hidden]` the step inputs of the cached positions followed by
        `hidden_states` (incremental decoding); keys and values of the self-attention are computed from it."""
        normed = self.self_attn_layer_norm(hidden_states)
        context = None if self_context is None else self.self_attn_layer_norm(self_context)
        attended, self_weights = self.self_attn(
            normed, self_attention_mask, key_value_states=context, output_attentions=output_attentions
        )
        hidden_states = hidden_states + self.drop(attended)
        cross_weights = None
        if self.has_cross_attention and encoder_hidden_states is not None:
            attended, cross_weights = self.cross_attn(
                self.cross_attn_layer_norm(hidden_states),
                cross_attention_mask,
                key_value_states=encoder_hidden_states,
                output_attentions=output_attentions,
            )
            hidden_states = hidden_states + self.drop(attended)
        hidden_states = hidden_states + self.transition(self.transition_layer_norm(hidden_states))
        return hidden_states, self_weights, cross_weights


class UniversalTransformerPreTrainedModel(TxvModelMixin, PreTrainedModel):
    config_class = UniversalTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["UniversalTransformerLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    auto_classes = {
        "AutoModel": "UniversalTransformerModel",
        "AutoModelForCausalLM": "UniversalTransformerForCausalLM",
        "AutoModelForMaskedLM": "UniversalTransformerForMaskedLM",
        "AutoModelForSequenceClassification": "UniversalTransformerForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
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
        if isinstance(module, AdaptiveComputationTime):
            init.normal_(module.halting.weight, 0.0, std)
            init.constant_(module.halting.bias, module.halting_bias_init)


class UniversalTransformerModel(UniversalTransformerPreTrainedModel):
    """The embeddings, the shared layer run over depth (fixed steps or ACT) and a final layer norm.

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
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

    def coordinate_embedding(self, position_ids: torch.Tensor, step: int, dtype) -> torch.Tensor:
        """P_i + T_t for every position (`[batch, length, hidden]`); t = step + 1."""
        batch, length = position_ids.shape
        positions = sinusoid_table(position_ids.reshape(-1), self.config.hidden_size).view(batch, length, -1)
        time = sinusoid_table(torch.tensor([step + 1.0], device=position_ids.device), self.config.hidden_size)
        return (positions + time).to(dtype)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        is_causal: bool | None = None,
        **kwargs,
    ) -> UniversalTransformerModelOutput | tuple:
        """
        attention_mask: `[batch, length]`, 1 for real tokens and 0 for padding (left or right). Positions count the
            real tokens only, so a left-padded row gives the outputs of the row alone.
        encoder_hidden_states / encoder_attention_mask: the encoder output and its padding mask, for the
            cross-attention (`config.add_cross_attention`).
        past_key_values: the `UniversalStepCache` of the previous call (causal only); use_cache: return one
            (default `config.use_cache`; `generate()` turns it on). attention_mask may then cover past + new tokens.
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else config.return_dict
        is_causal = config.is_decoder if is_causal is None else is_causal

        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size
        )
        batch, length = inputs_embeds.shape[:2]
        device, dtype = inputs_embeds.device, inputs_embeds.dtype

        cache = None
        if isinstance(past_key_values, UniversalStepCache):
            cache = past_key_values
            if not is_causal and cache.past_length:
                raise ValueError("past_key_values (a UniversalStepCache) needs causal self-attention")
            if cache.final is not None and cache.final.shape[0] != batch:
                raise ValueError(
                    f"past_key_values holds batch size {cache.final.shape[0]}, but the input has batch size {batch}"
                )
        elif past_key_values is not None:
            raise ValueError(
                f"past_key_values must be the UniversalStepCache returned by this model, got "
                f"{type(past_key_values).__name__} (with EncoderDecoderModel.generate pass use_cache=False)"
            )
        use_cache = (config.use_cache if use_cache is None else use_cache) and is_causal
        if use_cache and cache is None:
            cache = UniversalStepCache()
        past = cache.past_length if cache is not None else 0

        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] not in (
                length,
                past + length,
            ):
                raise ValueError(
                    f"attention_mask must be [batch={batch}, length={length}] or [batch, past + length={past + length}]"
                    f" (1 = token, 0 = padding), got shape {tuple(attention_mask.shape)}"
                )
            real = attention_mask[:, -length:].to(device=device, dtype=torch.bool)
        else:
            real = None
        new_real = real if real is not None else torch.ones(batch, length, dtype=torch.bool, device=device)
        # positions count real tokens only (a left-padded row equals the row alone)
        offset = cache.key_mask.sum(-1, keepdim=True) if past else torch.zeros(batch, 1, dtype=torch.long, device=device)
        position_ids = (offset + new_real.long().cumsum(-1) - 1).clamp(min=0)
        position_table = sinusoid_table(position_ids.reshape(-1), config.hidden_size).view(batch, length, -1).to(dtype)

        if is_causal:
            allowed = causal_allowed(length, past, device)[None, None]
        else:
            allowed = torch.ones(1, 1, length, length, dtype=torch.bool, device=device)
        if real is not None or past:
            key_valid = torch.cat([cache.key_mask, new_real], dim=1) if past else new_real
            allowed = allowed & key_valid[:, None, None, :]
        self_attention_mask = additive_mask(allowed, dtype)

        cross_attention_mask = None
        if encoder_hidden_states is not None:
            if not config.add_cross_attention:
                raise ValueError("encoder_hidden_states were given but config.add_cross_attention is False")
            if encoder_hidden_states.dim() != 3 or encoder_hidden_states.shape[0] != batch:
                raise ValueError(
                    f"encoder_hidden_states must be [batch={batch}, source_length, {config.hidden_size}], "
                    f"got shape {tuple(encoder_hidden_states.shape)}"
                )
            source_length = encoder_hidden_states.shape[1]
            if encoder_attention_mask is None:
                cross_allowed = torch.ones(batch, 1, 1, source_length, dtype=torch.bool, device=device)
            else:
                if encoder_attention_mask.shape != (batch, source_length):
                    raise ValueError(
                        f"encoder_attention_mask must be [batch={batch}, source_length={source_length}], "
                        f"got shape {tuple(encoder_attention_mask.shape)}"
                    )
                cross_allowed = encoder_attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]
            cross_attention_mask = additive_mask(cross_allowed, dtype)

        attentions, cross_attentions, step_inputs = [], [], []

        def time_embedding(step):
            return sinusoid_table(torch.tensor([step + 1.0], device=device), config.hidden_size).to(dtype)

        def step_fn(state, step):
            step_input = state + position_table + time_embedding(step)  # x^t = h^{t-1} + P + T_t
            dropped = self.drop(step_input)
            context = torch.cat([cache.step_input(step, time_embedding(step)), dropped], dim=1) if past else None
            step_output, self_weights, cross_weights = self.layer(
                dropped,
                self_attention_mask,
                encoder_hidden_states,
                cross_attention_mask,
                output_attentions=output_attentions,
                self_context=context,
            )
            attentions.append(self_weights)
            cross_attentions.append(cross_weights)
            if use_cache:
                step_inputs.append(step_input)
            return step_input, step_output

        state = inputs_embeds * self.embed_scale
        ponder_cost = None
        if config.use_act:
            result = self.act(state, step_fn, position_mask=real, return_step_states=output_hidden_states)
            hidden_states = result.output
            n_updates = result.n_updates
            weights = real.to(result.ponder_cost.dtype) if real is not None else torch.ones_like(result.ponder_cost)
            ponder_cost = (result.ponder_cost * weights).sum() / weights.sum().clamp(min=1)
            all_states = (state, *result.step_states) if output_hidden_states else None
        else:
            all_states = [state]
            for step in range(config.num_hidden_layers):
                _, state = step_fn(state, step)
                all_states.append(state)
            hidden_states = state
            n_updates = torch.full((batch, length), float(config.num_hidden_layers), device=device)
            all_states = tuple(all_states) if output_hidden_states else None
        if use_cache:
            cache.append(step_inputs, hidden_states, position_table, new_real, time_embedding)
        hidden_states = self.final_layer_norm(hidden_states)

        output = UniversalTransformerModelOutput(
            last_hidden_state=hidden_states,
            past_key_values=cache if use_cache else None,
            ponder_cost=ponder_cost,
            n_updates=n_updates,
            hidden_states=all_states,
            attentions=tuple(attentions) if output_attentions else None,
            cross_attentions=tuple(cross_attentions) if output_attentions and encoder_hidden_states is not None else None,
        )
        return output if return_dict else output.to_tuple()


def _add_ponder_cost(config, loss, ponder_cost):
    if loss is None or ponder_cost is None:
        return loss
    return loss + config.act_loss_weight * ponder_cost


class UniversalTransformerForCausalLM(UniversalTransformerPreTrainedModel, GenerationMixin):
    """The causal (decoder) Universal Transformer with a language-model head tied to the input embeddings.

    As the decoder of an `EncoderDecoderModel` it reads `encoder_hidden_states` through its cross-attention."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.model = UniversalTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own UniversalStepCache; generate() must not swap it for a DynamicCache

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def prepare_inputs_for_generation(
        self, input_ids, past_key_values=None, attention_mask=None, inputs_embeds=None, encoder_hidden_states=None,
        encoder_attention_mask=None, use_cache=None, **kwargs,
    ):
        """Only the tokens not yet in the `UniversalStepCache` (the whole sequence when use_cache=False)."""
        use_cache = True if use_cache is None else use_cache
        cache = past_key_values if use_cache and isinstance(past_key_values, UniversalStepCache) else None
        if cache is not None and cache.past_length:
            input_ids = input_ids[:, cache.past_length :]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "past_key_values": cache,
            "encoder_hidden_states": encoder_hidden_states,
            "encoder_attention_mask": encoder_attention_mask,
            "use_cache": use_cache,
        }

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> UniversalTransformerCausalLMOutput | tuple:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            is_causal=True,
        )
        hidden_states = outputs.last_hidden_state
        loss = lm_loss = None
        if labels is not None:
            check_labels(labels, hidden_states.shape[:2], self.config.vocab_size)
            logits = self.lm_head(hidden_states)
            lm_loss = causal_lm_loss(logits, labels, num_items_in_batch)
            loss = _add_ponder_cost(self.config, lm_loss, outputs.ponder_cost)
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
        else:
            logits = self.lm_head(hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states)
        output = UniversalTransformerCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )
        return output if return_dict else output.to_tuple()


class UniversalTransformerForMaskedLM(UniversalTransformerPreTrainedModel):
    """The bidirectional (encoder) Universal Transformer with a masked-LM head tied to the input embeddings."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.model = UniversalTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> UniversalTransformerMaskedLMOutput | tuple:
        """labels: `[batch, length]` token ids at masked positions and -100 elsewhere (not shifted)."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            is_causal=False,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:2]:
                raise ValueError(f"labels must have shape {tuple(logits.shape[:2])}, got {tuple(labels.shape)}")
            mlm_loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), labels.to(logits.device).reshape(-1), ignore_index=-100
            )
            loss = _add_ponder_cost(self.config, mlm_loss, outputs.ponder_cost)
        output = UniversalTransformerMaskedLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
        )
        return output if return_dict else output.to_tuple()


class UniversalTransformerForSequenceClassification(UniversalTransformerPreTrainedModel):
    """The bidirectional Universal Transformer with a linear classifier on the mean of the real positions."""

    def __init__(self, config: UniversalTransformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = UniversalTransformerModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> UniversalTransformerSequenceClassifierOutput | tuple:
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            is_causal=False,
        )
        hidden_states = outputs.last_hidden_state
        if attention_mask is None:
            pooled = hidden_states.mean(dim=1)
        else:
            weights = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
            pooled = (hidden_states * weights).sum(1) / weights.sum(1).clamp(min=1)
        logits = self.score(pooled)
        loss = None
        if labels is not None:
            loss = _add_ponder_cost(self.config, sequence_classification_loss(self.config, logits, labels),
                                    outputs.ponder_cost)
        output = UniversalTransformerSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
        )
        return output if return_dict else output.to_tuple()


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
