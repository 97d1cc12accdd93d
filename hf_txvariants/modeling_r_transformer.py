"""R-Transformer (Wang, Wang, Ji and Liu 2019, "R-Transformer: Recurrent Neural Network Enhanced Transformer").

No position embeddings: order comes from a LocalRNN (see `txv_local_rnn`) that summarises the last `local_window`
tokens at every position. Each block: LocalRNN sub-layer(s), causal multi-head self-attention, feed-forward, each as
x + dropout(sublayer(LayerNorm(x))) as in the original code (github.com/DSE-MSU/R-transformer, whose outputs
the tests reproduce from fixtures). Causal throughout: `RTransformerForCausalLM` and
`RTransformerForSequenceClassification` (last real token). `generate()` uses an `RTransformerCache`: transformers'
`DynamicCache` for the attention keys/values plus, per LocalRNN layer, its last k - 1 inputs.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .configuration_r_transformer import RTransformerConfig
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field
from .txv_feedforward import PositionwiseFeedForward
from .txv_heads import CausalLMHeadMixin, SequenceClassificationHeadMixin
from .txv_inputs import embed_inputs
from .txv_layer_norm import AnnotatedLayerNorm, make_layer_norm
from .txv_local_rnn import LocalRNN, next_prefix
from .txv_mha import MultiHeadAttention, self_attention_mask
from .txv_pretrained import TxvPreTrainedModel
from .txv_transformer_stack import run_layers


class RTransformerCache(DynamicCache):
    """The attention keys/values of every block (a `DynamicCache`, layer index = block index) and, per LocalRNN
    sub-layer, the last `local_window - 1` inputs of its windows (`rnn_prefixes[(block, sub_layer)]`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rnn_prefixes: dict[tuple[int, int], torch.Tensor] = {}

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        for key, prefix in self.rnn_prefixes.items():
            self.rnn_prefixes[key] = prefix.index_select(0, beam_idx.to(prefix.device))

    def reset(self):
        super().reset()
        self.rnn_prefixes.clear()


class RTransformerLocalRNNLayer(nn.Module):
    """x + dropout(LocalRNN(LayerNorm(x))). Padding positions enter the RNN as zeros, like the left zero padding,
    so a left-padded row sees the windows it would see alone."""

    def __init__(self, config: RTransformerConfig):
        super().__init__()
        self.layer_norm = make_layer_norm(config.layer_norm_type, config.hidden_size, config.layer_norm_eps)
        self.local_rnn = LocalRNN(config.hidden_size, config.rnn_type, config.local_window)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states, token_mask=None, cache: RTransformerCache | None = None, cache_key=None):
        normed = self.layer_norm(hidden_states)
        if token_mask is not None:
            normed = normed * token_mask[..., None].to(normed.dtype)
        prefix = cache.rnn_prefixes.get(cache_key) if cache is not None else None
        output = self.local_rnn(normed, prefix)
        if cache is not None:
            cache.rnn_prefixes[cache_key] = next_prefix(prefix, normed, self.local_rnn.window)
        return hidden_states + self.dropout(output)


