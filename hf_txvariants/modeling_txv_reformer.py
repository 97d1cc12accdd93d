"""Reformer (Kitaev, Kaiser and Levskaya 2020, "Reformer: The Efficient Transformer"), as `txv_reformer`.

LSH self-attention with shared QK and chunked local self-attention (`txv_lsh`), reversible residual layers whose
backward pass recomputes activations (`txv_reversible`: memory flat in depth, exact gradients including dropout),
chunked feed-forward and axial position embeddings. Parameter names are those of transformers' ReformerModel, so its
checkpoints (`model_type` "reformer") load with `TxvReformerForCausalLM.from_pretrained` and reproduce its outputs
with the hash seed fixed. Inputs of any length are accepted, in training too: they are padded internally to a multiple
of the chunk lengths (padding is masked and hashed into its own bucket) and the outputs cut back.

The two residual streams (a, h) start as copies of the embeddings; each layer computes a = a + Attention(h),
h = h + FeedForward(a); the model's output is LayerNorm([a ; h]), of width 2 * hidden_size, as in the original.
"""

from __future__ import annotations


import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput, SequenceClassifierOutput

from .configuration_txv_reformer import TxvReformerConfig
from .txv_inputs import embed_inputs
from .txv_lsh import default_num_buckets, local_attention, lsh_attention
from .txv_modeling_utils import TxvModelMixin
from .txv_reversible import chunked_feed_forward, reversible_sequence
from .txv_sequence_classification import last_token_states, sequence_classification_loss


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
            grid = nn.functional.dropout2d(grid.permute(1, 0, 2)[None], p=self.dropout, training=True)[0].permute(1, 0, 2)
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
            TxvReformerAxialPositionEmbeddings(config) if config.axial_pos_embds else TxvReformerPositionEmbeddings(config)
        )

    def forward(self, inputs_embeds, position_ids):
        embeddings = nn.functional.dropout(inputs_embeds, p=self.dropout, training=self.training)
        return embeddings + self.position_embeddings(position_ids)


class TxvReformerLSHSelfAttention(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.config = config
        inner = config.num_attention_heads * config.attention_head_size
        self.query_key = nn.Linear(config.hidden_size, inner, bias=False)
        self.value = nn.Linear(config.hidden_size, inner, bias=False)

    def forward(self, hidden_states, key_valid=None):
        config, heads = self.config, self.config.num_attention_heads
        split = lambda x: x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)  # noqa: E731
        length = hidden_states.shape[1]
        num_buckets = config.num_buckets
        if num_buckets is None:
            num_buckets = default_num_buckets(length, config.lsh_attn_chunk_length, config.max_position_embeddings)
        return lsh_attention(
            split(self.query_key(hidden_states)),
            split(self.value(hidden_states)),
            config.num_hashes,
            num_buckets,
            config.lsh_attn_chunk_length,
            config.lsh_num_chunks_before,
            config.lsh_num_chunks_after,
            config.is_decoder,
            key_valid,
            config.hash_seed,
            config.lsh_attention_probs_dropout_prob,
            self.training,
        )


class TxvReformerLocalSelfAttention(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.config = config
        inner = config.num_attention_heads * config.attention_head_size
        self.query = nn.Linear(config.hidden_size, inner, bias=False)
        self.key = nn.Linear(config.hidden_size, inner, bias=False)
        self.value = nn.Linear(config.hidden_size, inner, bias=False)

    def forward(self, hidden_states, key_valid=None):
        config, heads = self.config, self.config.num_attention_heads
        split = lambda x: x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)  # noqa: E731
        return local_attention(
            split(self.query(hidden_states)),
            split(self.key(hidden_states)),
            split(self.value(hidden_states)),
            config.local_attn_chunk_length,
            config.local_num_chunks_before,
            config.local_num_chunks_after,
            config.is_decoder,
            key_valid,
            config.local_attention_probs_dropout_prob,
            self.training,
        )


class TxvReformerSelfOutput(nn.Module):
    def __init__(self, config: TxvReformerConfig):
        super().__init__()
        self.dropout = config.hidden_dropout_prob
        self.dense = nn.Linear(config.num_attention_heads * config.attention_head_size, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        return nn.functional.dropout(self.dense(hidden_states), p=self.dropout, training=self.training)


class TxvReformerAttention(nn.Module):
    """F of the reversible block: LayerNorm, LSH or local self-attention, output projection, dropout."""

    def __init__(self, config: TxvReformerConfig, kind: str):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attention = (
            TxvReformerLSHSelfAttention(config) if kind == "lsh" else TxvReformerLocalSelfAttention(config)
        )
        self.output = TxvReformerSelfOutput(config)

    def forward(self, hidden_states, key_valid=None):
        output = self.self_attention(self.layer_norm(hidden_states), key_valid)  # [B, H, L, D]
        output = output.transpose(1, 2).reshape(hidden_states.shape[0], hidden_states.shape[1], -1)
        return self.output(output)


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
        self.attention = TxvReformerAttention(config, config.attn_layers[layer_idx])
        self.feed_forward = TxvReformerFeedForward(config)

    def forward(self, attn_stream, hidden_stream, key_valid=None):
        attn_stream = attn_stream + self.attention(hidden_stream, key_valid)
        hidden_stream = hidden_stream + self.feed_forward(attn_stream)
        return attn_stream, hidden_stream


class TxvReformerPreTrainedModel(TxvModelMixin, PreTrainedModel):
    config_class = TxvReformerConfig
    base_model_prefix = "reformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TxvReformerLayer"]
    _supports_sdpa = False  # LSH and chunked attention are not dense attentions
    _supports_flash_attn = False
    _supports_flex_attn = False
    auto_classes = {
        "AutoModel": "TxvReformerModel",
        "AutoModelForCausalLM": "TxvReformerForCausalLM",
        "AutoModelForSequenceClassification": "TxvReformerForSequenceClassification",
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
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.ParameterList):  # the axial position embeddings' `weights`
            for weight in module:
                init.normal_(weight, 0.0, self.config.axial_norm_std)


