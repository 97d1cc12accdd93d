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
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast, SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .configuration_r_transformer import RTransformerConfig
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_feedforward import PositionwiseFeedForward
from .txv_inputs import embed_inputs
from .txv_layer_norm import AnnotatedLayerNorm, make_layer_norm
from .txv_local_rnn import LocalRNN, next_prefix
from .txv_losses import causal_lm_head
from .txv_mha import MultiHeadAttention, self_attention_mask
from .txv_pretrained import TxvPreTrainedModel
from .txv_sequence_classification import last_token_states, sequence_classification_loss


class RTransformerCache(DynamicCache):
    """The attention keys/values of every block (a `DynamicCache`, layer index = block index) and, per LocalRNN
    sub-layer, the last `local_window - 1` inputs of its windows (`rnn_prefixes[(block, sub_layer)]`).

    Its state (`to_state` / `from_state`, the memory protocol of docs/ARCHITECTURE.md, as `txv_cache.RowStateCache`'s
    subclasses have it): `keys` and `values`, per block the `[batch, heads, length, head_dim]` tensors (None for a
    block not run yet), `rnn_prefix_layers`, the `[block, sub_layer]` of each LocalRNN prefix, and `rnn_prefixes`,
    those prefixes (`[batch, local_window - 1, hidden]`), in the same order."""

    STATE_FIELDS = ("keys", "values", "rnn_prefix_layers", "rnn_prefixes")

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

    def to_state(self) -> dict:
        """This cache's content as plain tensors, lists and ints (what `torch.load(weights_only=True)` reads back);
        later calls of the model never change what it returns (they concatenate into new tensors)."""
        initialized = [layer.is_initialized for layer in self.layers]
        return {
            "keys": [layer.keys if ready else None for layer, ready in zip(self.layers, initialized)],
            "values": [layer.values if ready else None for layer, ready in zip(self.layers, initialized)],
            "rnn_prefix_layers": [list(key) for key in self.rnn_prefixes],
            "rnn_prefixes": list(self.rnn_prefixes.values()),
        }

    @classmethod
    def from_state(cls, state: dict) -> RTransformerCache:
        """The cache that `to_state()` described; a ValueError names what does not fit."""
        if not isinstance(state, dict):
            raise ValueError(
                f"a {cls.__name__} state must be the dict its to_state() gives, got {type(state).__name__}"
            )
        missing = [name for name in cls.STATE_FIELDS if name not in state]
        if missing:
            raise ValueError(f"the {cls.__name__} state lacks {', '.join(missing)} (it has {', '.join(sorted(state))})")
        keys, values, prefix_layers, prefixes = (state[name] for name in cls.STATE_FIELDS)
        if len(keys) != len(values) or len(prefix_layers) != len(prefixes):
            raise ValueError(
                f"the {cls.__name__} state holds {len(keys)} keys for {len(values)} values and "
                f"{len(prefix_layers)} rnn_prefix_layers for {len(prefixes)} rnn_prefixes"
            )
        cache = cls()
        for layer_idx, (key, value) in enumerate(zip(keys, values)):
            if key is not None:
                cache.update(key, value, layer_idx)
        cache.rnn_prefixes = {
            (int(block), int(sub_layer)): prefix for (block, sub_layer), prefix in zip(prefix_layers, prefixes)
        }
        return cache


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

    def initial_cache(self, batch_size: int | None = None, dtype=None, device=None) -> RTransformerCache:
        """The cache a first call starts with: an empty `RTransformerCache` (filled by the prompt's pass)."""
        return RTransformerCache()

    def _run_layers(self, hidden_states, output_attentions: bool, output_hidden_states: bool, **layer_inputs):
        """The layers over `hidden_states` (each also given `layer_inputs`, by name), then the final norm (when the
        model has one). Returns `(last hidden states, what entered each layer then the last hidden states, every
        layer's attention weights)`, the last two None unless `output_hidden_states` / `output_attentions`."""
        all_hidden_states, all_attentions = [], []
        for layer in self.layers:
            all_hidden_states.append(hidden_states)
            hidden_states, weights = layer(hidden_states, output_attentions=output_attentions, **layer_inputs)
            all_attentions.append(weights)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        all_hidden_states.append(hidden_states)
        return (
            hidden_states,
            tuple(all_hidden_states) if output_hidden_states else None,
            tuple(all_attentions) if output_attentions else None,
        )

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
            cache = self.initial_cache(batch)
        past_length = cache.get_seq_length() if cache is not None else 0
        mask = self_attention_mask(attention_mask, batch, length, past_length, True, dtype, device, fused=True)
        token_mask = attention_mask[:, -length:].to(device) if attention_mask is not None else None
        hidden_states, all_hidden_states, all_attentions = self._run_layers(
            self.embedding_dropout(inputs_embeds),
            output_attentions,
            output_hidden_states,
            attention_mask=mask,
            token_mask=token_mask,
            cache=cache,
        )
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            **cache_field(cache if use_cache else None),
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )


class RTransformerForCausalLM(RTransformerPreTrainedModel, GenerationMixin):
    """Language model with a (tied) linear softmax; `generate()` keeps an `RTransformerCache`."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: RTransformerConfig):
        super().__init__(config)
        self.model = RTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=config.output_bias)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own RTransformerCache; generate() must not swap it for a DynamicCache

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
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): `[batch, length]` targets already shifted (transformers' loss kwarg, e.g. for context
            parallelism): position t predicts shift_labels[t]; used instead of labels. Not a named argument: the
            Trainer takes every forward argument named like a label for a label it needs before it reports a loss.
        encoder_hidden_states: refused (the model has no cross-attention); encoder_attention_mask: not read.
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        Other keyword arguments go to the base model."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
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
        logits, loss = causal_lm_head(
            self.lm_head,
            outputs.last_hidden_state,
            self.config.vocab_size,
            labels,
            logits_to_keep,
            num_items_in_batch=num_items_in_batch,
            shift_labels=shift_labels,
        )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class RTransformerForSequenceClassification(RTransformerPreTrainedModel):
    """A linear classifier on the hidden state of the last real token of each row. Its output has no cache: the base
    model is asked for none (a `cache` or `use_cache` given is not read)."""

    # Copied from hf_txvariants.modeling_shaw.ShawForSequenceClassification.__init__ with Shaw->RTransformer
    def __init__(self, config: RTransformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = RTransformerModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

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
    ) -> SequenceClassifierOutput:
        """labels: `[batch]` class ids (float `[batch, num_labels]` for multi-label, `[batch]` floats for
        regression)."""
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
        loss = None if labels is None else sequence_classification_loss(self.config, logits, labels)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "RTransformerCache",
    "RTransformerPreTrainedModel",
    "RTransformerModel",
    "RTransformerForCausalLM",
    "RTransformerForSequenceClassification",
]
