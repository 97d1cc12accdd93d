"""ACT RNN: a recurrent network with Adaptive Computation Time (Graves 2016, "Adaptive Computation Time for Recurrent
Neural Networks"), the setting ACT was introduced in.

At every input step t the cell S runs n = 1 .. N(t) times on the same input, with a flag on the first update:

    s_t^1 = S(s_{t-1}, [x_t, 1]),   s_t^n = S(s_t^{n-1}, [x_t, 0])
    h_t^n = sigmoid(W_h s_t^n + b_h)                                  (the halting unit reads the state)
    N(t), R(t), p_t^n as in txv_act.py;   s_t = sum_n p_t^n s_t^n,   y_t = W_y s_t + b_y = sum_n p_t^n y_t^n

and the ponder cost rho_t = N(t) + R(t) is added to the loss with `act_loss_weight` (tau). The halting arithmetic is
the shared `txv_act` block (`AdaptiveComputationTime` and its `PonderLoop`); `ACTRNNPonderStep` writes the loop over
the ponder steps around the cell, once per input step over the rows of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .configuration_act_rnn import ACTRNNConfig
from .txv_act import ACTCausalLMOutput, ACTModelOutput, AdaptiveComputationTime, add_ponder_cost, init_halting_unit
from .txv_cache import RowStateCache
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head
from .txv_pretrained import TxvPreTrainedModel
from .txv_sequence_classification import last_token_states, sequence_classification_loss

# ---------------------------------------------------------------------------------------------------------- outputs


@dataclass
class ACTRNNModelOutput(ACTModelOutput):
    """last_hidden_state: `[batch, length, hidden]` the output part of s_t (h for an LSTM). ponder_cost:
    `[batch, length]` rho_t = N(t) + R(t) (0 at padding). n_updates: `[batch, length]` N(t). cache: the
    `ACTRNNCache`. hidden_states: the input vectors x_t and last_hidden_state."""


@dataclass
class ACTRNNCausalLMOutput(ACTCausalLMOutput):
    """loss = lm_loss + act_loss_weight * (mean of ponder_cost over the real positions); cache: the
    `ACTRNNCache`."""


@dataclass
class ACTRNNSequenceClassifierOutput(SequenceClassifierOutput):
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None


# ------------------------------------------------------------------------------------------------------------ cache


class ACTRNNCache(RowStateCache):
    """The recurrent state s_t after the last input step (`[batch, state_size]`), carried as `cache`. An
    RNN state cannot be rolled back, so the model is declared stateful (transformers refuses assisted decoding)."""

    num_layers = 1  # one state

    def __init__(self):
        super().__init__()
        self.state: torch.Tensor | None = None
        self.seen_tokens = 0

    def reset(self):
        self.state, self.seen_tokens = None, 0

    def crop(self, tokens_to_remove: int):
        raise NotImplementedError("An ACT RNN state cannot be cropped (the model is stateful)")

    def _row_tensors(self) -> dict:
        return {"state": self.state}

    def to_state(self) -> dict:
        """`state` (s_t, `[batch, state_size]`; None before the first input) and `seen_tokens`."""
        return {"state": self.state, "seen_tokens": self.seen_tokens}

    @classmethod
    def from_state(cls, state: dict) -> ACTRNNCache:
        rnn_state, seen_tokens = cls._state_fields(state, "state", "seen_tokens")
        cache = cls()
        cache.state, cache.seen_tokens = rnn_state, int(seen_tokens)
        return cache


# ------------------------------------------------------------------------------------------------------------- cell


class PonderingCell(nn.Module):
    """The cell S on a flat state: s = h (tanh RNN, GRU) or s = [h, c] (LSTM). Its input is [x_t, first-step flag]."""

    def __init__(self, config: ACTRNNConfig):
        super().__init__()
        self.rnn_type = config.rnn_type
        self.hidden_size = config.hidden_size
        cells = {"tanh": nn.RNNCell, "gru": nn.GRUCell, "lstm": nn.LSTMCell}
        self.rnn = cells[config.rnn_type](config.embedding_size + 1, config.hidden_size)

    def forward(self, inputs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.rnn_type == "lstm":
            hidden, cell = self.rnn(inputs, tuple(state.split(self.hidden_size, dim=-1)))
            return torch.cat([hidden, cell], dim=-1)
        return self.rnn(inputs, state)

    def output(self, state: torch.Tensor) -> torch.Tensor:
        """The part of s the output layer reads (h)."""
        return state[..., : self.hidden_size]


class ACTRNNPonderStep(GradientCheckpointingLayer):
    """One input step: the cell pondered under ACT. Returns (s_t, rho_t, N(t)) for every row."""

    def __init__(self, config: ACTRNNConfig):
        super().__init__()
        self.cell = PonderingCell(config)
        self.act = AdaptiveComputationTime(
            config.state_size, config.max_ponder_steps, config.act_threshold, config.halting_bias_init
        )

    def forward(self, inputs: torch.Tensor, state: torch.Tensor, real: torch.Tensor | None):
        """inputs: `[batch, embedding_size]` x_t; state: `[batch, state_size]` s_{t-1}; real: `[batch]` bool or None.
        A padding row keeps s_{t-1} and costs nothing."""

        # the ACT loop carries [batch, 1, state]; the halting unit reads s_t^n
        ponder = self.act.start(state[:, None], None if real is None else real[:, None])
        for step in range(self.act.max_steps):
            flag = inputs.new_full((inputs.shape[0], 1), 1.0 if step == 0 else 0.0)  # delta_{n,1}
            new_state = self.cell(torch.cat([inputs, flag], dim=-1), ponder.state[:, 0]).unsqueeze(1)
            ponder.update(new_state, new_state)
            if ponder.halted:
                break
        result = ponder.result()
        new_state = result.output[:, 0]
        if real is not None:
            new_state = torch.where(real[:, None], new_state, state)
        return new_state, result.ponder_cost[:, 0], result.n_updates[:, 0]


# ------------------------------------------------------------------------------------------------------------ model


class ACTRNNPreTrainedModel(TxvPreTrainedModel):
    config_class = ACTRNNConfig
    _no_split_modules = ["ACTRNNPonderStep"]
    _is_stateful = True  # an RNN state cannot be cropped: transformers refuses assisted decoding with a clear error
    auto_classes = {
        "AutoModel": "ACTRNNModel",
        "AutoModelForCausalLM": "ACTRNNForCausalLM",
        "AutoModelForSequenceClassification": "ACTRNNForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")

    def _init_weights(self, module):
        if init_halting_unit(module, self.config.initializer_range):
            return
        if isinstance(module, (nn.RNNCell, nn.GRUCell, nn.LSTMCell)):
            bound = module.hidden_size**-0.5  # PyTorch's own RNN initialisation
            for weight in module.parameters():
                init.uniform_(weight, -bound, bound)
        else:
            super()._init_weights(module)


class ACTRNNModel(ACTRNNPreTrainedModel):
    """Token embeddings (or the input vectors given as `inputs_embeds`) read by the pondering RNN."""

    def __init__(self, config: ACTRNNConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.embedding_size)
        self.ponder_step = ACTRNNPonderStep(config)
        self.drop = nn.Dropout(config.dropout)
        self.gradient_checkpointing = False
        self.post_init()

    def initial_cache(self, batch_size: int | None = None, dtype=None, device=None) -> ACTRNNCache:
        """The cache a first call starts with: an empty `ACTRNNCache` (the state starts at zero)."""
        return ACTRNNCache()

    def _state_cache(self, cache, use_cache: bool, batch: int) -> ACTRNNCache | None:
        if cache is None:
            return self.initial_cache(batch) if use_cache else None
        if not isinstance(cache, ACTRNNCache):
            raise ValueError(f"cache must be the ACTRNNCache returned by this model, got {type(cache).__name__}")
        cache.check_batch(batch)
        return cache

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: ACTRNNCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> ACTRNNModelOutput:
        """
        input_ids `[batch, length]` or inputs_embeds `[batch, length, embedding_size]` (the input vectors x_t).
        attention_mask: `[batch, length]` (or `[batch, past + length]`), 1 = input, 0 = padding; a padding step leaves
            the state unchanged, so a left-padded row gives the outputs of the row alone.
        cache / use_cache: the `ACTRNNCache` (the state s_t) to continue from / to return.
        """
        if kwargs.get("output_attentions"):
            raise ValueError("output_attentions: the ACT RNN has no attention")
        config = self.config
        use_cache = config.use_cache if use_cache is None else use_cache
        output_hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        inputs = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.embedding_size)
        batch, length = inputs.shape[:2]
        cache = self._state_cache(cache, use_cache, batch)
        real = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
                raise ValueError(
                    f"attention_mask must be [batch={batch}, >= {length}] (1 = input, 0 = padding), "
                    f"got shape {tuple(attention_mask.shape)}"
                )
            real = attention_mask[:, -length:].to(device=inputs.device, dtype=torch.bool)
        state = cache.state if cache is not None and cache.state is not None else None
        if state is None:
            state = inputs.new_zeros(batch, config.state_size)
        dropped = self.drop(inputs)
        outputs, ponder_costs, n_updates = [], [], []
        for t in range(length):
            state, ponder_cost, steps = self.ponder_step(dropped[:, t], state, None if real is None else real[:, t])
            outputs.append(self.ponder_step.cell.output(state))
            ponder_costs.append(ponder_cost)
            n_updates.append(steps)
        if cache is not None:
            cache.state = state.detach()
            cache.seen_tokens += length
        last_hidden_state = self.drop(torch.stack(outputs, dim=1))
        return ACTRNNModelOutput(
            last_hidden_state=last_hidden_state,
            ponder_cost=torch.stack(ponder_costs, dim=1),
            n_updates=torch.stack(n_updates, dim=1),
            **cache_field(cache),
            hidden_states=(inputs, last_hidden_state) if output_hidden_states else None,
        )


# ------------------------------------------------------------------------------------------------------------ heads
# Every head adds the mean ponder cost to its loss with `act_loss_weight` (`txv_act.add_ponder_cost`).


class ACTRNNForCausalLM(ACTRNNPreTrainedModel, GenerationMixin):
    """The pondering RNN with the output layer y_t = W_y s_t + b_y over the vocabulary (next-token prediction)."""

    def __init__(self, config: ACTRNNConfig):
        super().__init__(config)
        self.model = ACTRNNModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()
        if self.generation_config is not None:
            self.generation_config.use_cache = True  # generate() carries the state (config.use_cache is for training)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own ACTRNNCache; generate() must not swap it for a DynamicCache

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: ACTRNNCache | None = None,
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
    ) -> ACTRNNCausalLMOutput:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        loss = lm_loss (the next-token loss) + act_loss_weight * the mean ponder cost of the real positions.
        The RNN has no cross-attention (`encoder_hidden_states` is refused) and no attention weights."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None:
            raise ValueError("encoder_hidden_states was given but the ACT RNN has no cross-attention")
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
        return ACTRNNCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
        )


class ACTRNNForSequenceClassification(ACTRNNPreTrainedModel):
    """The pondering RNN with a linear classifier on the state after the last real input step (the paper's parity
    task: one input vector, one sigmoid/softmax output)."""

    def __init__(self, config: ACTRNNConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ACTRNNModel(config)
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
    ) -> ACTRNNSequenceClassifierOutput:
        """labels: `[batch]` class ids (float `[batch, num_labels]` for multi-label, `[batch]` floats for
        regression). The classifier keeps no cache: `cache` and `use_cache` are accepted and not used. The loss adds
        act_loss_weight * the mean ponder cost of the real positions."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=None,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        pooled = last_token_states(outputs.last_hidden_state, input_ids, attention_mask, self.config.pad_token_id)
        logits = self.score(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(self.config, logits, labels)
            loss = add_ponder_cost(loss, outputs.ponder_cost, self.config.act_loss_weight, attention_mask)
        return ACTRNNSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            ponder_cost=outputs.ponder_cost,
            n_updates=outputs.n_updates,
        )


__all__ = [
    "ACTRNNPreTrainedModel",
    "ACTRNNModel",
    "ACTRNNForCausalLM",
    "ACTRNNForSequenceClassification",
    "ACTRNNModelOutput",
    "ACTRNNCausalLMOutput",
    "ACTRNNCache",
]