class TxvReformerModel(TxvReformerPreTrainedModel):
    def __init__(self, config: TxvReformerConfig):
        super().__init__(config)
        self.embeddings = TxvReformerEmbeddings(config)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(TxvReformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.encoder.layer_norm = nn.LayerNorm(2 * config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, new_embeddings):
        self.embeddings.word_embeddings = new_embeddings

    def _padding_length(self, length: int) -> int:
        """transformers' rule: pad to a multiple of the chunk lengths' lcm when longer than the smallest chunk."""
        config = self.config
        smallest = min({"lsh": config.lsh_attn_chunk_length, "local": config.local_attn_chunk_length}[k] for k in config.attn_layers)
        multiple = config.chunk_multiple
        if length % multiple == 0 or length <= smallest:
            return 0
        return multiple - length % multiple

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutput | tuple:
        """attention_mask: `[batch, length]`, 1 for tokens, 0 for padding. Returns `last_hidden_state` of width
        2 * hidden_size. `past_key_values` / `use_cache` are accepted and ignored: every call recomputes the whole
        sequence (LSH buckets depend on all positions). `output_attentions` gives no weights (LSH has none dense)."""
        config = self.config
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        return_dict = return_dict if return_dict is not None else config.return_dict
        inputs_embeds = embed_inputs(
            input_ids, inputs_embeds, self.embeddings.word_embeddings, config.vocab_size, config.hidden_size
        )
        batch, length = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        if attention_mask is not None and attention_mask.shape != (batch, length):
            raise ValueError(f"attention_mask must be [batch={batch}, length={length}], got {tuple(attention_mask.shape)}")
        key_valid = attention_mask.to(device=device, dtype=torch.bool) if attention_mask is not None else None

        padding = self._padding_length(length)
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
            position_ids = torch.cat([position_ids, position_ids[:, -1:] + torch.arange(1, padding + 1, device=device)], 1)
        hidden = self.embeddings(inputs_embeds, position_ids)

        attn_stream, hidden_stream = hidden, hidden
        layers = self.encoder.layers
        all_hidden = []
        if config.reversible and not output_hidden_states and not (self.gradient_checkpointing and self.training):
            blocks = [
                (lambda x, layer=layer: layer.attention(x, key_valid), layer.feed_forward) for layer in layers
            ]
            attn_stream, hidden_stream = reversible_sequence(
                attn_stream, hidden_stream, blocks, [p for p in layers.parameters()]
            )
        else:
            for layer in layers:
                all_hidden.append(hidden_stream)
                attn_stream, hidden_stream = layer(attn_stream, hidden_stream, key_valid)
            all_hidden.append(hidden_stream)
        output = self.encoder.layer_norm(torch.cat([attn_stream, hidden_stream], dim=-1))
        output = nn.functional.dropout(output, p=config.hidden_dropout_prob, training=self.training)[:, :length]
        result = BaseModelOutput(
            last_hidden_state=output,
            hidden_states=tuple(h[:, :length] for h in all_hidden) if output_hidden_states else None,
        )
        return result if return_dict else result.to_tuple()


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
        super().__init__(config)
        if not config.is_decoder:
            raise ValueError("is_decoder must be True for TxvReformerForCausalLM (causal attention)")
        self.reformer = TxvReformerModel(config)
        self.lm_head = TxvReformerLMHead(config)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # no key/value cache: generation recomputes the sequence

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.LongTensor | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutput | tuple:
        """labels: `[batch, length]`, shifted inside (position t predicts labels[t + 1]); -100 is ignored."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.reformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            position_ids=position_ids,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            if labels.shape != outputs.last_hidden_state.shape[:2]:
                raise ValueError(
                    f"labels must have shape {tuple(outputs.last_hidden_state.shape[:2])}, got {tuple(labels.shape)}"
                )
            loss = self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        output = CausalLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return output if return_dict else output.to_tuple()


class TxvReformerForSequenceClassification(TxvReformerPreTrainedModel):
    """A linear classifier on the (2 * hidden_size wide) state of the last real token of each row. Not the head of
    transformers' ReformerForSequenceClassification (first token, non-causal), whose weights do not load here."""

    def __init__(self, config: TxvReformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.reformer = TxvReformerModel(config)
        self.score = nn.Linear(2 * config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.reformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        pooled = last_token_states(hidden_states, input_ids, attention_mask, self.config.pad_token_id)
        logits = self.score(pooled)
        loss = sequence_classification_loss(self.config, logits, labels) if labels is not None else None
        output = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return output if return_dict else output.to_tuple()


__all__ = [
    "TxvReformerPreTrainedModel",
    "TxvReformerModel",
    "TxvReformerForCausalLM",
    "TxvReformerForSequenceClassification",
]
