"""The base classes of the variants' configs: the fields they share, declared once, the papers' names for them, the
construction sequence and the standard checks.

A variant's config is a `@strict` subclass that re-declares only the shared fields whose default it changes, adds
its own fields, and extends `derive_defaults` / `validate_architecture` with its own steps (calling `super()` first).
Construction runs: the papers' names (`attribute_map`) -> `derive_defaults` (defaults that depend on other fields) ->
transformers' post-init -> `validate_architecture` (a wrong config is a ValueError naming the field)."""

from __future__ import annotations

from transformers.configuration_utils import PreTrainedConfig

from .txv_compat import CACHE_OUTPUT_KEYS
from .txv_config_checks import apply_paper_names, check_positive, check_probabilities, default_head_dim

# The papers' and the original code's names of the standard fields, accepted by every Transformer variant.
PAPER_NAMES = {
    "d_model": "hidden_size",
    "n_head": "num_attention_heads",
    "d_head": "head_dim",
    "d_inner": "intermediate_size",
    "n_layer": "num_hidden_layers",
    "dropatt": "attention_dropout",
}


class TxvConfig(PreTrainedConfig):
    """The fields of every variant: a vocabulary, a width, the initialisation std, the cache switch, tied embeddings
    and the special token ids."""

    vocab_size: int = 256
    hidden_size: int = 512
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        # Names from attribute_map are applied first: the derived defaults read the standard fields.
        apply_paper_names(self, kwargs)
        self.derive_defaults(kwargs)
        super().__post_init__(**kwargs)
        # Raised here so that the caller gets the ValueError itself (strict's validate() wraps it in its own type).
        self.validate_architecture()

    def derive_defaults(self, kwargs: dict):
        """Fills the fields whose default depends on other fields; reads (and pops from `kwargs`) the legacy keyword
        arguments that are not fields. Runs before transformers' own post-init."""

    def validate_architecture(self):
        """Called at construction: a wrong config is a ValueError naming the field."""
        check_positive(self, "vocab_size", "hidden_size")


class TxvTransformerConfig(TxvConfig):
    """A stack of attention layers: the standard names of transformers (`num_hidden_layers`, `num_attention_heads`,
    `head_dim`, `intermediate_size`, `dropout`, `attention_dropout`, `layer_norm_eps`) with the papers' names
    (`d_model`, `n_head`, `d_head`, `d_inner`, `n_layer`, `dropatt`) accepted through `attribute_map`. `head_dim`
    defaults to hidden_size // num_attention_heads; where a variant declares `intermediate_size: int | None = None`,
    None means 4 * hidden_size."""

    attribute_map = dict(PAPER_NAMES)

    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    layer_norm_eps: float = 1e-5

    def derive_defaults(self, kwargs: dict):
        super().derive_defaults(kwargs)
        default_head_dim(self)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size

    def validate_architecture(self):
        check_positive(
            self,
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "head_dim",
            "intermediate_size",
        )
        check_probabilities(self, "dropout", "attention_dropout")


class TxvEncoderOrDecoderConfig(TxvTransformerConfig):
    """A stack that is a causal decoder (the default: the language model), a bidirectional encoder
    (`is_decoder=False`: masked-LM and classification heads, the encoder of an `EncoderDecoderModel`) or, with
    `add_cross_attention`, the decoder of an `EncoderDecoderModel`. `scale_embedding` multiplies the token embeddings
    by sqrt(hidden_size); `pre_lnorm` puts the layer norm on each sub-layer's input (plus a final norm) instead of
    after the residual; `classifier_dropout` is the sequence-classification head's dropout (None: none)."""

    keys_to_ignore_at_inference = CACHE_OUTPUT_KEYS

    scale_embedding: bool = False
    pre_lnorm: bool = False
    is_decoder: bool = True
    add_cross_attention: bool = False
    classifier_dropout: float | int | None = None

    def validate_architecture(self):
        super().validate_architecture()
        check_probabilities(self, "classifier_dropout")
        if self.add_cross_attention and not self.is_decoder:
            raise ValueError("add_cross_attention=True needs is_decoder=True (cross-attention is a decoder sub-layer)")


__all__ = ["PAPER_NAMES", "TxvConfig", "TxvEncoderOrDecoderConfig", "TxvTransformerConfig"]
