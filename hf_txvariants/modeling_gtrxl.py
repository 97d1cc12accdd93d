"""Gated Transformer-XL (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement Learning"), and its
ungated ablations TrXL and TrXL-I, as a memory backbone for reinforcement learning.

One layer with identity map reordering (TrXL-I and every gate), M the layer's memory, E its input:

    Y  = RelativeMultiHeadAttention(LayerNorm([StopGrad(M), E]))      (Transformer-XL relative attention)
    E' = g_MHA(E, ReLU(Y))
    F  = PositionwiseFeedForward(LayerNorm(E'))
    E_out = g_MLP(E', ReLU(F))

with g a gate from `txv_gates` (plain residual `x + y` for TrXL-I). TrXL is the original post-LN block:
`E' = LayerNorm(E + Y)`, `E_out = LayerNorm(E' + F)`.

RL use: `inputs_embeds` are embedded observations; the memory (`past_key_values`, a `MemoryCache` of the inputs each
layer saw at the last `mem_len` time steps) carries the past across calls, one step at a time while acting or a stored
segment at a time while learning. `episode_starts` (or `MemoryCache.reset_rows(done, memory_init="empty")`) makes
an episode's first step attend to nothing before it, so a row whose episode restarts behaves exactly like a fresh row.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_gtrxl import GTrXLConfig
from .txv_attention import causal_allowed
from .txv_cache import MemoryCache, MemoryGenerationMixin, memory_for_input
from .txv_feedforward import PositionwiseFeedForward
from .txv_gates import GatingLayer, build_gate
from .txv_inputs import embed_inputs, segment_padding_mask
from .txv_modeling_utils import TxvModelMixin
from .txv_relative_attention import RelativePositionAttention, relative_position_embeddings


class GTrXLLayer(GradientCheckpointingLayer):
    def __init__(self, config: GTrXLConfig):
        super().__init__()
        self.post_norm = config.gate_type == "trxl"
        self.attention = RelativePositionAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if not self.post_norm:
            gate_type = "residual" if config.gate_type == "trxl_i" else config.gate_type
            self.attention_gate = build_gate(gate_type, config.hidden_size, config.gate_bias)
            self.feed_forward_gate = build_gate(gate_type, config.hidden_size, config.gate_bias)

    def forward(self, hidden_states, position_embeddings, allowed, memory=None, output_attentions=False):
        if self.post_norm:
            attended, weights = self.attention(
                hidden_states, position_embeddings, allowed, memory=memory, output_attentions=output_attentions
            )
            hidden_states = self.attention_norm(hidden_states + attended)
            return self.feed_forward_norm(hidden_states + self.feed_forward(hidden_states)), weights
        attended, weights = self.attention(
            hidden_states,
            position_embeddings,
            allowed,
            memory=memory,
            context_norm=self.attention_norm,
            output_attentions=output_attentions,
        )
        hidden_states = self.attention_gate(hidden_states, torch.relu(attended))
        transformed = self.feed_forward(self.feed_forward_norm(hidden_states))
        return self.feed_forward_gate(hidden_states, torch.relu(transformed)), weights


class GTrXLPreTrainedModel(TxvModelMixin, PreTrainedModel):
    config_class = GTrXLConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GTrXLLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    auto_classes = {"AutoModel": "GTrXLModel", "AutoModelForCausalLM": "GTrXLForCausalLM"}
    head_key_patterns = (r"^lm_head\.",)

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, 0.0, std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, RelativePositionAttention):
            init.normal_(module.r_w_bias, 0.0, std)
            init.normal_(module.r_r_bias, 0.0, std)
        elif isinstance(module, GatingLayer) and module.has_bias:
            init.constant_(module.gate_bias, module.initial_bias)


class GTrXLModel(GTrXLPreTrainedModel):
    def __init__(self, config: GTrXLConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(GTrXLLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

    def init_memory(self, batch_size: int | None = None) -> MemoryCache:
        """An empty memory (the first step of every row attends only to itself); `batch_size` is implied by the
        first call."""
        return MemoryCache(self.config.num_hidden_layers, self.config.mem_len)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: MemoryCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        episode_starts: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """
        inputs_embeds: `[batch, length, hidden_size]`, e.g. embedded observations (or pass `input_ids`).
        attention_mask: `[batch, >= length]`, 1 for real steps and 0 for padding; its last `length` columns are used.
        past_key_values: the `MemoryCache` returned by the previous call (updated in place and returned).
        episode_starts: `[batch, length]` bool, True where a new episode begins: that step and the later ones attend
            to nothing before it (neither memory nor earlier steps), and the memory keeps only the new episode.
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else config.use_cache
        return_dict = return_dict if return_dict is not None else config.return_dict

        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size
        )
        batch, query_length = inputs_embeds.shape[:2]
        device = inputs_embeds.device

        cache = memory_for_input(
            past_key_values,
            lambda: self.init_memory(batch),
            batch_size=batch,
            hidden_size=config.hidden_size,
            num_layers=len(self.layers),
        )
        memory_length = cache.memory_length
        key_length = memory_length + query_length
        input_mask = segment_padding_mask(attention_mask, batch, query_length, device, unit="step")

        window = config.mem_len + 1 if config.same_length else None
        allowed = causal_allowed(query_length, memory_length, device, window)[None, None]  # [1, 1, Q, K]
        key_mask = cache.key_mask(input_mask, query_length)
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]

        last_start = None
        if episode_starts is not None:
            if episode_starts.shape != (batch, query_length):
                raise ValueError(
                    f"episode_starts must be [batch, length] = {(batch, query_length)}, "
                    f"got shape {tuple(episode_starts.shape)}"
                )
            steps = torch.arange(query_length, device=device)
            # last_start[b, i]: the latest step <= i where row b's episode began (-1: none in this segment).
            starts = episode_starts.to(device=device, dtype=torch.bool)
            last_start = torch.where(starts, steps, -1).cummax(dim=1).values
            first_key = torch.where(last_start >= 0, last_start + memory_length, 0)  # in [memory; segment] coords
            allowed = allowed & (torch.arange(key_length, device=device) >= first_key[:, :, None])[:, None]

        position_embeddings = self.drop(
            relative_position_embeddings(key_length, config.hidden_size, config.clamp_len, inputs_embeds.dtype, device)
        )

        hidden_states = self.drop(inputs_embeds)
        layer_inputs, attentions = [], []
        for layer_idx, layer in enumerate(self.layers):
            layer_inputs.append(hidden_states)
            hidden_states, weights = layer(
                hidden_states,
                position_embeddings,
                allowed,
                memory=cache.layer_memory(layer_idx),
                output_attentions=output_attentions,
            )
            attentions.append(weights)
        hidden_states = self.drop(hidden_states)

        if use_cache:
            if last_start is not None:
                # Rows whose episode restarted forget everything before the restart.
                cache.reset_rows(last_start[:, -1] >= 0, memory_init="empty")
                in_episode = torch.arange(query_length, device=device) >= last_start[:, -1:]
                input_mask = in_episode if input_mask is None else input_mask & in_episode
            cache.update_memories(layer_inputs, input_mask)
        output = BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            past_key_values=cache if use_cache else None,
            hidden_states=tuple(layer_inputs) + (hidden_states,) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class GTrXLForCausalLM(MemoryGenerationMixin, GTrXLPreTrainedModel, GenerationMixin):
    """GTrXL with a language-model head (tied to the input embeddings by default). The memory is kept across
    `generate()` steps, so each new token costs O(mem_len)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: GTrXLConfig):
        super().__init__(config)
        self.model = GTrXLModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.model.embed_tokens = new_embeddings

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def init_memory(self, batch_size: int | None = None) -> MemoryCache:
        return self.model.init_memory(batch_size)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: MemoryCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        episode_starts: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            episode_starts=episode_starts,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        logits = self.lm_head(hidden_states[:, -logits_to_keep:] if logits_to_keep > 0 else hidden_states)
        loss = None
        if labels is not None:
            if labels.shape != hidden_states.shape[:2]:
                raise ValueError(f"labels must have shape {tuple(hidden_states.shape[:2])}, got {tuple(labels.shape)}")
            if logits.shape[1] != labels.shape[1]:
                raise ValueError("labels need the logits of every position: leave logits_to_keep at 0")
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch
            )
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = ["GTrXLPreTrainedModel", "GTrXLModel", "GTrXLForCausalLM", "GTrXLLayer"]
