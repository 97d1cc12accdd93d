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
segment at a time while learning. `episode_starts` (or `MemoryCache.reset_rows(done)`, the default memory_init="empty") makes
an episode's first step attend to nothing before it, so a row whose episode restarts behaves exactly like a fresh row.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init

from .configuration_gtrxl import GTrXLConfig
from .txv_cache import MemoryCache, MemoryGenerationMixin
from .txv_feedforward import PositionwiseFeedForward
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head
from .txv_pretrained import TxvModelMixin
from .txv_relative_attention import RelativePositionAttention
from .txv_xl import (
    XLBackboneMixin,
    XLCausalLMOutput,
    XLLayer,
    XLModelOutput,
    XLSpanMethodsMixin,
    build_final_norm,
    init_mechanism_weights,
)


class GTrXLModelOutput(XLModelOutput):
    """span_penalty: with adaptive span, the sum over layers of the mean span (tokens); None otherwise."""


class GTrXLCausalLMOutput(XLCausalLMOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty (just lm_loss without adaptive span)."""


class GTrXLLayer(XLLayer):
    part_paths = {
        "attention": "attention",
        "attention_norm": "attention_norm",
        "feed_forward": "feed_forward",
        "feed_forward_norm": "feed_forward_norm",
        "adaptive_span": "attention.adaptive_span",
    }

    def __init__(self, config: GTrXLConfig):
        super().__init__()
        self.attention = RelativePositionAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.add_mechanisms(config)


class GTrXLPreTrainedModel(XLSpanMethodsMixin, TxvModelMixin, PreTrainedModel):
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
        init_mechanism_weights(module, std)


class GTrXLModel(XLBackboneMixin, GTrXLPreTrainedModel):
    def __init__(self, config: GTrXLConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(GTrXLLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = build_final_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

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
    ) -> GTrXLModelOutput | tuple:
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
        backbone = self.run_backbone(
            inputs_embeds, attention_mask, past_key_values, use_cache, output_attentions, episode_starts=episode_starts
        )
        output = GTrXLModelOutput(
            last_hidden_state=backbone.last_hidden_state,
            span_penalty=backbone.span_penalty,
            past_key_values=backbone.cache if use_cache else None,
            hidden_states=tuple(backbone.layer_inputs) + (backbone.last_hidden_state,) if output_hidden_states else None,
            attentions=tuple(backbone.attentions) if output_attentions else None,
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

    def init_memory(self, batch_size: int, dtype=None, device=None) -> MemoryCache:
        return self.model.init_memory(batch_size, dtype, device)

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
    ) -> GTrXLCausalLMOutput | tuple:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): the targets already shifted (transformers' loss kwarg, e.g. for context parallelism)."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        shift_labels = kwargs.get("shift_labels")  # a loss kwarg, not a named argument (Trainer's label_names)
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
        logits, lm_loss = causal_lm_head(
            self.lm_head, hidden_states, self.config.vocab_size, labels, logits_to_keep,
            num_items_in_batch=num_items_in_batch, shift_labels=shift_labels,
        )
        loss = lm_loss
        if lm_loss is not None and outputs.span_penalty is not None:
            loss = loss + self.config.adapt_span_loss * outputs.span_penalty
        output = GTrXLCausalLMOutput(
            loss=loss,
            logits=logits,
            lm_loss=lm_loss,
            span_penalty=outputs.span_penalty,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "GTrXLPreTrainedModel",
    "GTrXLModel",
    "GTrXLForCausalLM",
    "GTrXLLayer",
    "GTrXLModelOutput",
    "GTrXLCausalLMOutput",
]
