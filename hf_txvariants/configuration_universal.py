"""Universal Transformer configuration (Dehghani et al. 2019). model_type `txv_universal`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvTransformerConfig
from .txv_config_checks import check_act_fields, check_choice, check_even, read_act_epsilon

LAYER_NORM_POSITIONS = ("pre", "post")
TRANSITIONS = ("feed_forward", "separable_conv")


@strict
class UniversalTransformerConfig(TxvTransformerConfig):
    r"""
    One shared layer (self-attention, optional cross-attention, transition) applied recurrently over depth.

    Standard names are stored; the papers' names are accepted through `attribute_map` (`d_model`, `n_head`,
    `d_head`, `d_inner`, `dropatt`, `max_steps` = `num_hidden_layers`, `act_epsilon` is stored as `act_threshold`).

    Args:
        vocab_size, hidden_size (`d_model`), num_attention_heads (`n_head`), head_dim (`d_head`),
        intermediate_size (`d_inner`).
        num_hidden_layers (`max_steps`): the number of recurrent steps (fixed-steps mode) or the largest number of
            ACT steps a position may take.
        use_act: per-position Adaptive Computation Time; False gives the fixed-steps model, which equals a stack
            of `num_hidden_layers` weight-tied layers.
        act_threshold: 1 - epsilon (tensor2tensor: epsilon = 0.01). act_loss_weight: weight of the ponder cost in
            the loss (tensor2tensor's `act_loss_weight`, 0.001). halting_bias_init: initial bias of the halting unit.
        is_decoder: causal self-attention in `UniversalTransformerModel` (the LM head is always causal, the MLM and
            classification heads never). add_cross_attention: a cross-attention sub-layer over
            `encoder_hidden_states` (set by `EncoderDecoderModel`).
        layer_norm_position: where the layer norms sit.
            "pre" (the default, the behaviour of earlier releases): x + SubLayer(LN(x)) for every sub-layer, the
            position/timestep signal stays in the residual stream, and a final layer norm follows the last step.
            "post" (the paper): "A^t = LayerNorm((H^{t-1} + P^t) + MultiHeadSelfAttention(H^{t-1} + P^t)),
            H^t = LayerNorm(A^t + Transition(A^t))" (Dehghani et al. 2019, section 2.1, eq. 4-5); no final layer
            norm (H^T is the output).
        transition: the position-wise function of the layer. "feed_forward" (the default): "a fully-connected neural
            network that consists of a single rectified-linear activation function between two affine
            transformations, applied position-wise". "separable_conv": "a separable convolution (Chollet, 2016)"
            (the paper, section 2.1), as tensor2tensor's `sepconv_relu_sepconv`: depthwise-separable convolution to
            `intermediate_size`, ReLU, dropout, depthwise-separable convolution back to `hidden_size`, with the
            kernel sizes `separable_conv_kernel_sizes` (tensor2tensor's Universal Transformer: 3 and 5). Causal
            models pad on the left (a position reads itself and the positions before it), bidirectional ones on
            both sides ("SAME"); padding positions are zeroed before each convolution. The convolution mixes
            neighbouring positions, so a causal model with it keeps no `UniversalStepCache` (`generate()` feeds
            the whole sequence at every token).
        separable_conv_kernel_sizes: the two kernel sizes of the separable-convolution transition.
        scale_embedding: token embeddings are multiplied by sqrt(hidden_size) (tensor2tensor's symbol modality).
        dropout, attention_dropout (`dropatt`), layer_norm_eps, initializer_range.
        use_cache: causal forward passes return a `UniversalStepCache` as `cache` (default False, which
            suits training; `generate()` turns it on).
    """

    model_type = "txv_universal"
    attribute_map = TxvTransformerConfig.attribute_map | {"max_steps": "num_hidden_layers"}

    vocab_size: int = 32000
    num_hidden_layers: int = 8
    use_act: bool = True
    act_threshold: float = 0.99
    act_loss_weight: float = 0.001
    halting_bias_init: float = 1.0
    is_decoder: bool = False
    add_cross_attention: bool = False
    layer_norm_position: str = "pre"
    transition: str = "feed_forward"
    separable_conv_kernel_sizes: list[int] | tuple[int, ...] = (3, 5)
    scale_embedding: bool = True
    layer_norm_eps: float = 1e-6
    use_cache: bool = False

    def derive_defaults(self, kwargs: dict):
        read_act_epsilon(self, kwargs)
        super().derive_defaults(kwargs)
        self.separable_conv_kernel_sizes = list(self.separable_conv_kernel_sizes)

    def validate_architecture(self):
        super().validate_architecture()
        check_even(self, "hidden_size", "sinusoidal coordinate embedding")
        check_act_fields(self)
        check_choice(self, "layer_norm_position", LAYER_NORM_POSITIONS)
        check_choice(self, "transition", TRANSITIONS)
        kernels = self.separable_conv_kernel_sizes
        if len(kernels) != 2 or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in kernels):
            raise ValueError(f"separable_conv_kernel_sizes must be two positive integers, got {kernels!r}")


__all__ = ["UniversalTransformerConfig"]