class RTransformerBlock(GradientCheckpointingLayer):
    def __init__(self, config: RTransformerConfig, layer_idx: int):
        super().__init__()
        self.rnn_layers = nn.ModuleList(RTransformerLocalRNNLayer(config) for _ in range(config.num_rnn_layers))
        self.attention_layer_norm = make_layer_norm(config.layer_norm_type, config.hidden_size, config.layer_norm_eps)
        self.self_attn = MultiHeadAttention(config, layer_idx)
        self.feed_forward_layer_norm = make_layer_norm(
            config.layer_norm_type, config.hidden_size, config.layer_norm_eps
        )
        self.mlp = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states, attention_mask=None, token_mask=None, cache=None, output_attentions=False):
        for index, rnn_layer in enumerate(self.rnn_layers):
            hidden_states = rnn_layer(hidden_states, token_mask, cache, (self.self_attn.layer_idx, index))
        attention_output, weights = self.self_attn(
            self.attention_layer_norm(hidden_states),
            attention_mask,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states = hidden_states + self.dropout(attention_output)
        hidden_states = hidden_states + self.mlp(self.feed_forward_layer_norm(hidden_states))
        return hidden_states, weights


class RTransformerPreTrainedModel(TxvPreTrainedModel):
    config_class = RTransformerConfig
    _no_split_modules = ["RTransformerBlock"]
    # The LocalRNN state (the last k - 1 inputs of each RNN sub-layer) cannot be rolled back to an earlier length,
    # so transformers refuses assisted decoding with its own clear error.
    _is_stateful = True
    _supports_sdpa = True
    auto_classes = {
        "AutoModel": "RTransformerModel",
        "AutoModelForCausalLM": "RTransformerForCausalLM",
        "AutoModelForSequenceClassification": "RTransformerForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, AnnotatedLayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, (nn.GRU, nn.LSTM, nn.RNN)):
            # PyTorch's own RNN initialisation: U(-1/sqrt(hidden), 1/sqrt(hidden)) for every weight and bias.
            bound = module.hidden_size**-0.5
            for weight in module.parameters():
                init.uniform_(weight, -bound, bound)


class RTransformerModel(RTransformerPreTrainedModel):
    """Token embeddings (no positions), `num_hidden_layers` blocks, a final LayerNorm if `config.final_layer_norm`."""

    def __init__(self, config: RTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.embedding_dropout = nn.Dropout(config.embedding_dropout)
        self.layers = nn.ModuleList(
            RTransformerBlock(config, layer_idx) for layer_idx in range(config.num_hidden_layers)
        )
        self.norm = (
            make_layer_norm(config.layer_norm_type, config.hidden_size, config.layer_norm_eps)
            if config.final_layer_norm
            else None
        )
        self.gradient_checkpointing = False
        self.post_init()

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: RTransformerCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """attention_mask: `[batch, past + length]` (or `[batch, length]`), 1 = token, 0 = padding (left or right).
        cache: the `RTransformerCache` of the previous call (created when `use_cache`)."""
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        if self.gradient_checkpointing and self.training:
            use_cache = False  # a checkpointed block is run twice: it would write its cache twice
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        batch, length = inputs_embeds.shape[:2]
        device, dtype = inputs_embeds.device, inputs_embeds.dtype
        if cache is not None and not isinstance(cache, RTransformerCache):
            raise ValueError(f"cache must be the RTransformerCache returned by this model, got {type(cache).__name__}")
        if use_cache and cache is None:
            cache = RTransformerCache()
        past_length = cache.get_seq_length() if cache is not None else 0
        mask = self_attention_mask(attention_mask, batch, length, past_length, True, dtype, device, fused=True)
        token_mask = attention_mask[:, -length:].to(device) if attention_mask is not None else None

        def call_layer(_, layer, hidden_states):
            return layer(hidden_states, mask, token_mask, cache=cache, output_attentions=output_attentions)

        fields = run_layers(
            self.layers,
            self.embedding_dropout(inputs_embeds),
            call_layer,
            output_attentions,
            output_hidden_states,
            self.norm,
        )
        return BaseModelOutputWithPast(**fields, **cache_field(cache if use_cache else None))


class RTransformerForCausalLM(CausalLMHeadMixin, RTransformerPreTrainedModel, GenerationMixin):
    """Language model with a (tied) linear softmax; `generate()` keeps an `RTransformerCache`."""

    backbone_class = RTransformerModel
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def build_heads(self, config: RTransformerConfig):
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.output_bias)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own RTransformerCache; generate() must not swap it for a DynamicCache


class RTransformerForSequenceClassification(SequenceClassificationHeadMixin, RTransformerPreTrainedModel):
    """A linear classifier on the hidden state of the last real token of each row."""

    backbone_class = RTransformerModel
    output_class = SequenceClassifierOutput


__all__ = [
    "RTransformerCache",
    "RTransformerPreTrainedModel",
    "RTransformerModel",
    "RTransformerForCausalLM",
    "RTransformerForSequenceClassification",
]
