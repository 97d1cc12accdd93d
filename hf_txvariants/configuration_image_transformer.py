"""Image Transformer configuration (Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku and Tran 2018)."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvTransformerConfig
from .txv_config_checks import check_choice, check_non_negative, check_positive, integer_list

ATTENTION_TYPES = ("local_1d", "local_2d")
PATTERN_IMPLEMENTATIONS = ("auto", "blocked", "flex", "dense")


@strict
class ImageTransformerConfig(TxvTransformerConfig):
    r"""
    An autoregressive decoder over the channel intensities of `image_size` x `num_channels` images: every channel of
    every pixel is one position (intensities 0..255, token 256 is the start token), in raster order (local 1D) or in
    block-raster order of the `height x (width * channels)` grid (local 2D). Standard names are stored; the papers'
    (`d_model`, `n_head`, `d_head`, `d_inner`, `n_layer`, `dropatt`) are accepted through `attribute_map`.

    Args:
        image_size: `[height, width]`. num_channels: 1 (grey) or 3 (RGB).
        attention_type: "local_1d" (query blocks of `block_length` attend to themselves and the `memory_length`
            positions before them) or "local_2d" (query blocks of `query_shape` rows x columns of the grid attend to
            the memory block that extends them by `memory_flange` rows above and columns left and right, causally).
        memory_length: local 1D only, the positions before a query block that it also attends to (default
            `block_length`: the previous block). Parmar et al. 2018, section 3.2: "We then partition the length into
            non-overlapping query blocks Q of length l_q, padding with zeroes if necessary. For each query block, we
            build the memory block M from the same positions as Q and an additional l_m positions corresponding to
            pixels that have been generated before, which can result in overlapping memory blocks."
        num_classes: > 0 for class-conditional generation (a class embedding is added at every position).
        conditioning_image_size: `[height, width]` of the low-resolution image that conditions generation
            (super-resolution, `ImageTransformerForSuperResolution`; Parmar et al. 2018, section 3.4: the
            low-resolution image is encoded, the high-resolution one decoded with local attention and cross-attention
            to the encoder). None: unconditional model. num_encoder_layers: layers of that encoder (full
            self-attention over the low-resolution intensities).
        conditioning_attention_radius: which encoder positions a decoder position attends to: those of the
            low-resolution pixels within this many rows and columns of the one covering it (1: a 3 x 3 neighbourhood);
            None: every encoder position (the full encoder-decoder attention of Vaswani et al.). Full attention starts
            uniform over the whole low-resolution image and, in short runs, stays so: the decoder then gets only
            an image-wide average (benchmarks/RESULTS.md, super-resolution).
        pattern_implementation: "auto" (the default: the fastest exact path for the device), "blocked" (tiles of dense
            attention, local 1D and 2D alike; trains on CPU), "flex" (FlexAttention), "dense" (reference
            mask).
        block_size: query block of the gathered fallback, which only patterns without tilings take (unused by local 1D
            and 2D, which both tile); kept so that saved configs load unchanged.
    """

    model_type = "txv_image_transformer"

    image_size: list[int] = (32, 32)
    num_channels: int = 3
    vocab_size: int = 257
    intermediate_size: int | None = None
    attention_type: str = "local_1d"
    block_length: int = 256
    memory_length: int | None = None
    query_shape: list[int] = (8, 16)
    memory_flange: list[int] = (8, 16)
    num_classes: int = 0
    conditioning_image_size: list[int] | None = None
    num_encoder_layers: int = 2
    conditioning_attention_radius: int | None = 0
    pattern_implementation: str = "auto"
    block_size: int | None = None
    dropout: float | int = 0.0
    layer_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 256

    def derive_defaults(self, kwargs: dict):
        for name in ("image_size", "query_shape", "memory_flange", "conditioning_image_size"):
            setattr(self, name, integer_list(self, name))
        super().derive_defaults(kwargs)
        if self.memory_length is None:
            self.memory_length = self.block_length
        if self.block_size is None:
            self.block_size = (
                self.block_length if self.attention_type == "local_1d" else self.query_shape[0] * self.query_shape[1]
            )

    @property
    def grid_width(self) -> int:
        """Positions per row: every channel of every pixel."""
        return self.image_size[1] * self.num_channels

    @property
    def num_positions(self) -> int:
        return self.image_size[0] * self.grid_width

    @property
    def num_conditioning_positions(self) -> int:
        """Intensities of the low-resolution image (0 without one)."""
        if self.conditioning_image_size is None:
            return 0
        return self.conditioning_image_size[0] * self.conditioning_image_size[1] * self.num_channels

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "num_channels", "block_length", "block_size")
        check_non_negative(self, "memory_length", "num_classes")
        if len(self.image_size) != 2 or min(self.image_size) <= 0:
            raise ValueError(f"image_size must be [height, width] > 0, got {self.image_size}")
        if self.vocab_size != 257:
            raise ValueError(f"vocab_size must be 257 (256 intensities + the start token 256), got {self.vocab_size}")
        check_choice(self, "attention_type", ATTENTION_TYPES)
        check_choice(self, "pattern_implementation", PATTERN_IMPLEMENTATIONS)
        if self.attention_type == "local_2d":
            if len(self.query_shape) != 2 or min(self.query_shape) <= 0:
                raise ValueError(f"query_shape must be [rows, columns] > 0, got {self.query_shape}")
            if len(self.memory_flange) != 2 or min(self.memory_flange) < 0:
                raise ValueError(f"memory_flange must be [rows, columns] >= 0, got {self.memory_flange}")
            if self.image_size[0] % self.query_shape[0] or self.grid_width % self.query_shape[1]:
                raise ValueError(
                    f"query_shape {self.query_shape} must tile the {self.image_size[0]} x {self.grid_width} grid "
                    "(height x width * num_channels)"
                )
        if self.conditioning_image_size is not None:
            if len(self.conditioning_image_size) != 2 or min(self.conditioning_image_size) <= 0:
                raise ValueError(
                    f"conditioning_image_size must be [height, width] > 0, got {self.conditioning_image_size}"
                )
            check_positive(self, "num_encoder_layers")
            if self.conditioning_attention_radius is not None:
                check_non_negative(self, "conditioning_attention_radius")


__all__ = ["ImageTransformerConfig"]
