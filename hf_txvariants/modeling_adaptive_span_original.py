"""The original adaptive-span Transformer (Sukhbaatar et al. 2019, "Adaptive Attention Span in Transformers") and its
all-attention network (Sukhbaatar et al. 2019b, "Augmenting Self-attention with Persistent Memory"), as
facebookresearch/adaptive-span builds them (`models.py`, `adaptive_span.py`, `persistent_memory.py`), so that the
authors' published checkpoints run here (`conversion/adaptive_span.py`).

For a block of M positions, in every layer l (B batch, K heads, d head_dim, S attn_span):

    context = the layer's cache (the hidden states that entered it before; zeros at the start), last S' positions
    keys, values = W_k [context; h], W_v [context; h]      (bias-free projections), queries = W_q h
    score(i, j) = q_i . k_{i - S' + j} + q_i . key_pe[:, S - S' + j]      j = 0 .. S' - 1: the S' previous positions,
                                                                            never the query itself
    p = softmax(score / sqrt(d)) * m_z(S' - 1 - j), renormalised (+1e-8)  (`txv_adaptive_span` soft mask, ramp R)
    h = LayerNorm(h + W_o sum_j p_j v_j);  h = LayerNorm(h + FF(h))       (post-layer-norm)

S' = S - trim, where trim = the positions beyond every head's span rounded down to a multiple of 64 (the original's
`trim_memory`); the cache keeps S' + 64 positions with `adapt_span_cache`, else S. The all-attention network adds N
persistent key/value vectors per head to the same softmax (their weights renormalised jointly with the masked
context weights) and has no feed-forward sublayer.

Scores over the S' previous positions of each query are computed with the original's skew: q K^T over [context; h]
is `[M, S' + M]`; reading it with row stride S' + M + 1 instead of S' + M puts the S' keys before query i at columns
0 .. S' - 1 of row i (`band_of_scores`), and the inverse (`scores_to_band_layout`) spreads the weights back."""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput
from transformers.utils import can_return_tuple

from .configuration_adaptive_span_original import AdaptiveSpanOriginalConfig
from .txv_adaptive_span import (
    AdaptiveSpan,
    original_cache_length,
    original_trim_length,
    soft_span_mask,
    with_span_penalty,
)
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, model_output, output_cache
from .txv_dropout import Dropout
from .txv_inputs import embed_inputs
from .txv_losses import causal_lm_head
from .txv_pretrained import TxvPreTrainedModel
from .txv_span_cache import SpanCache


@model_output
class AdaptiveSpanOriginalModelOutput(ModelOutput):
    """last_hidden_state `[batch, length, hidden]`; cache: the `SpanCache` to pass with the next block;
    hidden_states: the input of every layer and the last hidden state; span_penalty: sum over layers of the mean span
    of the heads (tokens), None without adaptive span."""

    last_hidden_state: torch.FloatTensor | None = None
    cache: SpanCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    span_penalty: torch.FloatTensor | None = None


