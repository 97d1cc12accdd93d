"""The blocks of the XL family's backbone (Transformer-XL, Gated Transformer-XL, Adaptive Span), which each model
file's `forward_segment` runs (written once in `modeling_transfo_xl`, copied into the others). A forward pass over a
segment, whatever the variant:

    memory  = the cache (a `MemoryCache`), or the memory a first segment starts with (`config.memory_init`)
    allowed = causal over [memory; segment], within the attention window, without padding or masked memory slots
              (`allowed_keys`, `leading_padding_as_zero_memory`, `restrict_to_episodes`)
    R       = the sinusoid table of relative distances (Dai et al. 2019, section 3.3)
    h^0     = dropout(embeddings);  h^n = layer_n(h^{n-1}, memory_n, R, allowed)     (the variant's layer)
    memory_n <- the last mem_len of [memory_n; h^{n-1}] (stop-gradient)              (`MemoryCache.update_memories`)

The variants differ only in their configs, defaults, parameter names and heads. Two mechanisms are options of every
XL-family config, so they compose (a gated XL with adaptive span is a config, not a new file):

- the residual form (`gate_type`, `gate_bias`; Parisotto et al. 2020): "trxl" is the plain Transformer-XL block
  (layer norm after the residual, or on the sub-layer input with transfo-xl's `pre_lnorm`); every other type uses
  the identity map reordering, `E' = g(E, ReLU(MHA(LN([SG(M), E]))))`, `out = g(E', ReLU(FF(LN(E'))))`, with g the
  plain residual ("trxl_i") or a gate of `txv_gates` (`residual_form`).
- adaptive span (`adapt_span_enabled`, `attn_span`, `adapt_span_*`; Sukhbaatar et al. 2019): each head's soft span
  mask is an additive attention term (`txv_adaptive_span`, `build_adaptive_span`), the span penalty is returned, and
  with `adapt_span_cache` every layer attends only to the keys its spans can reach (`keep_last_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput

from .txv_adaptive_softmax import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, ProjectionList
from .txv_adaptive_span import AdaptiveSpan
from .txv_attention import causal_allowed
from .txv_compat import model_output
from .txv_feedforward import PositionwiseFeedForward
from .txv_gates import GatingLayer
from .txv_relative_attention import RelativePositionAttention
from .txv_xl_memory import MemoryCache


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


def init_xl_weights(module: nn.Module, std: float):
    """`_init_weights` for what the XL family adds to the standard modules: the u / v biases of the relative
    attention, the adaptive embedding / softmax projections and cluster logits (N(0, std)) and the mechanisms'
    parameters (gates, spans)."""
    if isinstance(module, RelativePositionAttention) and hasattr(module, "r_w_bias"):
        init.normal_(module.r_w_bias, 0.0, std)
        init.normal_(module.r_r_bias, 0.0, std)
    elif isinstance(module, ProjectionList):
        for projection in module:
            init.normal_(projection, 0.0, std)
    elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
        init.normal_(module.cluster_weight, 0.0, std)
        init.zeros_(module.cluster_bias)
    init_mechanism_weights(module, std)


def build_token_embeddings(config) -> nn.Module:
    """The input embeddings `embed_tokens`: the adaptive embedding with `config.adaptive`, else one table."""
    if config.adaptive:
        return AdaptiveEmbedding(config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val)
    return nn.Embedding(config.vocab_size, config.hidden_size)


class NormedRelativeAttention(RelativePositionAttention):
    """Relative attention holding the layer norm of its sub-layer (`layer_norm`), as transfo-xl's `dec_attn`."""

    def __init__(self, config, own_biases: bool = True):
        super().__init__(config, own_biases=own_biases)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class NormedFeedForward(PositionwiseFeedForward):
    """The position-wise feed-forward network holding the layer norm of its sub-layer (`layer_norm`)."""

    def __init__(self, config):
        super().__init__(config.hidden_size, config.intermediate_size, config.dropout)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


def allowed_keys(cache: MemoryCache, query_length: int, input_mask, device, window: int | None) -> torch.Tensor:
    """`[batch or 1, 1, Q, M + Q]` bool: causal over `[memory; segment]`, inside the window (`attention_window`),
    without padding (`input_mask [batch, Q]`, True = real) or masked memory slots (`MemoryCache.key_mask`)."""
    key_mask = cache.key_mask(input_mask, query_length)
    memory_length = cache.memory_length
    if query_length == 1 and (window is None or window > memory_length) and key_mask is not None:
        return key_mask[:, None, None, :]  # one query sees every key of [memory; itself]: the key mask only
    allowed = causal_allowed(query_length, memory_length, device, window)[None, None]
    return allowed if key_mask is None else allowed & key_mask[:, None, None, :]


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


@dataclass
class XLBackboneOutput:
    """What a model's `forward_segment` returns (to its `forward`, or to an RL body): the last hidden state (after
    dropout), the memory (updated when `use_cache`), the inputs of every layer, the attention weights, the summed span
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
    "NormedFeedForward",
    "NormedRelativeAttention",
    "XLBackboneOutput",
    "XLCausalLMOutput",
    "XLModelOutput",
    "allowed_keys",
    "build_adaptive_span",
    "build_final_norm",
    "build_token_embeddings",
    "init_mechanism_weights",
    "init_xl_weights",
    "is_all_real",
    "keep_last_memory",
    "leading_padding_as_zero_memory",
    "residual_form",
    "restrict_to_episodes",
]
