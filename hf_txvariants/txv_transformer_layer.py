"""The Transformer layer of Vaswani et al. (2017): self-attention, optional cross-attention, feed-forward; each
sub-layer with dropout on its output, a residual connection and layer norm (after the residual, or on the sub-layer
input with `pre_lnorm`). The self-attention module is passed in, so absolute (vanilla) and relation-aware (Shaw)
attention share the layer."""

from __future__ import annotations

from torch import nn

from .txv_compat import GradientCheckpointingLayer
from .txv_feedforward import PositionwiseFeedForward
from .txv_mha import MultiHeadAttention


class TransformerLayer(GradientCheckpointingLayer):
    def __init__(self, config, self_attention: nn.Module, layer_idx: int):
        super().__init__()
        self.pre_lnorm = config.pre_lnorm
        self.self_attn = self_attention
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if config.add_cross_attention:
            self.cross_attn = MultiHeadAttention(config, layer_idx, is_cross_attention=True)
            self.cross_attn_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        else:
            self.cross_attn = None
        self.mlp = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def _sublayer(self, hidden_states, norm, function):
        if self.pre_lnorm:
            output, weights = function(norm(hidden_states))
            return hidden_states + self.dropout(output), weights
        output, weights = function(hidden_states)
        return norm(hidden_states + self.dropout(output)), weights

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        output_attentions=False,
    ):
        """Returns `(hidden_states, self_attention_weights, cross_attention_weights)` (weights None unless asked)."""
        hidden_states, self_weights = self._sublayer(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask, cache=cache, output_attentions=output_attentions),
        )
        cross_weights = None
        if self.cross_attn is not None and encoder_hidden_states is not None:
            hidden_states, cross_weights = self._sublayer(
                hidden_states,
                self.cross_attn_layer_norm,
                lambda x: self.cross_attn(
                    x,
                    encoder_attention_mask,
                    key_value_states=encoder_hidden_states,
                    cache=cache,
                    output_attentions=output_attentions,
                ),
            )
        if self.pre_lnorm:
            hidden_states = hidden_states + self.mlp(self.final_layer_norm(hidden_states))
        else:
            hidden_states = self.final_layer_norm(hidden_states + self.mlp(hidden_states))
        return hidden_states, self_weights, cross_weights