@model_output
class AdaptiveSpanOriginalCausalLMOutput(ModelOutput):
    """loss = lm_loss + adapt_span_loss * span_penalty (lm_loss: mean next-token negative log-likelihood);
    logits `[batch, length, vocab]` (their log_softmax is the original's output)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    cache: SpanCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    lm_loss: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None


def band_of_scores(scores: torch.Tensor) -> torch.Tensor:
    """`[..., M, S' + M]` scores of M queries against [S' earlier positions; the M positions] -> `[..., M, S']`, where
    column j of row i is the key at position i + j, i.e. the S' positions before query i (the original's `_unskew`)."""
    *lead, queries, keys = scores.shape
    span = keys - queries
    flat = scores.reshape(*lead, queries * keys)
    flat = nn.functional.pad(flat, (0, queries))
    return flat.view(*lead, queries, keys + 1)[..., :span]


def scores_to_band_layout(band: torch.Tensor) -> torch.Tensor:
    """The inverse of `band_of_scores` (the original's `_skew`): `[..., M, S']` -> `[..., M, S' + M]` with row i's
    values at columns i .. i + S' - 1 and zeros elsewhere."""
    *lead, queries, span = band.shape
    padded = nn.functional.pad(band, (0, queries + 1))
    flat = padded.reshape(*lead, queries * (span + queries + 1))[..., : queries * (span + queries)]
    return flat.view(*lead, queries, span + queries)


class AdaptiveSpanOriginalAttention(nn.Module):
    """Multi-head attention over the `attn_span` previous positions (`proj_query`, `proj_key`, `proj_val`,
    `proj_out`, bias-free), with the learned spans (`adaptive_span`) and, in the all-attention network, the persistent
    vectors `persistent_key` `[heads, head_dim, N]` and `persistent_value` `[heads, N, head_dim]`."""

    def __init__(self, config: AdaptiveSpanOriginalConfig):
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.max_span = config.attn_span
        self.keep_trimmed_cache = config.adapt_span_cache
        hidden = config.hidden_size
        self.proj_query = nn.Linear(hidden, hidden, bias=False)
        self.proj_key = nn.Linear(hidden, hidden, bias=False)
        self.proj_val = nn.Linear(hidden, hidden, bias=False)
        self.proj_out = nn.Linear(hidden, hidden, bias=False)
        self.dropout = Dropout(config.attention_dropout)
        self.adaptive_span = None
        if config.adapt_span_enabled:
            self.adaptive_span = AdaptiveSpan(
                config.num_attention_heads, config.attn_span, config.adapt_span_ramp, config.adapt_span_init
            )
        self.persistent_size = config.persistent_memory_size
        if self.persistent_size:
            self.persistent_key = nn.Parameter(torch.empty(self.num_heads, self.head_dim, self.persistent_size))
            self.persistent_value = nn.Parameter(torch.empty(self.num_heads, self.persistent_size, self.head_dim))

    def spans(self) -> torch.Tensor | None:
        return None if self.adaptive_span is None else self.adaptive_span.spans()

    def span_lengths(self, spans: torch.Tensor | None) -> tuple[int, int]:
        """(S', cache length): the previous positions attended to after the original's trimming, and the positions the
        layer's cache keeps for the next block."""
        if spans is None or torch.compiler.is_compiling():
            # a traced graph cannot read the spans: attending to all S positions gives the same weights (the soft mask
            # is exactly 0 beyond the trimmed ones) and the untrimmed cache holds what the trimmed one would
            return self.max_span, self.max_span
        trim = original_trim_length(self.adaptive_span.required_keys(spans), self.max_span)
        cache_length = original_cache_length(trim, self.max_span) if self.keep_trimmed_cache else self.max_span
        return self.max_span - trim, cache_length

    def split_heads(self, states: torch.Tensor) -> torch.Tensor:
        batch, length, _ = states.shape
        return states.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def span_mask(self, spans: torch.Tensor, span_length: int) -> torch.Tensor:
        """`[heads, 1, S']`: the soft mask of column j, whose key is at distance S' - j (x = S' - 1 - j)."""
        distances = torch.arange(span_length - 1, -1, -1, device=spans.device, dtype=spans.dtype)
        return soft_span_mask(distances, spans[:, None, None], self.adaptive_span.ramp)

    def forward(self, hidden_states, context, key_pe, spans=None):
        """hidden_states `[B, M, hidden]`; context `[B, S', hidden]` (the S' positions before the block); key_pe
        `[1, head_dim, S]`. Returns `[B, M, hidden]`."""
        span_length = context.shape[1]
        all_states = torch.cat([context, hidden_states], dim=1)
        query = self.split_heads(self.proj_query(hidden_states))  # [B, K, M, d]
        key = self.split_heads(self.proj_key(all_states))  # [B, K, S' + M, d]
        value = self.split_heads(self.proj_val(all_states))
        position_keys = key_pe[:, :, key_pe.shape[-1] - span_length :]  # the S' nearest distances
        scores = band_of_scores(query @ key.transpose(-1, -2)) + query @ position_keys  # [B, K, M, S']
        mask = None if spans is None else self.span_mask(spans, span_length).to(scores.dtype)
        if self.persistent_size:
            # persistent vectors share the softmax with the context (scaled as the original: q . (k sqrt d) / sqrt d)
            persistent_scores = query @ (self.persistent_key * math.sqrt(self.head_dim))
            weights = torch.softmax(torch.cat([scores, persistent_scores], dim=-1) / math.sqrt(self.head_dim), dim=-1)
            if mask is not None:
                # mask the context weights, then renormalise them jointly with the persistent ones
                weights = torch.cat([weights[..., :span_length] * mask, weights[..., span_length:]], dim=-1)
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-8)
            weights, persistent_weights = weights[..., :span_length], weights[..., span_length:]
            persistent_out = self.dropout(persistent_weights) @ (
                self.persistent_value * math.sqrt(self.persistent_size)
            )
        else:
            weights = torch.softmax(scores / math.sqrt(self.head_dim), dim=-1)
            if mask is not None:
                weights = weights * mask
                weights = weights / (weights.sum(-1, keepdim=True) + 1e-8)
            persistent_out = None
        out = scores_to_band_layout(self.dropout(weights)) @ value  # [B, K, M, d]
        if persistent_out is not None:
            out = out + persistent_out
        batch, _, length, _ = out.shape
        return self.proj_out(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class AdaptiveSpanOriginalFeedForward(nn.Module):
    """`fc2(dropout(relu(fc1(h))))`, the original's feed-forward sublayer (no dropout on its output)."""

    def __init__(self, config: AdaptiveSpanOriginalConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = Dropout(config.dropout)

    def forward(self, hidden_states):
        return self.fc2(self.dropout(nn.functional.relu(self.fc1(hidden_states))))


class AdaptiveSpanOriginalLayer(GradientCheckpointingLayer):
    """`norm1(h + attn(h))`, then `norm2(h + ff(h))` (the all-attention network has no `ff` / `norm2`)."""

    def __init__(self, config: AdaptiveSpanOriginalConfig):
        super().__init__()
        self.attn = AdaptiveSpanOriginalAttention(config)
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ff = None
        if not config.all_attention:
            self.ff = AdaptiveSpanOriginalFeedForward(config)
            self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states, context, key_pe, spans=None):
        hidden_states = self.norm1(hidden_states + self.attn(hidden_states, context, key_pe, spans))
        if self.ff is not None:
            hidden_states = self.norm2(hidden_states + self.ff(hidden_states))
        return hidden_states


def previous_positions(state: torch.Tensor | None, span_length: int, like: torch.Tensor) -> torch.Tensor:
    """The `span_length` positions a layer's queries look back to before the block: the end of its cache `state`,
    padded with zero vectors in front when the cache is shorter (the original's `trim_memory` pads so too)."""
    if state is None:
        return like.new_zeros(like.shape[0], span_length, like.shape[2])
    if state.shape[1] >= span_length:
        return state[:, state.shape[1] - span_length :]
    return nn.functional.pad(state, (0, 0, span_length - state.shape[1], 0))


def next_cache_state(state: torch.Tensor | None, hidden_states: torch.Tensor, cache_length: int) -> torch.Tensor:
    """The last `cache_length` positions of [state; hidden_states] (the original's `h_cache_next`), detached."""
    new = hidden_states.shape[1]
    if cache_length <= new or state is None:
        kept = hidden_states[:, max(new - cache_length, 0) :]
    else:
        kept = torch.cat([state[:, max(state.shape[1] - (cache_length - new), 0) :], hidden_states], dim=1)
    return kept.detach()


class AdaptiveSpanOriginalPreTrainedModel(TxvPreTrainedModel):
    config_class = AdaptiveSpanOriginalConfig
    base_model_prefix = "model"
    _no_split_modules = ["AdaptiveSpanOriginalLayer"]
    _supports_sdpa = False  # the soft mask multiplies the softmax output and renormalises (+1e-8), as the original
    auto_classes = {"AutoModel": "AdaptiveSpanOriginalModel", "AutoModelForCausalLM": "AdaptiveSpanOriginalForCausalLM"}
    head_key_patterns = (r"^lm_head\.",)

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, AdaptiveSpanOriginalModel):
            init.normal_(module.key_pe, 0.0, 1.0)  # torch.randn, as the original
        elif isinstance(module, AdaptiveSpanOriginalAttention) and module.persistent_size:
            init.normal_(module.persistent_key, 0.0, 1.0 / math.sqrt(module.head_dim))
            init.normal_(module.persistent_value, 0.0, 1.0 / math.sqrt(module.persistent_size))
        elif isinstance(module, AdaptiveSpan):
            init.constant_(module.current_val, module.init)

    def clamp_spans_(self):
        """Keeps every span parameter inside [0, 1] (call after each optimiser step, as the original trainer does)."""
        for module in self.modules():
            if isinstance(module, AdaptiveSpan):
                module.clamp_()


def check_no_padding(attention_mask: torch.Tensor | None, batch: int, length: int):
    """The original model has no padding: every position is a real one (an all-ones mask, as generate() passes, is
    accepted)."""
    if attention_mask is None or torch.compiler.is_compiling():
        return
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
        raise ValueError(
            f"attention_mask must be [batch={batch}, >= {length}], got shape {tuple(attention_mask.shape)}"
        )
    if not bool(attention_mask.bool().all()):
        raise ValueError(
            "txv_adaptive_span_original has no padding (the original attends to every previous "
            "position): attention_mask must be all ones; group inputs of equal length instead"
        )


class AdaptiveSpanOriginalModel(AdaptiveSpanOriginalPreTrainedModel):
    """Token embeddings (`embed_tokens`), the shared position keys (`key_pe`) and the layers."""

    def __init__(self, config: AdaptiveSpanOriginalConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.emb_dropout = Dropout(config.emb_dropout)
        self.key_pe = nn.Parameter(torch.empty(1, config.head_dim, config.attn_span))
        self.layers = nn.ModuleList(AdaptiveSpanOriginalLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def cache_lengths(self) -> list[int]:
        """The number of positions each layer's cache keeps with the current spans."""
        return [layer.attn.span_lengths(layer.attn.spans())[1] for layer in self.layers]

    carries_memory = True  # the cache is a memory carried from one block to the next, as the original trains

    def initial_cache(self, batch_size: int, dtype=None, device=None) -> SpanCache:
        """The cache a first block starts with: zero vectors, `cache_lengths()[l]` for layer l (attended to)."""
        return SpanCache.zeros(
            self.cache_lengths(),
            batch_size,
            self.config.hidden_size,
            dtype or self.dtype,
            device or self.device,
            model_type=self.config.model_type,
        )

    @can_return_tuple
    @accepts_cache_names
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: SpanCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ):
        """
        input_ids `[batch, length]`, or inputs_embeds `[batch, length, hidden_size]`.
        attention_mask: all ones or None (the model has no padding).
        cache: the `SpanCache` returned with the previous block (None: the block starts from zero vectors, as the
            original's first block); a new one is returned with `use_cache`.
        """
        config = self.config
        if kwargs.get("output_attentions"):
            raise ValueError(
                "output_attentions is not supported by txv_adaptive_span_original (its attention weights "
                "cover each query's own window of previous positions, not the sequence)"
            )
        _, output_hidden_states = self.output_flags(None, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        inputs_embeds = embed_inputs(input_ids, inputs_embeds, self.embed_tokens, config.vocab_size, config.hidden_size)
        check_no_padding(attention_mask, *inputs_embeds.shape[:2])
        if cache is not None:
            if not isinstance(cache, SpanCache):
                raise ValueError(f"cache must be the SpanCache returned by this model, got {type(cache).__name__}")
            cache.check_compatible(
                batch_size=inputs_embeds.shape[0],
                hidden_size=config.hidden_size,
                num_layers=config.num_hidden_layers,
                model_type=config.model_type,
            )
        hidden_states = self.emb_dropout(inputs_embeds)
        states = cache.states if cache is not None and cache.states is not None else [None] * len(self.layers)
        new_states, layer_inputs, penalty = [], [], None
        for layer, state in zip(self.layers, states):
            spans = layer.attn.spans()
            span_length, cache_length = layer.attn.span_lengths(spans)
            if state is None:  # a first block: its cache holds zero vectors (attended to)
                state = hidden_states.new_zeros(hidden_states.shape[0], cache_length, config.hidden_size)
            if use_cache:
                new_states.append(next_cache_state(state, hidden_states, cache_length))
            layer_inputs.append(hidden_states)
            context = previous_positions(state, span_length, hidden_states)
            hidden_states = layer(hidden_states, context, self.key_pe, spans)
            if spans is not None:
                penalty = layer.attn.adaptive_span.penalty(spans) + (0 if penalty is None else penalty)
        hidden_states = self.emb_dropout(hidden_states)
        new_cache = None
        if use_cache:
            new_cache = cache if cache is not None else SpanCache(len(self.layers), model_type=config.model_type)
            new_cache.set_states(new_states)
            new_cache.seen_tokens += hidden_states.shape[1]
        return AdaptiveSpanOriginalModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(layer_inputs) + (hidden_states,) if output_hidden_states else None,
            span_penalty=penalty,
            **cache_field(new_cache),
        )


class AdaptiveSpanOriginalForCausalLM(AdaptiveSpanOriginalPreTrainedModel, GenerationMixin):
    """The language model: `lm_head` (with bias, not tied: the original's `out_emb`) over the base model. The cache is
    kept across `generate()` steps (one token per step)."""

    _is_stateful = True  # the cache keeps only what the spans need: it cannot be rolled back

    def __init__(self, config: AdaptiveSpanOriginalConfig):
        super().__init__(config)
        self.model = AdaptiveSpanOriginalModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    carries_memory = True

    def initial_cache(self, batch_size: int, dtype=None, device=None) -> SpanCache:
        return self.model.initial_cache(batch_size, dtype, device)

    @accepts_cache_names
    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, cache=None, **kwargs):
        if cache is None:
            next_sequence_length = None  # no cache yet: the whole prompt
        return super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, **cache_field(cache), **kwargs
        )

    @can_return_tuple
    @accepts_cache_names
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: SpanCache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ):
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored.
        shift_labels (keyword): targets already shifted (position t predicts shift_labels[t]), used instead of labels
            (the original's evaluation gives the block's next tokens so, including the one after the block).
        The span penalty is added to the loss with `config.adapt_span_loss` (lm_loss and span_penalty also returned).
        """
        shift_labels = kwargs.pop("shift_labels", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
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
        loss = with_span_penalty(lm_loss, outputs.span_penalty, self.config.adapt_span_loss)
        return AdaptiveSpanOriginalCausalLMOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            lm_loss=lm_loss,
            span_penalty=outputs.span_penalty,
            **cache_field(output_cache(outputs)),
        )


__all__ = [
    "AdaptiveSpanOriginalPreTrainedModel",
    "AdaptiveSpanOriginalModel",
    "AdaptiveSpanOriginalForCausalLM",
    "AdaptiveSpanOriginalModelOutput",
    "AdaptiveSpanOriginalCausalLMOutput",
]
