"""Transformer-XL (Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context").

Segment-level recurrence (the memory is carried as the cache, a `MemoryCache`), relative positional
attention, adaptive input embeddings and a projected adaptive softmax. Parameter names are those of transformers'
legacy TransfoXL (removed in transformers 5), so its checkpoints load unchanged and reproduce its outputs.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationMixin
from transformers import initialization as init
from transformers.modeling_outputs import ModelOutput

from .configuration_transfo_xl import TransfoXLConfig
from .txv_adaptive_softmax import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, ProjectionList
from .txv_compat import model_output, output_cache
from .txv_heads import SequenceClassificationHeadMixin
from .txv_pretrained import TxvPreTrainedModel
from .txv_relative_attention import RelativePositionAttention
from .txv_xl import XLBackboneMixin, XLLayer, XLSpanMethodsMixin, init_mechanism_weights
from .txv_xl_memory import MemoryCache
from .txv_xl_model import (
    MemoryGenerationMixin,
    NormedFeedForward,
    NormedRelativeAttention,
    XLCausalLMHeadMixin,
    XLModelMixin,
)


@model_output
class TransfoXLModelOutput(ModelOutput):
    """`cache` is the memory for the next segment; `mems` gives it in the legacy time-major layout."""

    last_hidden_state: torch.FloatTensor | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    span_penalty: torch.FloatTensor | None = None  # with adaptive span: sum over layers of the mean span

    @property
    def mems(self) -> list[torch.Tensor] | None:
        memory = output_cache(self)
        return None if memory is None else memory.to_legacy_mems()


@model_output
class TransfoXLLMHeadModelOutput(ModelOutput):
    """`logits` are log-probabilities (the adaptive softmax is normalised); `losses` are the per-token negative
    log-likelihoods `[batch, length - 1]` in position order (0 where the label is -100; `[batch, length]` with
    `shift_labels`); `loss` is their mean (plus `adapt_span_loss * span_penalty` with adaptive span); `lm_loss` is
    that mean alone (the next-token part), `span_penalty` the adaptive span's penalty (None without adaptive span)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    lm_loss: torch.FloatTensor | None = None
    span_penalty: torch.FloatTensor | None = None

    @property
    def prediction_scores(self) -> torch.FloatTensor | None:
        return self.logits

    @property
    def mems(self) -> list[torch.Tensor] | None:
        memory = output_cache(self)
        return None if memory is None else memory.to_legacy_mems()


class TransfoXLAttention(NormedRelativeAttention):
    """`dec_attn`: relative attention and its layer norm (applied after the residual, or on the input of the
    sub-layer with `pre_lnorm`; with pre-norm the memory is normalised together with the segment)."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config, own_biases=config.untie_r)


class TransfoXLFeedForward(NormedFeedForward):
    """`pos_ff`: the position-wise feed-forward network and its layer norm."""


class TransfoXLLayer(XLLayer):
    part_paths = {
        "attention": "dec_attn",
        "attention_norm": "dec_attn.layer_norm",
        "feed_forward": "pos_ff",
        "feed_forward_norm": "pos_ff.layer_norm",
        "adaptive_span": "dec_attn.adaptive_span",
    }

    def __init__(self, config: TransfoXLConfig):
        super().__init__()
        self.dec_attn = TransfoXLAttention(config)
        self.pos_ff = TransfoXLFeedForward(config)
        self.add_mechanisms(config)


class TransfoXLPreTrainedModel(XLSpanMethodsMixin, TxvPreTrainedModel):
    config_class = TransfoXLConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["TransfoXLLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True  # Transformer-XL's relative attention through FlexAttention (txv_relative_attention)
    # Saved by the legacy model but not parameters here: the sinusoid frequencies (recomputed) and, with shared
    # u/v biases (untie_r=False), the per-layer copies of the shared `transformer.r_w_bias` / `r_r_bias`.
    _keys_to_ignore_on_load_unexpected = [r"pos_emb\.inv_freq", r"layers\.\d+\.dec_attn\.r_[wr]_bias"]
    auto_classes = {
        "AutoModel": "TransfoXLModel",
        "AutoModelForCausalLM": "TransfoXLLMHeadModel",
        "AutoModelForSequenceClassification": "TransfoXLForSequenceClassification",
    }
    head_key_patterns = (r"^crit\.", r"^score\.")

    def _init_weight(self, weight):
        if self.config.init == "uniform":
            init.uniform_(weight, -self.config.init_range, self.config.init_range)
        else:
            init.normal_(weight, 0.0, self.config.initializer_range)

    def _init_weights(self, module):
        """The original initialisation (the `init`, `init_range`, `init_std` and `proj_init_std` fields)."""
        if isinstance(module, nn.Linear):
            self._init_weight(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            self._init_weight(module.weight)
        elif isinstance(module, nn.LayerNorm):
            init.normal_(module.weight, 1.0, self.config.initializer_range)
            init.zeros_(module.bias)
        elif isinstance(module, ProjectionList):
            for projection in module:
                init.normal_(projection, 0.0, self.config.proj_init_std)
        elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
            self._init_weight(module.cluster_weight)
            init.zeros_(module.cluster_bias)
        if isinstance(module, (RelativePositionAttention, TransfoXLModel)) and hasattr(module, "r_w_bias"):
            self._init_weight(module.r_w_bias)
            self._init_weight(module.r_r_bias)
        init_mechanism_weights(module, self.config.initializer_range)

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resizes the vocabulary of a model with one softmax cluster (`cutoffs=[]`): the input embedding and the LM
        head's softmax keep the rows of the tokens that stay, new rows get the model's initialisation (the
        `init`/`init_std` fields; `mean_resizing` is not used), and the tying is re-applied. With cutoffs the
        vocabulary is split into frequency clusters whose boundaries would have to move: a ValueError says so."""
        if new_num_tokens is None:
            return self.get_input_embeddings()
        if pad_to_multiple_of is not None:
            new_num_tokens = -(-new_num_tokens // pad_to_multiple_of) * pad_to_multiple_of
        config = self.config
        if config.cutoffs:
            raise ValueError(
                f"resize_token_embeddings needs cutoffs=[] (one softmax cluster), this model has cutoffs="
                f"{list(config.cutoffs)}: its adaptive embedding and softmax split the vocabulary into frequency "
                "clusters whose boundaries would move; build a new config with the new vocab_size and cutoffs instead"
            )
        if isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int) or new_num_tokens <= 0:
            raise ValueError(f"new_num_tokens must be a positive integer, got {new_num_tokens!r}")
        sizes = (new_num_tokens, config.d_embed, config.hidden_size, [], config.div_val)
        base = self.base_model
        base.word_emb = self._resized_copy(base.word_emb, AdaptiveEmbedding(*sizes))
        if hasattr(self, "crit"):
            self.crit = self._resized_copy(self.crit, ProjectedAdaptiveLogSoftmax(*sizes))
        config.vocab_size = new_num_tokens
        self.tie_weights()
        return base.word_emb

    def _resized_copy(self, old: nn.Module, new: nn.Module) -> nn.Module:
        """`new` initialised like this model, then given the tensors of `old` (the rows both vocabularies share)."""
        reference = next(old.parameters())
        new.to(device=reference.device, dtype=reference.dtype)
        new.apply(self._init_weights)
        with torch.no_grad():
            new_state = new.state_dict()
            for name, tensor in old.state_dict().items():
                rows = min(tensor.shape[0], new_state[name].shape[0])
                new_state[name][:rows] = tensor[:rows]
        return new


