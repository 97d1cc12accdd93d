"""Vanilla Transformer configuration: absolute (sinusoidal or learned) positions (Vaswani et al. 2017) and the
auxiliary losses of Al-Rfou et al. (2019, "Character-Level Language Modeling with Deeper Self-Attention")."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvEncoderOrDecoderConfig
from .txv_config_checks import check_choice, check_even, check_non_negative, check_positive


@strict
class VanillaConfig(TxvEncoderOrDecoderConfig):
    r"""
    The standard fields and the papers' names for them are `TxvTransformerConfig`'s (and `n_positions` for
    `max_position_embeddings`); the encoder / decoder switches (`is_decoder`: False gives `VanillaForMaskedLM` and
    the encoder of an `EncoderDecoderModel`; `add_cross_attention`), `scale_embedding` (Vaswani et al.), `pre_lnorm`
    and `classifier_dropout` are `TxvEncoderOrDecoderConfig`'s.

    Args:
        position_embedding_type: "sinusoidal" (Vaswani et al., no parameters) or "learned" (Al-Rfou et al.: a
            learned vector per position, here added once at the input).
        per_layer_positions: Al-Rfou et al.'s learned positions added again at the input of every layer (each layer
            its own table); needs position_embedding_type="learned".
        max_position_embeddings: the longest sequence ("learned" cannot go further; "sinusoidal" is not limited).
        loss_on_all_positions: Al-Rfou's "multiple positions" loss: predict the next token at every position.
            False trains only the prediction at the last position of each row (the un-augmented baseline).
        intermediate_loss_weight: weight of Al-Rfou's intermediate-layer losses (0 disables them). Layer l < L
            (1-based) predicts the next token with the shared output layer; its loss counts until the training
            progress (`model.set_training_progress(p)`, p in [0, 1]) reaches l / (2 L), then is 0 (the paper).
        num_future_targets: Al-Rfou's "multiple targets": each position also predicts the tokens 2 .. n ahead,
            each with its own classifier; 1 disables them. future_target_loss_weight: their weight (paper: 0.5).
    """

    model_type = "txv_vanilla"
    attribute_map = TxvEncoderOrDecoderConfig.attribute_map | {"n_positions": "max_position_embeddings"}

    position_embedding_type: str = "learned"
    max_position_embeddings: int = 512
    per_layer_positions: bool = False
    loss_on_all_positions: bool = True
    intermediate_loss_weight: float | int = 0.0
    num_future_targets: int = 1
    future_target_loss_weight: float | int = 0.5

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "max_position_embeddings", "num_future_targets")
        check_choice(self, "position_embedding_type", ("sinusoidal", "learned"))
        if self.position_embedding_type == "sinusoidal":
            check_even(self, "hidden_size", "sinusoidal positions")
        if self.per_layer_positions and self.position_embedding_type != "learned":
            raise ValueError("per_layer_positions=True needs position_embedding_type='learned'")
        check_non_negative(self, "intermediate_loss_weight", "future_target_loss_weight")


__all__ = ["VanillaConfig"]
