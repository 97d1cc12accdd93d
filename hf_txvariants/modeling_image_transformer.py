"""Image Transformer (Parmar et al. 2018, "Image Transformer"): an autoregressive decoder over the channel
intensities of an image, with local 1D or local 2D self-attention from `txv_patterns`.

Every channel of every pixel is one position of the `height x (width * channels)` grid. The model generates them
in raster order (local 1D) or in block-raster order (local 2D: query blocks of `query_shape` in raster order, raster
order inside a block). `input_ids` are `[start token 256, x_0, x_1, ...]` in that generation order
(`images_to_input_ids` builds them); position t carries the intensity x_{t-1}, the grid position and channel of
x_t (row and column sinusoids, a channel embedding) and, with `num_classes`, a class embedding; its logits (256
intensities) predict x_t. The loss is in bits per dimension. `generate_images` samples images
(`hf_txvariants.training.images.save_png` writes them).

Generation keeps every layer's keys and values in a `DynamicCache`; each new position attends, through the same
pattern kernels, to only the keys its local block may see (`q_offset`), so a token costs O(block) attention work
instead of a forward pass over the whole prefix. The attention is causal and local, so the cached outputs are those
of recomputing the prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import can_return_tuple

from .configuration_image_transformer import ImageTransformerConfig
from .txv_attention import additive_mask
from .txv_compat import GradientCheckpointingLayer, accepts_cache_names, cache_field, output_cache
from .txv_feedforward import PositionwiseFeedForward
from .txv_inputs import check_right_padding, check_token_ids
from .txv_losses import causal_lm_head
from .txv_mha import MultiHeadAttention, cache_past_length
from .txv_pattern_attention import PatternSelfAttention
from .txv_pattern_tilings import to_block_raster
from .txv_patterns import AttentionPattern, Local1D, Local2D
from .txv_positions import sinusoid_table
from .txv_pretrained import TxvPreTrainedModel

START_TOKEN = 256
NUM_INTENSITIES = 256


def generation_order(config: ImageTransformerConfig, device=None) -> torch.Tensor:
    """`[num_positions]`: the raster index (in the height x width*channels grid) of the t-th generated position."""
    raster = torch.arange(config.num_positions, device=device)
    if config.attention_type == "local_1d":
        return raster
    return to_block_raster(raster[None], config.image_size[0], config.grid_width, config.query_shape)[0]


def images_to_input_ids(images: torch.Tensor, config: ImageTransformerConfig) -> torch.LongTensor:
    """`[batch, height, width, channels]` intensities 0..255 -> `[batch, 1 + positions]` (start token first)."""
    flat = flat_intensities(images, config.image_size, config.num_channels, "images", "image_size")
    ordered = flat[:, generation_order(config, images.device)]
    return torch.cat([torch.full_like(ordered[:, :1], START_TOKEN), ordered], dim=1)


def input_ids_to_images(input_ids: torch.Tensor, config: ImageTransformerConfig) -> torch.Tensor:
    """Inverse of `images_to_input_ids` (with or without the start token): uint8 `[batch, height, width,
    channels]`."""
    if input_ids.shape[1] == config.num_positions + 1:
        input_ids = input_ids[:, 1:]
    if input_ids.shape[1] != config.num_positions:
        raise ValueError(f"input_ids must have {config.num_positions} (+1) positions, got {input_ids.shape[1]}")
    raster = torch.empty_like(input_ids)
    raster[:, generation_order(config, input_ids.device)] = input_ids
    height, width = config.image_size
    return raster.clamp(0, 255).to(torch.uint8).view(-1, height, width, config.num_channels)


def local_pattern(config: ImageTransformerConfig) -> AttentionPattern:
    """The attention pattern `config` describes (local 1D with its memory length, or local 2D)."""
    if config.attention_type == "local_2d":
        return Local2D(config.grid_width, tuple(config.query_shape), tuple(config.memory_flange))
    return Local1D(config.block_length, config.memory_length)


@dataclass
class ImageTransformerCausalLMOutput(CausalLMOutputWithPast):
    """transformers' causal-LM output; `loss` is in bits per dimension (the paper's unit: nats / ln 2 per channel
    intensity)."""


def grid_position_embeddings(raster: torch.Tensor, grid_width: int, config, embed_channels: nn.Embedding, scale=(1, 1)):
    """`[n, hidden]` for raster indices of a `? x grid_width` grid of intensities: row and column sinusoids (half the
    width each) and the channel embedding. With `scale` (rows, columns), the grid is a low-resolution image whose
    pixels are placed at their centres in the coordinates of a grid `scale` times larger (the image being decoded)."""
    row, column = torch.div(raster, grid_width, rounding_mode="floor"), raster % grid_width
    channel = column % config.num_channels
    if scale != (1, 1):
        pixel = torch.div(column, config.num_channels, rounding_mode="floor")
        row = (row + 0.5) * scale[0] - 0.5
        column = ((pixel + 0.5) * scale[1] - 0.5) * config.num_channels + channel
    half = config.hidden_size // 2
    table = torch.cat([sinusoid_table(row, half), sinusoid_table(column, config.hidden_size - half)], dim=-1)
    return table + embed_channels(channel)


class ImageTransformerLayer(GradientCheckpointingLayer):
    """Pre-norm decoder layer: x + dropout(attn(LN(x))), [x + dropout(cross_attn(LN(x), encoder)) when conditioned on
    an image], then x + ff(LN(x))."""

    def __init__(self, config: ImageTransformerConfig, layer_idx: int, pattern):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = PatternSelfAttention(config, layer_idx, pattern)
        if config.conditioning_image_size is not None:
            self.ln_cross = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            self.cross_attn = MultiHeadAttention(config, layer_idx, is_cross_attention=True)
        self.ln_ff = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ff = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        hidden_states,
        key_padding_mask=None,
        output_attentions=False,
        cache=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
    ):
        attention_output, weights = self.attn(self.ln_attn(hidden_states), key_padding_mask, cache, output_attentions)
        hidden_states = hidden_states + self.dropout(attention_output)
        if hasattr(self, "cross_attn"):
            if encoder_hidden_states is None:
                raise ValueError(
                    "encoder_hidden_states (the encoded low-resolution image) is required when "
                    "config.conditioning_image_size is set"
                )
            # The encoder's keys/values are recomputed at each step (the low-resolution image is small).
            cross_output, _ = self.cross_attn(
                self.ln_cross(hidden_states), encoder_attention_mask, key_value_states=encoder_hidden_states
            )
            hidden_states = hidden_states + self.dropout(cross_output)
        return hidden_states + self.ff(self.ln_ff(hidden_states)), weights


class ImageTransformerPreTrainedModel(TxvPreTrainedModel):
    config_class = ImageTransformerConfig
    _no_split_modules = ["ImageTransformerLayer"]
    _supports_sdpa = True
    auto_classes = {
        "AutoModel": "ImageTransformerModel",
        "AutoModelForCausalLM": "ImageTransformerForCausalLM",
        "AutoModelForImageToImage": "ImageTransformerForSuperResolution",
    }
    head_key_patterns = (r"^lm_head\.", r"^encoder\.")


class ImageTransformerModel(ImageTransformerPreTrainedModel):
    def __init__(self, config: ImageTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_channels = nn.Embedding(config.num_channels, config.hidden_size)
        self.embed_classes = nn.Embedding(config.num_classes, config.hidden_size) if config.num_classes else None
        pattern = local_pattern(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(ImageTransformerLayer(config, i, pattern) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def position_embeddings(self, length: int, device, dtype, offset: int = 0) -> torch.Tensor:
        """`[length, hidden]`: for step t (from `offset`), the row/column sinusoids (half the width each) and the
        channel embedding of the position x_t it predicts (the last step, which predicts nothing, repeats the last
        position)."""
        config = self.config
        order = generation_order(config, device)
        steps = torch.arange(offset, offset + length, device=device).clamp(max=config.num_positions - 1)
        return grid_position_embeddings(order[steps], config.grid_width, config, self.embed_channels).to(dtype)

    def embed(self, input_ids, inputs_embeds, class_labels, past_length: int = 0) -> torch.Tensor:
        """Token + position (+ class) embeddings of the positions from `past_length` on, checked."""
        config = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds")
        if input_ids is not None:
            check_token_ids(input_ids, config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise ValueError(
                f"inputs_embeds must be [batch, length, {config.hidden_size}], got shape {tuple(inputs_embeds.shape)}"
            )
        batch, length = inputs_embeds.shape[:2]
        if past_length + length > config.num_positions + 1:
            raise ValueError(
                f"input of {past_length + length} positions is longer than an image ({config.num_positions} "
                "positions + start token)"
            )
        positions = self.position_embeddings(length, inputs_embeds.device, inputs_embeds.dtype, past_length)
        hidden_states = inputs_embeds + positions[None]
        if config.num_classes:
            if class_labels is None or class_labels.shape != (batch,):
                raise ValueError(f"class_labels must be [batch={batch}] when num_classes > 0 (config.num_classes)")
            check_token_ids(class_labels[:, None], config.num_classes, "class_labels", "num_classes")
            hidden_states = hidden_states + self.embed_classes(class_labels)[:, None]
        return hidden_states

    # Copied from hf_txvariants.modeling_r_transformer.RTransformerModel._run_layers
    def _run_layers(self, hidden_states, output_attentions: bool, output_hidden_states: bool, **layer_inputs):
        """The layers over `hidden_states` (each also given `layer_inputs`, by name), then the final norm (when the
        model has one). Returns `(last hidden states, what entered each layer then the last hidden states, every
        layer's attention weights)`, the last two None unless `output_hidden_states` / `output_attentions`."""
        all_hidden_states, all_attentions = [], []
        for layer in self.layers:
            all_hidden_states.append(hidden_states)
            hidden_states, weights = layer(hidden_states, output_attentions=output_attentions, **layer_inputs)
            all_attentions.append(weights)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        all_hidden_states.append(hidden_states)
        return (
            hidden_states,
            tuple(all_hidden_states) if output_hidden_states else None,
            tuple(all_attentions) if output_attentions else None,
        )

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        class_labels: torch.LongTensor | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """input_ids: `[batch, <= 1 + positions]` in generation order, start token first (with `cache`,
        the positions after the cached ones). class_labels: `[batch]` (required when `num_classes > 0`).
        attention_mask: `[batch, length]` or, with a cache, `[batch, past + length]`; positions (and the local
        pattern) count from the first column, so padding must end a row: left padding is refused. `use_cache` returns
        the keys and values of every layer in a `DynamicCache` (`cache`). encoder_hidden_states: the encoded
        low-resolution image (`ImageTransformerForSuperResolution`), attended to by every layer, through the additive
        `encoder_attention_mask` `[1, 1, length, encoder positions]` when given."""
        config = self.config
        output_attentions, output_hidden_states = self.output_flags(output_attentions, output_hidden_states)
        use_cache = use_cache if use_cache is not None else config.use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=config)
        if cache is not None and not isinstance(cache, Cache):
            raise ValueError(f"cache must be a transformers Cache, got {type(cache).__name__}")
        past_length = cache_past_length(cache)
        hidden_states = self.embed(input_ids, inputs_embeds, class_labels, past_length)
        batch, length = hidden_states.shape[:2]
        key_padding_mask = None
        if attention_mask is not None:
            if attention_mask.shape not in ((batch, length), (batch, past_length + length)):
                raise ValueError(
                    f"attention_mask must be [batch={batch}, length={length}] (or [batch, {past_length + length}] "
                    f"with cache), got {tuple(attention_mask.shape)}"
                )
            if attention_mask.shape[1] != past_length + length:
                attention_mask = torch.cat([attention_mask.new_ones(batch, past_length), attention_mask], dim=1)
            # An all-ones mask masks nothing: skip it (when tracing, keep it: the check depends on the values).
            if torch.compiler.is_compiling() or not bool(attention_mask.all()):
                key_padding_mask = attention_mask.to(device=hidden_states.device, dtype=torch.bool)
                check_right_padding(key_padding_mask, "Image Transformer")

        hidden_states, all_hidden_states, all_attentions = self._run_layers(
            self.dropout(hidden_states),
            output_attentions,
            output_hidden_states,
            key_padding_mask=key_padding_mask,
            cache=cache,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
        )
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states,
            **cache_field(cache if use_cache else None),
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )


def check_intensity_targets(labels, shift_labels) -> None:
    """The targets of the image heads (`labels` after the start token, or `shift_labels`) are intensities or -100."""
    targets = shift_labels if shift_labels is not None else labels[:, 1:]
    if not torch.compiler.is_compiling() and bool(((targets != -100) & ((targets < 0) | (targets > 255))).any()):
        raise ValueError("labels after the first position (or shift_labels) must be intensities in [0, 255] or -100")


def intensity_logits_and_loss(
    lm_head: nn.Linear, hidden_states, labels, logits_to_keep: int, num_items_in_batch, shift_labels, vocab_size: int
):
    """The image heads' `(logits over the 256 intensities, loss in bits per dimension or None)`: the causal-LM loss
    of `txv_losses.causal_lm_head` (over every position, the logits then cut to `logits_to_keep`), its targets
    checked to be intensities, divided by ln 2."""
    logits, loss = causal_lm_head(
        lm_head,
        hidden_states,
        vocab_size,
        labels,
        logits_to_keep,
        num_items_in_batch=num_items_in_batch,
        shift_labels=shift_labels,
    )
    if loss is not None:
        check_intensity_targets(labels, shift_labels)
        loss = loss / math.log(2)  # nats -> bits per dimension
    return logits, loss


class ImageTransformerForCausalLM(ImageTransformerPreTrainedModel, GenerationMixin):
    """Image generation: logits over the 256 intensities; `loss` in bits per dimension. `class_labels` `[batch]` (with
    `num_classes`) are passed to `ImageTransformerModel`."""

    def __init__(self, config: ImageTransformerConfig):
        super().__init__(config)
        self.model = ImageTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, NUM_INTENSITIES, bias=False)
        self.post_init()

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> ImageTransformerCausalLMOutput:
        """labels: usually `input_ids` (start token first), shifted inside (position t predicts labels[t + 1]):
        intensities or -100 (ignored). shift_labels (keyword): targets already shifted (transformers' loss kwarg),
        used instead of labels. encoder_hidden_states: refused (only `ImageTransformerForSuperResolution` reads an
        encoder). logits_to_keep: logits of the last `logits_to_keep` positions only (0 = all); the loss covers every
        position. Other keyword arguments (`class_labels`) go to `ImageTransformerModel`."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits, loss = intensity_logits_and_loss(
            self.lm_head,
            outputs.last_hidden_state,
            labels,
            logits_to_keep,
            num_items_in_batch,
            shift_labels,
            self.config.vocab_size,
        )
        return ImageTransformerCausalLMOutput(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def prepare_inputs_for_generation(self, input_ids, class_labels=None, **kwargs):
        return {**super().prepare_inputs_for_generation(input_ids, **kwargs), "class_labels": class_labels}

    @torch.no_grad()
    def generate_images(
        self,
        num_images: int | None = None,
        class_labels: torch.LongTensor | None = None,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Samples whole images -> uint8 `[batch, height, width, channels]` (`use_cache=False` recomputes the prefix at
        every step: same images, slower)."""
        config = self.config
        if class_labels is not None:
            num_images = class_labels.shape[0]
        if num_images is None:
            raise ValueError("pass num_images or class_labels")
        device = self.lm_head.weight.device
        start = torch.full((num_images, 1), START_TOKEN, dtype=torch.long, device=device)
        kwargs = dict(do_sample=do_sample, max_new_tokens=config.num_positions, eos_token_id=None, pad_token_id=0)
        if do_sample:
            kwargs.update(temperature=temperature, top_k=top_k or 0)
        tokens = self.generate(start, class_labels=class_labels, use_cache=use_cache, **kwargs)
        return input_ids_to_images(tokens, config)


def images_to_conditioning_ids(images: torch.Tensor, config: ImageTransformerConfig) -> torch.LongTensor:
    """Low-resolution `[batch, height, width, channels]` intensities 0..255 -> `[batch, height * width * channels]`
    in raster order (the super-resolution encoder's input)."""
    if config.conditioning_image_size is None:
        raise ValueError("config.conditioning_image_size is not set: this model is not conditioned on an image")
    return flat_intensities(
        images, config.conditioning_image_size, config.num_channels, "low-resolution images", "conditioning_image_size"
    )


def flat_intensities(images: torch.Tensor, size, num_channels: int, name: str, size_field: str) -> torch.LongTensor:
    """`[batch, height, width, num_channels]` intensities 0..255 (`size` = (height, width)), checked, as `[batch,
    height * width * num_channels]` in raster order; a ValueError names `name` and the config fields."""
    height, width = size
    if images.dim() != 4 or tuple(images.shape[1:]) != (height, width, num_channels):
        raise ValueError(
            f"{name} must be [batch, {height}, {width}, {num_channels}] ({size_field}, num_channels), "
            f"got shape {tuple(images.shape)}"
        )
    flat = images.long().reshape(images.shape[0], -1)
    check_token_ids(flat, NUM_INTENSITIES, name, "num_channels intensities 0..255")
    return flat


def conditioning_neighbourhood(config: ImageTransformerConfig, steps: torch.Tensor) -> torch.Tensor:
    """bool `[len(steps), conditioning positions]`: for decoder step t (predicting x_t), the low-resolution
    intensities of the pixels within `conditioning_attention_radius` rows and columns of the pixel covering x_t."""
    order = generation_order(config, steps.device)[steps.clamp(max=config.num_positions - 1)]
    height, width = config.image_size
    low_height, low_width = config.conditioning_image_size
    row = torch.div(order, config.grid_width, rounding_mode="floor")
    column = torch.div(order % config.grid_width, config.num_channels, rounding_mode="floor")
    covering_row = torch.div(row * low_height, height, rounding_mode="floor")
    covering_column = torch.div(column * low_width, width, rounding_mode="floor")
    low = torch.arange(config.num_conditioning_positions, device=steps.device)
    low_row = torch.div(low, low_width * config.num_channels, rounding_mode="floor")
    low_column = torch.div(low % (low_width * config.num_channels), config.num_channels, rounding_mode="floor")
    radius = config.conditioning_attention_radius
    near_rows = (covering_row[:, None] - low_row[None]).abs() <= radius
    return near_rows & ((covering_column[:, None] - low_column[None]).abs() <= radius)


class ImageTransformerEncoderLayer(GradientCheckpointingLayer):
    """Pre-norm encoder layer over the low-resolution intensities: full (non-causal) self-attention, feed-forward."""

    def __init__(self, config: ImageTransformerConfig, layer_idx: int):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = MultiHeadAttention(config, layer_idx)
        self.ln_ff = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ff = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states):
        attention_output, _ = self.attn(self.ln_attn(hidden_states), None)
        hidden_states = hidden_states + self.dropout(attention_output)
        return hidden_states + self.ff(self.ln_ff(hidden_states))


class ImageTransformerEncoder(nn.Module):
    """Encodes the low-resolution image: intensity embeddings + row/column sinusoids of its pixels' centres in the
    high-resolution grid's coordinates (so that a decoder position and the low-resolution pixel covering it get
    near positions) and the channel embedding, `num_encoder_layers` layers of full self-attention, a LayerNorm."""

    def __init__(self, config: ImageTransformerConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(NUM_INTENSITIES, config.hidden_size)
        self.embed_channels = nn.Embedding(config.num_channels, config.hidden_size)
        self.layers = nn.ModuleList(ImageTransformerEncoderLayer(config, i) for i in range(config.num_encoder_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, conditioning_ids: torch.LongTensor) -> torch.Tensor:
        config = self.config
        expected = config.num_conditioning_positions
        if conditioning_ids.dim() != 2 or conditioning_ids.shape[1] != expected:
            raise ValueError(
                f"conditioning_ids must be [batch, {expected}] (the low-resolution image's intensities, "
                f"images_to_conditioning_ids), got shape {tuple(conditioning_ids.shape)}"
            )
        check_token_ids(conditioning_ids, NUM_INTENSITIES, "conditioning_ids", "num_channels intensities 0..255")
        raster = torch.arange(expected, device=conditioning_ids.device)
        low_height, low_width = config.conditioning_image_size
        scale = (config.image_size[0] / low_height, config.image_size[1] / low_width)
        positions = grid_position_embeddings(
            raster, low_width * config.num_channels, config, self.embed_channels, scale
        )
        # Intensity embeddings scaled by sqrt(hidden_size) (Vaswani et al. 2017, section 3.4; tensor2tensor's Image
        # Transformer does the same), else the unit-amplitude position sinusoids drown them.
        intensities = self.embed_tokens(conditioning_ids) * math.sqrt(config.hidden_size)
        hidden_states = self.dropout(intensities + positions.to(self.embed_tokens.weight.dtype))
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


class ImageTransformerForSuperResolution(ImageTransformerPreTrainedModel, GenerationMixin):
    """Image-conditioned generation (Parmar et al. 2018, section 3.4, super-resolution): the low-resolution image
    (`conditioning_ids`, `images_to_conditioning_ids`) is encoded with full self-attention; the high-resolution image
    is decoded as by `ImageTransformerForCausalLM` (local 1D / 2D attention, `input_ids` in generation order, start
    token first), every decoder layer also attending to the encoder's output: by default
    (`conditioning_attention_radius=0`) only to the encoding of the low-resolution pixel covering the position it
    predicts (the encoder's full self-attention gives that encoding the whole image's context); with None, to every
    encoder position, which starts as a uniform average and, in short runs, is not learned away (the decoder then
    ignores its input). `loss` in bits per dimension. Generation caches the decoder's keys/values; the small encoder
    is rerun at each step."""

    def __init__(self, config: ImageTransformerConfig):
        super().__init__(config)
        if config.conditioning_image_size is None:
            raise ValueError(
                "ImageTransformerForSuperResolution needs config.conditioning_image_size ([height, width])"
            )
        self.encoder = ImageTransformerEncoder(config)
        self.model = ImageTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, NUM_INTENSITIES, bias=False)
        self.post_init()

    @accepts_cache_names
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        encoder_hidden_states: torch.FloatTensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        conditioning_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> ImageTransformerCausalLMOutput:
        """conditioning_ids: `[batch, conditioning positions]`, the low-resolution image (`images_to_conditioning_ids`),
        required: encoded, it is the decoder's `encoder_hidden_states` (so that argument is refused), with a
        `conditioning_attention_radius` masked to the encoder positions each position may attend to (else
        `encoder_attention_mask`, additive `[1, 1, length, encoder positions]`, when given). The other arguments are
        `ImageTransformerForCausalLM`'s."""
        shift_labels = kwargs.pop("shift_labels", None)
        if encoder_hidden_states is not None:
            raise ValueError("encoder_hidden_states was given but config.add_cross_attention is False")
        if conditioning_ids is None:
            raise ValueError("conditioning_ids (the low-resolution image, images_to_conditioning_ids) is required")
        encoder_hidden_states = self.encoder(conditioning_ids)
        if self.config.conditioning_attention_radius is not None:
            tokens = input_ids if input_ids is not None else inputs_embeds
            past_length = cache_past_length(cache)
            steps = torch.arange(past_length, past_length + tokens.shape[1], device=encoder_hidden_states.device)
            allowed = conditioning_neighbourhood(self.config, steps)
            encoder_attention_mask = additive_mask(allowed[None, None], encoder_hidden_states.dtype)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits, loss = intensity_logits_and_loss(
            self.lm_head,
            outputs.last_hidden_state,
            labels,
            logits_to_keep,
            num_items_in_batch,
            shift_labels,
            self.config.vocab_size,
        )
        return ImageTransformerCausalLMOutput(
            loss=loss,
            logits=logits,
            **cache_field(output_cache(outputs)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def prepare_inputs_for_generation(self, input_ids, class_labels=None, conditioning_ids=None, **kwargs):
        return {
            **super().prepare_inputs_for_generation(input_ids, **kwargs),
            "class_labels": class_labels,
            "conditioning_ids": conditioning_ids,
        }

    @torch.no_grad()
    def upscale(
        self, low_resolution: torch.Tensor, do_sample: bool = False, temperature: float = 1.0, use_cache: bool = True
    ) -> torch.Tensor:
        """Low-resolution uint8 `[batch, h, w, channels]` -> generated high-resolution `[batch, H, W, channels]`."""
        conditioning_ids = images_to_conditioning_ids(low_resolution, self.config)
        start = torch.full(
            (conditioning_ids.shape[0], 1), START_TOKEN, dtype=torch.long, device=self.lm_head.weight.device
        )
        kwargs = dict(do_sample=do_sample, max_new_tokens=self.config.num_positions, eos_token_id=None, pad_token_id=0)
        if do_sample:
            kwargs.update(temperature=temperature, top_k=0)
        tokens = self.generate(start, conditioning_ids=conditioning_ids.to(start.device), use_cache=use_cache, **kwargs)
        return input_ids_to_images(tokens, self.config)


__all__ = [
    "ImageTransformerPreTrainedModel",
    "ImageTransformerModel",
    "ImageTransformerForCausalLM",
    "ImageTransformerForSuperResolution",
    "images_to_conditioning_ids",
    "images_to_input_ids",
    "input_ids_to_images",
]