class TransfoXLModel(XLModelMixin, XLBackboneMixin, TransfoXLPreTrainedModel):
    _input_embed_layer = "word_emb"
    output_class = TransfoXLModelOutput

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        self.word_emb = AdaptiveEmbedding(
            config.vocab_size, config.d_embed, config.hidden_size, config.cutoffs, config.div_val
        )
        if not config.untie_r:
            self.r_w_bias = nn.Parameter(torch.zeros(config.num_attention_heads, config.head_dim))
            self.r_r_bias = nn.Parameter(torch.zeros(config.num_attention_heads, config.head_dim))
        self.build_stack(config, TransfoXLLayer)
        self.post_init()

    def backbone_inputs(self, cache, mems: list[torch.Tensor] | None = None, **kwargs):
        """mems: the legacy memory (a list of `[mem_len, batch, hidden]` tensors), instead of the cache."""
        config = self.config
        if mems is not None:
            if cache is not None:
                raise ValueError("Pass either the cache or the legacy mems, not both")
            cache = MemoryCache.from_legacy_mems(mems, config.mem_len, config.memory_init, config.model_type)
        return cache, {"shared_biases": None if config.untie_r else (self.r_w_bias, self.r_r_bias)}


class TransfoXLLMHeadModel(MemoryGenerationMixin, XLCausalLMHeadMixin, TransfoXLPreTrainedModel, GenerationMixin):
    """Transformer-XL with the projected adaptive softmax head (`crit`). Memory is kept across `generate()` steps, so
    each new token costs O(mem_len), and a left-padded batch generates the same tokens as each row alone.

    Besides the standard arguments: `mems`, the legacy memory (a list of `[mem_len, batch, hidden]` tensors, see
    `TransfoXLModel`), and `return_logits`: False skips the log-probabilities (with labels, the adaptive softmax then
    only evaluates the clusters of the targets, which is what makes it fast to train)."""

    backbone_class = TransfoXLModel
    output_class = TransfoXLLMHeadModelOutput

    def reset_memory_length(self, mem_len: int):
        """Changes how many positions are remembered (e.g. longer at evaluation, as in the paper)."""
        self.config.mem_len = mem_len


class TransfoXLForSequenceClassification(SequenceClassificationHeadMixin, TransfoXLPreTrainedModel):
    """Transformer-XL with a linear classifier on the hidden state of the last real token of each row; the legacy
    `mems` are passed to `TransfoXLModel`."""

    backbone_class = TransfoXLModel


__all__ = [
    "TransfoXLPreTrainedModel",
    "TransfoXLModel",
    "TransfoXLLMHeadModel",
    "TransfoXLForSequenceClassification",
    "TransfoXLModelOutput",
    "TransfoXLLMHeadModelOutput",
]
