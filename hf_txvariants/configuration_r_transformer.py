"""R-Transformer configuration (Wang, Wang, Ji and Liu 2019, "R-Transformer: Recurrent Neural Network Enhanced
Transformer"): LocalRNN + multi-head self-attention + feed-forward blocks, no position embeddings."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers.configuration_utils import PreTrainedConfig

from .txv_config_checks import apply_paper_names, check_positive, check_probabilities, default_head_dim


@strict
class RTransformerConfig(PreTrainedConfig):
    r"""
    Standard names are stored; the original code's names are accepted through `attribute_map`
    (`d_model`, `h`, `n_level`, `ksize`, `n`, `d_ff`, plus `n_head`, `n_layer`, `d_inner`, `dropatt`).

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
    attribute_map = {
        "d_model": "hidden_size",
        "h": "num_attention_heads",
        "n_head": "num_attention_heads",
        "n_level": "num_hidden_layers",
        "n_layer": "num_hidden_layers",
        "ksize": "local_window",
        "n": "num_rnn_layers",
        "d_ff": "intermediate_size",
        "d_inner": "intermediate_size",
        "dropatt": "attention_dropout",
        "emb_dropout": "embedding_dropout",
    }

    vocab_size: int = 10000
    hidden_size: int = 256
    num_hidden_layers: int = 3
    num_rnn_layers: int = 1
    num_attention_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int | None = None
    rnn_type: str = "GRU"
    local_window: int = 7
    dropout: float | int = 0.1
    embedding_dropout: float | int = 0.1
    attention_dropout: float | int = 0.1
    layer_norm_eps: float = 1e-6
    layer_norm_type: str = "annotated"
    final_layer_norm: bool = False
    output_bias: bool = True
    initializer_range: float = 0.02
    classifier_dropout: float | int | None = None
    use_cache: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        apply_paper_names(self, kwargs)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        default_head_dim(self)
        super().__post_init__(**kwargs)
        self.validate_architecture()

    def validate_architecture(self):
        """Called at construction: a wrong config is a ValueError naming the field."""
        check_positive(
            self,
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "intermediate_size",
            "local_window",
        )
        if self.num_rnn_layers < 0:
            raise ValueError(f"num_rnn_layers must be >= 0, got {self.num_rnn_layers}")
        if self.rnn_type not in ("GRU", "LSTM", "RNN"):
            raise ValueError(f"rnn_type must be 'GRU', 'LSTM' or 'RNN', got {self.rnn_type!r}")
        if self.layer_norm_type not in ("standard", "annotated"):
            raise ValueError(f"layer_norm_type must be 'standard' or 'annotated', got {self.layer_norm_type!r}")
        check_probabilities(self, "dropout", "embedding_dropout", "attention_dropout", "classifier_dropout")


__all__ = ["RTransformerConfig"]
