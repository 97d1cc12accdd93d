"""R-Transformer configuration (Wang, Wang, Ji and Liu 2019, "R-Transformer: Recurrent Neural Network Enhanced
Transformer"): LocalRNN + multi-head self-attention + feed-forward blocks, no position embeddings."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvTransformerConfig
from .txv_config_checks import check_choice, check_non_negative, check_positive, check_probabilities


@strict
class RTransformerConfig(TxvTransformerConfig):
    r"""
    The standard fields and the papers' names for them are `TxvTransformerConfig`'s; the original code's names
    are also accepted (`h`, `n_level`, `ksize`, `n`, `d_ff`, `emb_dropout`).

    Args:
        vocab_size, hidden_size (`d_model`), num_attention_heads (`h`), head_dim (default hidden_size // heads).
        num_hidden_layers (`n_level`): number of blocks. Each block: `num_rnn_layers` LocalRNN sub-layers (`n`),
            a causal multi-head self-attention sub-layer and a feed-forward sub-layer, each as
            x + dropout(sublayer(LayerNorm(x))) (the original code).
        layer_norm_type: "annotated" (the original code's LayerNorm: unbiased std, eps added to the std) or
            "standard" (`nn.LayerNorm`). final_layer_norm: a LayerNorm after the last block (the original has none).
        output_bias: a bias in the (tied) output layer (the original's `decoder` Linear has one).
        rnn_type: "GRU", "LSTM" or "RNN". local_window (`ksize`): the LocalRNN window k.
        intermediate_size (`d_ff`, default 4 * hidden_size).
        dropout, embedding_dropout (original `emb_dropout`), attention_dropout, layer_norm_eps, initializer_range.
    """

    model_type = "txv_r_transformer"
    attribute_map = TxvTransformerConfig.attribute_map | {
        "h": "num_attention_heads",
        "n_level": "num_hidden_layers",
        "ksize": "local_window",
        "n": "num_rnn_layers",
        "d_ff": "intermediate_size",
        "emb_dropout": "embedding_dropout",
    }

    vocab_size: int = 10000
    hidden_size: int = 256
    num_hidden_layers: int = 3
    num_rnn_layers: int = 1
    intermediate_size: int | None = None
    rnn_type: str = "GRU"
    local_window: int = 7
    embedding_dropout: float | int = 0.1
    attention_dropout: float | int = 0.1
    layer_norm_eps: float = 1e-6
    layer_norm_type: str = "annotated"
    final_layer_norm: bool = False
    output_bias: bool = True
    classifier_dropout: float | int | None = None

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "local_window")
        check_non_negative(self, "num_rnn_layers")
        check_choice(self, "rnn_type", ("GRU", "LSTM", "RNN"))
        check_choice(self, "layer_norm_type", ("standard", "annotated"))
        check_probabilities(self, "embedding_dropout", "classifier_dropout")


__all__ = ["RTransformerConfig"]
