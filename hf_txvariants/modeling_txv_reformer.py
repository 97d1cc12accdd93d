"""Reformer (Kitaev, Kaiser and Levskaya 2020, "Reformer: The Efficient Transformer"), as `txv_reformer`.

LSH self-attention with shared QK and chunked local self-attention (`txv_lsh`), reversible residual layers whose
backward pass recomputes activations (`txv_reversible`: memory flat in depth, exact gradients including dropout),
chunked feed-forward and axial position embeddings. Parameter names are those of transformers' ReformerModel, so its
checkpoints (`model_type` "reformer") load with `TxvReformerForCausalLM.from_pretrained` and reproduce its outputs
with the hash seed fixed. Inputs of any length are accepted, in training too: they are padded internally to a multiple
of the chunk lengths (padding is masked and hashed into its own bucket) and the outputs cut back.

The two residual streams (a, h) start as copies of the embeddings; each layer computes a = a + Attention(h),
h = h + FeedForward(a); the model's output is LayerNorm([a ; h]), of width 2 * hidden_size, as in the original.

Generation keeps a `TxvReformerCache`: per layer the keys and values of the past positions (LSH layers: the shared
query-keys) and the LSH buckets, so each new token costs one chunk window of attention per layer, plus the two
residual streams entering the first LSH layer at every past position. `generate()` with the cache gives exactly the
tokens (and, to float rounding, the logits) of `use_cache=False`:
- local layers, and LSH layers while the (padded) sequence fits in one LSH chunk, are causal: a past position's states
  never change, and the new token costs one chunk window;
- beyond one chunk, LSH sorts the whole sequence by bucket, so adding a token also changes the chunks (hence the
  outputs) of earlier positions; no O(chunk) cache can follow that (transformers' Reformer caches anyway and gives the
  "incremental" model, which differs). The layers before the first LSH layer are still causal and stepped; the first
  LSH layer's inputs are exact, so from there on the layers are recomputed over the whole sequence from the cached
  inputs: O(n) per token for those layers only, where `use_cache=False` pays it for every layer.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast, SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .configuration_txv_reformer import TxvReformerConfig
from .txv_cache import RowStateCache
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head
from .txv_lsh import (
    default_num_buckets,
    local_attention,
    local_attention_step,
    lsh_attention,
    lsh_attention_step,
)
from .txv_pretrained import TxvPreTrainedModel
from .txv_reversible import chunked_feed_forward, reversible_sequence
from .txv_sequence_classification import last_token_states, sequence_classification_loss


class TxvReformerCache(RowStateCache):
    """What `generate()` carries between steps: for every layer the keys and values of the past positions
    (`[batch, heads, length, head_dim]`; LSH layers keep their shared query-keys), the LSH buckets hashed so far
    (`[batch, heads, num_hashes, length]`, empty until the sequence outgrows one chunk) with the `num_buckets` they
    were hashed with, which past positions are real (`key_valid [batch, length]`), and the two residual streams
    entering the first LSH layer (`lsh_inputs [batch, length, 2 * hidden]`: the layers from there on are recomputed
    from them once the sequence outgrows one LSH chunk). One token per step."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.num_layers = num_layers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.buckets: list[torch.Tensor] = []
        self.bucket_settings: list = [None] * num_layers
        self.key_valid: torch.Tensor | None = None
        self.lsh_inputs: torch.Tensor | None = None
        self.seen_tokens = 0
        self.step: dict | None = None  # set by the model during a forward: padded length, whether it is one step

    def __repr__(self):
        return f"TxvReformerCache(num_layers={self.num_layers}, seen_tokens={self.seen_tokens})"

    def _row_tensors(self) -> dict:
        return {
            "keys": self.keys or None,
            "values": self.values or None,
            "buckets": self.buckets or None,
            "key_valid": self.key_valid,
            "lsh_inputs": self.lsh_inputs,
        }

    STATE_FIELDS = ("keys", "values", "buckets", "bucket_settings", "key_valid", "lsh_inputs", "seen_tokens")

    def to_state(self) -> dict:
        """`num_layers` and the fields described above (lists per layer; `bucket_settings` holds each LSH layer's
        `num_buckets`), `seen_tokens`."""
        state = {name: getattr(self, name) for name in self.STATE_FIELDS}
        for name in ("keys", "values", "buckets", "bucket_settings"):
            state[name] = list(state[name])
        return {"num_layers": self.num_layers, **state}

    @classmethod
    def from_state(cls, state: dict) -> TxvReformerCache:
        (num_layers,) = cls._state_fields(state, "num_layers")
        cache = cls(num_layers)
        for name, value in zip(cls.STATE_FIELDS, cls._state_fields(state, *cls.STATE_FIELDS)):
            setattr(cache, name, list(value) if isinstance(value, (list, tuple)) else value)
        cache.seen_tokens = int(cache.seen_tokens)
        return cache

    def append_lsh_inputs(self, attn_stream: torch.Tensor, hidden_stream: torch.Tensor) -> torch.Tensor:
        """Adds the new positions' streams entering the first LSH layer; returns those of every position."""
        streams = torch.cat([attn_stream, hidden_stream], dim=-1)
        self.lsh_inputs = streams if self.lsh_inputs is None else torch.cat([self.lsh_inputs, streams], dim=1)
        return self.lsh_inputs

    def append(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds the new positions' keys/values of a layer; returns the layer's keys/values of every position."""
        if len(self.keys) <= layer_idx:
            self.keys.append(keys)
            self.values.append(values)
            self.buckets.append(keys.new_zeros(keys.shape[0], 0, dtype=torch.long))
        else:
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], keys], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], values], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    def layer_buckets(self, layer_idx: int, num_buckets) -> torch.Tensor | None:
        """The past's buckets of an LSH layer if they were hashed with `num_buckets` (else None: hash again)."""
        if self.bucket_settings[layer_idx] != num_buckets or self.buckets[layer_idx].dim() != 4:
            return None
        return self.buckets[layer_idx]

    def set_buckets(self, layer_idx: int, buckets: torch.Tensor, num_buckets):
        self.buckets[layer_idx], self.bucket_settings[layer_idx] = buckets, num_buckets

    def reset(self):
        self.__init__(self.num_layers)

    def crop(self, max_length: int):
        raise NotImplementedError("TxvReformerCache cannot be cropped (assisted decoding is not supported)")

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.seen_tokens > 0


class TxvReformerAxialPositionEmbeddings(nn.Module):
    """Position p gets [E1[p // n2] ; E2[p % n2]] for `axial_pos_shape` (n1, n2). In training, dropout2d drops
    whole rows/columns of the grid, as transformers does."""

    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.shape = tuple(config.axial_pos_shape)
        self.dropout = config.hidden_dropout_prob
        self.weights = nn.ParameterList(
            [
                nn.Parameter(torch.ones(self.shape[0], 1, config.axial_pos_embds_dim[0])),
                nn.Parameter(torch.ones(1, self.shape[1], config.axial_pos_embds_dim[1])),
            ]
        )

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        n1, n2 = self.shape
        grid = torch.cat([w.expand(n1, n2, w.shape[-1]) for w in self.weights], dim=-1)  # [n1, n2, dim]
        if self.training and self.dropout > 0:
            grid = nn.functional.dropout2d(grid.permute(1, 0, 2)[None], p=self.dropout, training=True)[0].permute(
                1, 0, 2
            )
        return grid.reshape(n1 * n2, -1)[position_ids]


class TxvReformerPositionEmbeddings(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.dropout = config.hidden_dropout_prob
        self.embedding = nn.Embedding(config.max_position_embeddings, config.hidden_size)

    def forward(self, position_ids):
        return nn.functional.dropout(self.embedding(position_ids), p=self.dropout, training=self.training)


class TxvReformerEmbeddings(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.dropout = config.hidden_dropout_prob
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = (
            TxvReformerAxialPositionEmbeddings(config)
            if config.axial_pos_embds
            else TxvReformerPositionEmbeddings(config)
        )

    def forward(self, inputs_embeds, position_ids):
        embeddings = nn.functional.dropout(inputs_embeds, p=self.dropout, training=self.training)
        return embeddings + self.position_embeddings(position_ids)


def _split_heads(states: torch.Tensor, heads: int) -> torch.Tensor:
    return states.view(states.shape[0], states.shape[1], heads, -1).transpose(1, 2)


class TxvReformerLSHSelfAttention(nn.Module):
    def __init__(self, config: TxvReformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        inner = config.num_attention_heads * config.attention_head_size
        self.query_key = nn.Linear(config.hidden_size, inner, bias=False)
        self.value = nn.Linear(config.hidden_size, inner, bias=False)

    def num_buckets(self, length: int):
        config = self.config
        if config.num_buckets is not None:
            return config.num_buckets
        return default_num_buckets(length, config.lsh_attn_chunk_length, config.max_position_embeddings)

    def forward(self, hidden_states, key_valid=None, output_attentions=False, cache: TxvReformerCache | None = None):
        """`[B, H, L, D]` outputs and the `[B, H, L, L]` weights (or None)."""
        config, heads = self.config, self.config.num_attention_heads
        query_key = _split_heads(self.query_key(hidden_states), heads)
        value = _split_heads(self.value(hidden_states), heads)
        if cache is not None and cache.step["incremental"]:
            query_key, value = cache.append(self.layer_idx, query_key, value)
            padded_length = cache.step["padded_length"]
            num_buckets = self.num_buckets(padded_length)
            output, buckets, weights = lsh_attention_step(
                query_key,
                value,
                cache.layer_buckets(self.layer_idx, num_buckets),
                key_valid,
                padded_length,
                config.num_hashes,
                num_buckets,
                config.lsh_attn_chunk_length,
                config.lsh_num_chunks_before,
                config.lsh_num_chunks_after,
                config.hash_seed,
                output_attentions,
            )
            if buckets is not None:
                cache.set_buckets(self.layer_idx, buckets, num_buckets)
            return output, weights
        if cache is not None:  # the prompt: keep the real positions' keys/values
            cache.append(self.layer_idx, query_key[:, :, : cache.step["length"]], value[:, :, : cache.step["length"]])
        result = lsh_attention(
            query_key,
            value,
            config.num_hashes,
            self.num_buckets(hidden_states.shape[1]),
            config.lsh_attn_chunk_length,
            config.lsh_num_chunks_before,
            config.lsh_num_chunks_after,
            config.is_decoder,
            key_valid,
            config.hash_seed,
            config.lsh_attention_probs_dropout_prob,
            self.training,
            output_attentions,
        )
        return result if output_attentions else (result, None)


class TxvReformerLocalSelfAttention(nn.Module):
    def __init__(self, config: TxvReformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        inner = config.num_attention_heads * config.attention_head_size
        self.query = nn.Linear(config.hidden_size, inner, bias=False)
        self.key = nn.Linear(config.hidden_size, inner, bias=False)
        self.value = nn.Linear(config.hidden_size, inner, bias=False)

    def forward(self, hidden_states, key_valid=None, output_attentions=False, cache: TxvReformerCache | None = None):
        config, heads = self.config, self.config.num_attention_heads
        query = _split_heads(self.query(hidden_states), heads)
        key = _split_heads(self.key(hidden_states), heads)
        value = _split_heads(self.value(hidden_states), heads)
        if cache is not None and cache.step["incremental"]:
            key, value = cache.append(self.layer_idx, key, value)
            return local_attention_step(
                query,
                key,
                value,
                key_valid,
                cache.step["padded_length"],
                config.local_attn_chunk_length,
                config.local_num_chunks_before,
                output_attentions,
            )
        if cache is not None:
            cache.append(self.layer_idx, key[:, :, : cache.step["length"]], value[:, :, : cache.step["length"]])
        result = local_attention(
            query,
            key,
            value,
            config.local_attn_chunk_length,
            config.local_num_chunks_before,
            config.local_num_chunks_after,
            config.is_decoder,
            key_valid,
            config.local_attention_probs_dropout_prob,
            self.training,
            output_attentions,
        )
        return result if output_attentions else (result, None)


class TxvReformerSelfOutput(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.dropout = config.hidden_dropout_prob
        self.dense = nn.Linear(config.num_attention_heads * config.attention_head_size, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        return nn.functional.dropout(self.dense(hidden_states), p=self.dropout, training=self.training)


class TxvReformerAttention(nn.Module):
    """F of the reversible block: LayerNorm, LSH or local self-attention, output projection, dropout."""

    def __init__(self, config: TxvReformerConfig, layer_idx: int):
        super().__init__()
        kind = config.attn_layers[layer_idx]
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attention = (
            TxvReformerLSHSelfAttention(config, layer_idx)
            if kind == "lsh"
            else TxvReformerLocalSelfAttention(config, layer_idx)
        )
        self.output = TxvReformerSelfOutput(config)

    def forward(self, hidden_states, key_valid=None, output_attentions=False, cache=None):
        """The attention's output `[B, L, hidden]` and its weights `[B, H, L, L]` (or None)."""
        output, weights = self.self_attention(self.layer_norm(hidden_states), key_valid, output_attentions, cache)
        output = output.transpose(1, 2).reshape(hidden_states.shape[0], hidden_states.shape[1], -1)
        return self.output(output), weights


class TxvReformerFeedForwardDense(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.dropout = config.hidden_dropout_prob
        self.act_fn = ACT2FN[config.hidden_act]
        self.dense = nn.Linear(config.hidden_size, config.feed_forward_size)

    def forward(self, hidden_states):
        hidden_states = nn.functional.dropout(self.dense(hidden_states), p=self.dropout, training=self.training)
        return self.act_fn(hidden_states)


class TxvReformerFeedForwardOutput(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.dropout = config.hidden_dropout_prob
        self.dense = nn.Linear(config.feed_forward_size, config.hidden_size)

    def forward(self, hidden_states):
        return nn.functional.dropout(self.dense(hidden_states), p=self.dropout, training=self.training)


class TxvReformerFeedForward(nn.Module):
    """G of the reversible block: LayerNorm, Linear, dropout, activation, Linear, dropout; `chunk_size_feed_forward`
    positions at a time."""

    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.chunk_size = config.chunk_size_feed_forward
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dense = TxvReformerFeedForwardDense(config)
        self.output = TxvReformerFeedForwardOutput(config)

    def forward_chunk(self, hidden_states):
        return self.output(self.dense(self.layer_norm(hidden_states)))

    def forward(self, hidden_states):
        return chunked_feed_forward(self.forward_chunk, self.chunk_size, hidden_states)


class TxvReformerLayer(GradientCheckpointingLayer):
    """One reversible block: a' = a + attention(h), h' = h + feed_forward(a')."""

    def __init__(self, config: TxvReformerConfig, layer_idx: int):
        super().__init__()
        self.attention = TxvReformerAttention(config, layer_idx)
        self.feed_forward = TxvReformerFeedForward(config)

    def forward(self, attn_stream, hidden_stream, key_valid=None, output_attentions=False, cache=None):
        attention_output, weights = self.attention(hidden_stream, key_valid, output_attentions, cache)
        attn_stream = attn_stream + attention_output
        hidden_stream = hidden_stream + self.feed_forward(attn_stream)
        return attn_stream, hidden_stream, weights


class TxvReformerPreTrainedModel(TxvPreTrainedModel):
    config_class = TxvReformerConfig
    base_model_prefix = "reformer"
    _no_split_modules = ["TxvReformerLayer"]
    _supports_sdpa = False  # LSH and chunked attention are not dense attentions
    auto_classes = {
        "AutoModel": "TxvReformerModel",
        "AutoModelForCausalLM": "TxvReformerForCausalLM",
        "AutoModelForSequenceClassification": "TxvReformerForSequenceClassification",
    }
    head_key_patterns = (r"^lm_head\.", r"^score\.")

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, nn.ParameterList):  # the axial position embeddings' `weights`
            for weight in module:
                init.normal_(weight, 0.0, self.config.axial_norm_std)


class TxvReformerModel(TxvReformerPreTrainedModel):
    _input_embed_layer = "word_embeddings"  # under `embeddings`, as in transformers' Reformer

    def __init__(self, config: TxvReformerConfig):
        super().__init__(config)
        self.embeddings = TxvReformerEmbeddings(config)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(TxvReformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.encoder.layer_norm = nn.LayerNorm(2 * config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def _padding_length(self, length: int) -> int:
        """transformers' rule: pad to a multiple of the chunk lengths' lcm when longer than the smallest chunk."""
        config = self.config
        smallest = min(
            {"lsh": config.lsh_attn_chunk_length, "local": config.local_attn_chunk_length}[k]
            for k in config.attn_layers
        )
        multiple = config.chunk_multiple
        if length % multiple == 0 or length <= smallest:
            return 0
        return multiple - length % multiple

    def initial_cache(self, batch_size: int | None = None, dtype=None, device=None) -> TxvReformerCache:
        """The cache a first call starts with: an empty `TxvReformerCache` (filled by the prompt's pass)."""
        return TxvReformerCache(self.config.num_hidden_layers)

    def _prepare_cache(self, cache, use_cache: bool, batch: int, length: int, padded_length: int):
        """The cache this forward reads and writes (None without one), with the facts its layers need."""
        if cache is None and not use_cache:
            return None
        if cache is None:
            if self.training:
                return None  # training recomputes everything; a cache is only built for inference
            cache = self.initial_cache(batch)
        if not isinstance(cache, TxvReformerCache):
            raise ValueError(f"cache must be the TxvReformerCache returned by this model, got {type(cache).__name__}")
        if self.training:
            raise ValueError("cache (the generation cache) is for inference: call model.eval() first")
        incremental = cache.seen_tokens > 0
        if incremental and length != 1:
            raise ValueError(f"with cache, txv_reformer takes one new token per step, got {length}")
        if incremental:
            cache.check_batch(batch)
        cache.step = {"incremental": incremental, "length": length, "padded_length": padded_length}
        return cache

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: TxvReformerCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """attention_mask: `[batch, length]` (with a cache: `[batch, past + length]`), 1 for tokens, 0 for padding.
        Returns `last_hidden_state` of width 2 * hidden_size; `attentions` are, per layer, the `[batch, heads,
        length, keys]` weights each query used (LSH: its rounds' probabilities over the key positions, weighted by the
        rounds' weights). `use_cache` (inference) returns a `TxvReformerCache` as `cache`; given back with
        one new token, only that token is computed (see the module docstring)."""
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.embeddings.word_embeddings, config.vocab_size, config.hidden_size
        )
        batch, length = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        past_length = cache.seen_tokens if isinstance(cache, TxvReformerCache) else 0
        full_length = past_length + length
        if attention_mask is not None and attention_mask.shape not in ((batch, length), (batch, full_length)):
            raise ValueError(
                f"attention_mask must be [batch={batch}, length={length}] (or [batch, {full_length}] with "
                f"cache), got {tuple(attention_mask.shape)}"
            )
        padding = self._padding_length(full_length)
        cache = self._prepare_cache(cache, use_cache, batch, length, full_length + padding)
        key_valid = attention_mask.to(device=device, dtype=torch.bool) if attention_mask is not None else None
        if cache is not None and cache.step["incremental"]:
            return self._forward_step(inputs_embeds, key_valid, cache, output_attentions, output_hidden_states)

        if padding:
            pad_id = config.pad_token_id if config.pad_token_id is not None else 0
            pad_embeds = self.embeddings.word_embeddings(torch.full((batch, padding), pad_id, device=device))
            inputs_embeds = torch.cat([inputs_embeds, pad_embeds], dim=1)
            if key_valid is None:
                key_valid = torch.ones(batch, length, dtype=torch.bool, device=device)
            key_valid = torch.cat([key_valid, torch.zeros(batch, padding, dtype=torch.bool, device=device)], dim=1)
        total = length + padding
        if total > config.max_position_embeddings:
            raise ValueError(
                f"input of {length} positions (padded to {total}) is longer than max_position_embeddings "
                f"({config.max_position_embeddings})"
            )
        if position_ids is None:
            position_ids = torch.arange(total, device=device)[None].expand(batch, total)
        elif padding:
            position_ids = torch.cat(
                [position_ids, position_ids[:, -1:] + torch.arange(1, padding + 1, device=device)], 1
            )
        hidden = self.embeddings(inputs_embeds, position_ids)

        attn_stream, hidden_stream = hidden, hidden
        layers = self.encoder.layers
        all_hidden, all_attentions = [], []
        # The reversible autograd.Function replays random states, which torch.compile cannot trace: compiled, the
        # layers store their activations (same outputs and gradients, memory no longer flat in depth).
        plain_loop = output_hidden_states or output_attentions or cache is not None or torch.compiler.is_compiling()
        if config.reversible and not plain_loop and not (self.gradient_checkpointing and self.training):
            blocks = [(lambda x, layer=layer: layer.attention(x, key_valid)[0], layer.feed_forward) for layer in layers]
            attn_stream, hidden_stream = reversible_sequence(
                attn_stream, hidden_stream, blocks, [p for p in layers.parameters()]
            )
        else:
            first_lsh = self._first_lsh_layer()
            for index, layer in enumerate(layers):
                if cache is not None and index == first_lsh:
                    cache.append_lsh_inputs(attn_stream[:, :length], hidden_stream[:, :length])
                all_hidden.append(hidden_stream)
                attn_stream, hidden_stream, weights = layer(
                    attn_stream, hidden_stream, key_valid, output_attentions, cache
                )
                all_attentions.append(weights)
            all_hidden.append(hidden_stream)
        if cache is not None:
            real = (
                key_valid[:, :length]
                if key_valid is not None
                else torch.ones(batch, length, dtype=torch.bool, device=device)
            )
            cache.key_valid, cache.seen_tokens = real, length
        output = self.encoder.layer_norm(torch.cat([attn_stream, hidden_stream], dim=-1))
        output = nn.functional.dropout(output, p=config.hidden_dropout_prob, training=self.training)[:, :length]
        return BaseModelOutputWithPast(
            last_hidden_state=output,
            **cache_field(cache),
            hidden_states=tuple(h if h.shape[1] == length else h[:, :length] for h in all_hidden)
            if output_hidden_states
            else None,
            attentions=tuple(w[:, :, :length, :length] for w in all_attentions) if output_attentions else None,
        )

    def _first_lsh_layer(self) -> int | None:
        """Index of the first LSH layer (None without one): the cache keeps the streams entering it."""
        return self.config.attn_layers.index("lsh") if "lsh" in self.config.attn_layers else None

    def _recompute_layers(
        self, first, streams, key_valid, padded_length, output_attentions, all_hidden, all_attentions
    ):
        """Layers `first`.. over the whole sequence from the streams entering layer `first` (`[B, n, 2 * hidden]`,
        the cached past and the new position), padded to `padded_length` as the full forward pads: padding is masked
        (and hashed into its own bucket), so its content, zeros here, changes no real position. Appends the new
        position's inputs/weights of each layer to `all_hidden` / `all_attentions`; returns its two streams."""
        batch, length = streams.shape[:2]
        padding = padded_length - length
        streams = nn.functional.pad(streams, (0, 0, 0, padding))
        key_valid = nn.functional.pad(key_valid, (0, padding), value=False)
        attn_stream, hidden_stream = streams.chunk(2, dim=-1)
        last = slice(length - 1, length)
        for layer in self.encoder.layers[first:]:
            all_hidden.append(hidden_stream[:, last])
            attn_stream, hidden_stream, weights = layer(attn_stream, hidden_stream, key_valid, output_attentions)
            all_attentions.append(weights[:, :, last, :length] if weights is not None else None)
        return attn_stream[:, last], hidden_stream[:, last]

    def _forward_step(self, inputs_embeds, key_valid, cache, output_attentions, output_hidden_states):
        """One new token against the cache (inference)."""
        batch, device = inputs_embeds.shape[0], inputs_embeds.device
        new_valid = torch.ones(batch, 1, dtype=torch.bool, device=device)
        if key_valid is None:
            key_valid = torch.cat([cache.key_valid, new_valid], dim=1)
        elif key_valid.shape[1] == 1:
            key_valid = torch.cat([cache.key_valid, key_valid], dim=1)
        position = cache.seen_tokens
        if position >= self.config.max_position_embeddings:
            raise ValueError(f"the sequence outgrows max_position_embeddings ({self.config.max_position_embeddings})")
        position_ids = torch.full((batch, 1), position, device=device, dtype=torch.long)
        hidden = self.embeddings(inputs_embeds, position_ids)
        attn_stream, hidden_stream = hidden, hidden
        all_hidden, all_attentions = [], []
        first_lsh = self._first_lsh_layer()
        for index, layer in enumerate(self.encoder.layers):
            if index == first_lsh:
                streams = cache.append_lsh_inputs(attn_stream, hidden_stream)
                if cache.step["padded_length"] > self.config.lsh_attn_chunk_length:
                    attn_stream, hidden_stream = self._recompute_layers(
                        index,
                        streams,
                        key_valid,
                        cache.step["padded_length"],
                        output_attentions,
                        all_hidden,
                        all_attentions,
                    )
                    break
            all_hidden.append(hidden_stream)
            attn_stream, hidden_stream, weights = layer(attn_stream, hidden_stream, key_valid, output_attentions, cache)
            all_attentions.append(weights)
        all_hidden.append(hidden_stream)
        cache.key_valid, cache.seen_tokens = key_valid, position + 1
        output = self.encoder.layer_norm(torch.cat([attn_stream, hidden_stream], dim=-1))
        return BaseModelOutputWithPast(
            last_hidden_state=output,
            **cache_field(cache),
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )


class TxvReformerLMHead(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.chunk_size = config.chunk_size_lm_head
        self.decoder = nn.Linear(2 * config.hidden_size, config.vocab_size, bias=False)

    def forward(self, hidden_states):
        return chunked_feed_forward(self.decoder, self.chunk_size, hidden_states)


class TxvReformerForCausalLM(TxvReformerPreTrainedModel, GenerationMixin):
    """Reformer language model (`config.is_decoder` must be True). Loads transformers' ReformerModelWithLMHead
    checkpoints."""

    # transformers 5's ReformerOnlyLMHead saves a `bias` that its forward never adds; neither do we.
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\.bias$", r"^lm_head\.decoder\.bias$"]

    def __init__(self, config: TxvReformerConfig):
        if not config.is_decoder:
            raise ValueError("is_decoder must be True for TxvReformerForCausalLM (causal attention)")
        super().__init__(config)
        self.reformer = TxvReformerModel(config)
        self.lm_head = TxvReformerLMHead(config)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model builds its own TxvReformerCache

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @accepts_cache_names
    def prepare_inputs_for_generation(
        self, input_ids, next_sequence_length=None, cache=None, attention_mask=None, **kwargs
    ):
        """transformers' preparation (which forwards `output_attentions`, `output_hidden_states`, ...), after refusing
        left padding: a left-padded row would get other positions, hence other outputs, than the row alone."""
        if attention_mask is not None and attention_mask.shape[1] > 1:
            mask = attention_mask.bool()
            if bool((~mask[:, :-1] & mask[:, 1:]).any()):
                raise ValueError(
                    "txv_reformer does not generate from left-padded prompts (attention_mask has padding before "
                    "tokens): the positions, hence the outputs, would differ from each row alone; generate the rows "
                    "separately or group prompts of equal length"
                )
        if cache is None:
            next_sequence_length = None  # no cache (yet): the whole sequence
        return super().prepare_inputs_for_generation(
            input_ids,
            next_sequence_length=next_sequence_length,
            **cache_field(cache),
            attention_mask=attention_mask,
            **kwargs,
        )

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: TxvReformerCache | None = None,
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
        logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every position.
        The logits come from the chunked `lm_head` over the 2 * hidden_size wide output. The Reformer has no
        cross-attention (`encoder_hidden_states` is refused). Other keyword arguments (e.g. `position_ids`) go to
        the base model."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None:
            raise ValueError("encoder_hidden_states was given but txv_reformer has no cross-attention")
        outputs = self.reformer(
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


class TxvReformerForSequenceClassification(TxvReformerPreTrainedModel):
    """A linear classifier on the (2 * hidden_size wide) state of the last real token of each row. Not the head of
    transformers' ReformerForSequenceClassification (first token, non-causal), whose weights do not load here."""

    def __init__(self, config: TxvReformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.reformer = TxvReformerModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        self.score = nn.Linear(2 * config.hidden_size, config.num_labels, bias=False)
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
    ) -> SequenceClassifierOutput:
        """labels: `[batch]` class ids (float `[batch, num_labels]` for multi-label, `[batch]` floats for
        regression). The classifier keeps no cache: `cache` and `use_cache` are accepted and not used."""
        outputs = self.reformer(
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
    "TxvReformerCache",
    "TxvReformerPreTrainedModel",
    "TxvReformerModel",
    "TxvReformerForCausalLM",
    "TxvReformerForSequenceClassification",
]
