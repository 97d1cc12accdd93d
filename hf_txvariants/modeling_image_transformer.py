"""Image Transformer (Parmar et al. 2018, "Image Transformer"): an autoregressive decoder over the channel
intensities of an image, with local 1D or local 2D self-attention from `txv_patterns`.

Every channel of every pixel is one position of the `height x (width * channels)` grid. The model generates them
in raster order (local 1D) or in block-raster order (local 2D: query blocks of `query_shape` in raster order, raster
order inside a block). `input_ids` are `[start token 256, x_0, x_1, ...]` in that generation order
(`images_to_input_ids` builds them); position t carries the intensity x_{t-1}, the grid position and channel of
x_t (row and column sinusoids, a channel embedding) and, with `num_classes`, a class embedding; its logits (256
intensities) predict x_t. The loss is in bits per dimension. `generate_images` samples images and `save_png`
writes them.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, ModelOutput

from .configuration_image_transformer import ImageTransformerConfig
from .txv_feedforward import PositionwiseFeedForward
from .txv_mha import MultiHeadAttention
from .txv_modeling_utils import TxvModelMixin
from .txv_patterns import Local1D, Local2D, pattern_attention, to_block_raster
from .txv_positions import sinusoid_table

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
    height, width = config.image_size
    if images.dim() != 4 or tuple(images.shape[1:]) != (height, width, config.num_channels):
        raise ValueError(
            f"images must be [batch, {height}, {width}, {config.num_channels}] (image_size, num_channels), "
            f"got shape {tuple(images.shape)}"
        )
    flat = images.long().reshape(images.shape[0], -1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) > 255):
        raise ValueError("images must hold intensities in [0, 255]")
    ordered = flat[:, generation_order(config, images.device)]
    return torch.cat([torch.full_like(ordered[:, :1], START_TOKEN), ordered], dim=1)


def input_ids_to_images(input_ids: torch.Tensor, config: ImageTransformerConfig) -> torch.Tensor:
    """Inverse of `images_to_input_ids` (with or without the start token) -> uint8 `[batch, height, width, channels]`."""
    if input_ids.shape[1] == config.num_positions + 1:
        input_ids = input_ids[:, 1:]
    if input_ids.shape[1] != config.num_positions:
        raise ValueError(f"input_ids must have {config.num_positions} (+1) positions, got {input_ids.shape[1]}")
    raster = torch.empty_like(input_ids)
    raster[:, generation_order(config, input_ids.device)] = input_ids
    height, width = config.image_size
    return raster.clamp(0, 255).to(torch.uint8).view(-1, height, width, config.num_channels)


def save_png(images: torch.Tensor, path, scale: int = 4) -> None:
    """Writes uint8 `[batch, height, width, channels]` (1 or 3 channels) side by side into one PNG, each pixel
    `scale` x `scale` (stdlib only)."""
    images = images.to(torch.uint8).cpu()
    channels = images.shape[-1]
    row = torch.cat(list(images), dim=1)  # [height, batch * width, channels]
    row = row.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    height, width = row.shape[:2]
    raw = b"".join(b"\x00" + bytes(row[y].flatten().tolist()) for y in range(height))
    colour = {1: 0, 3: 2}[channels]

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as handle:
        handle.write(png)


@dataclass
class ImageTransformerCausalLMOutput(ModelOutput):
    """`loss` is in bits per dimension (the paper's unit: nats / ln 2 per channel intensity)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


class ImageTransformerAttention(MultiHeadAttention):
    def __init__(self, config: ImageTransformerConfig, layer_idx: int, pattern):
        super().__init__(config, layer_idx)
        self.pattern = pattern

    def forward(self, hidden_states, key_padding_mask=None, output_attentions=False):
        batch, length = hidden_states.shape[:2]
        query = self._heads(self.q_proj(hidden_states))
        key, value = self.keys_values(hidden_states)
        output, weights = pattern_attention(
            self,
            query,
            key,
            value,
            self.pattern,
            self.config.pattern_implementation,
            scaling=self.scaling,
            key_padding_mask=key_padding_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            block_size=self.config.block_size,
            output_attentions=output_attentions,
            dense_implementation=self.config._attn_implementation,
        )
        return self.o_proj(output.reshape(batch, length, -1)), weights


class ImageTransformerLayer(GradientCheckpointingLayer):
    """Pre-norm decoder layer: x + dropout(attn(LN(x))), then x + ff(LN(x))."""

    def __init__(self, config: ImageTransformerConfig, layer_idx: int, pattern):
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = ImageTransformerAttention(config, layer_idx, pattern)
        self.ln_ff = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ff = PositionwiseFeedForward(config.hidden_size, config.intermediate_size, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden_states, key_padding_mask=None, output_attentions=False):
        attention_output, weights = self.attn(self.ln_attn(hidden_states), key_padding_mask, output_attentions)
        hidden_states = hidden_states + self.dropout(attention_output)
        return hidden_states + self.ff(self.ln_ff(hidden_states)), weights


class ImageTransformerPreTrainedModel(TxvModelMixin, PreTrainedModel):
    config_class = ImageTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["ImageTransformerLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    auto_classes = {"AutoModel": "ImageTransformerModel", "AutoModelForCausalLM": "ImageTransformerForCausalLM"}
    head_key_patterns = (r"^lm_head\.",)

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


class ImageTransformerModel(ImageTransformerPreTrainedModel):
    def __init__(self, config: ImageTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_channels = nn.Embedding(config.num_channels, config.hidden_size)
        self.embed_classes = nn.Embedding(config.num_classes, config.hidden_size) if config.num_classes else None
        if config.attention_type == "local_1d":
            pattern = Local1D(config.block_length)
        else:
            pattern = Local2D(config.grid_width, tuple(config.query_shape), tuple(config.memory_flange))
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(ImageTransformerLayer(config, i, pattern) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, new_embeddings):
        self.embed_tokens = new_embeddings

    def position_embeddings(self, length: int, device, dtype) -> torch.Tensor:
        """`[length, hidden]`: for step t, the row/column sinusoids (half the width each) and the channel embedding
        of the position x_t it predicts (the last step, which predicts nothing, repeats the last position)."""
        config = self.config
        order = generation_order(config, device)
        steps = torch.arange(length, device=device).clamp(max=config.num_positions - 1)
        raster = order[steps]
        row, column = torch.div(raster, config.grid_width, rounding_mode="floor"), raster % config.grid_width
        half = config.hidden_size // 2
        table = torch.cat([sinusoid_table(row, half), sinusoid_table(column, config.hidden_size - half)], dim=-1)
        return table.to(dtype) + self.embed_channels(column % config.num_channels)

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
        class_labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutput | tuple:
        """input_ids: `[batch, <= 1 + positions]` in generation order, start token first. class_labels: `[batch]`
        (required when `num_classes > 0`). `past_key_values`/`use_cache` are ignored (no cache: generation reruns
        the prefix)."""
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        return_dict = return_dict if return_dict is not None else config.return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds")
        if input_ids is not None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
            if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= config.vocab_size):
                raise ValueError("input_ids must be intensities in [0, 255] or the start token 256 (vocab_size 257)")
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise ValueError(
                f"inputs_embeds must be [batch, length, {config.hidden_size}], got shape {tuple(inputs_embeds.shape)}"
            )
        batch, length = inputs_embeds.shape[:2]
        if length > config.num_positions + 1:
            raise ValueError(
                f"input of {length} positions is longer than an image ({config.num_positions} positions + start token)"
            )
        hidden_states = inputs_embeds + self.position_embeddings(length, inputs_embeds.device, inputs_embeds.dtype)[None]
        if config.num_classes:
            if class_labels is None or class_labels.shape != (batch,):
                raise ValueError(f"class_labels must be [batch={batch}] when num_classes > 0 (config.num_classes)")
            if int(class_labels.min()) < 0 or int(class_labels.max()) >= config.num_classes:
                raise ValueError(f"class_labels must be in [0, {config.num_classes}) (config.num_classes)")
            hidden_states = hidden_states + self.embed_classes(class_labels)[:, None]
        key_padding_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (batch, length):
                raise ValueError(f"attention_mask must be [batch={batch}, length={length}], got {tuple(attention_mask.shape)}")
            if not bool(attention_mask.all()):
                key_padding_mask = attention_mask.to(device=hidden_states.device, dtype=torch.bool)
        hidden_states = self.dropout(hidden_states)
        all_hidden, all_attentions = [], []
        for layer in self.layers:
            all_hidden.append(hidden_states)
            hidden_states, weights = layer(hidden_states, key_padding_mask, output_attentions)
            all_attentions.append(weights)
        hidden_states = self.norm(hidden_states)
        output = BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) + (hidden_states,) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class ImageTransformerForCausalLM(ImageTransformerPreTrainedModel, GenerationMixin):
    """Image generation: logits over the 256 intensities; `loss` in bits per dimension."""

    def __init__(self, config: ImageTransformerConfig):
        super().__init__(config)
        self.model = ImageTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, NUM_INTENSITIES, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, class_labels=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask, "class_labels": class_labels}

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
        class_labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> ImageTransformerCausalLMOutput | tuple:
        """labels: usually `input_ids`; shifted inside (position t predicts labels[t + 1]); -100 is ignored. The loss
        is the mean negative log2-likelihood per intensity: bits per dimension."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            class_labels=class_labels,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:2]:
                raise ValueError(f"labels must have shape {tuple(logits.shape[:2])}, got {tuple(labels.shape)}")
            targets = labels[:, 1:].to(logits.device)
            if bool(((targets != -100) & ((targets < 0) | (targets > 255))).any()):
                raise ValueError("labels after the first position must be intensities in [0, 255] or -100")
            nats = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, NUM_INTENSITIES).float(), targets.reshape(-1), ignore_index=-100
            )
            loss = nats / math.log(2)
        output = ImageTransformerCausalLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()

    @torch.no_grad()
    def generate_images(
        self,
        num_images: int | None = None,
        class_labels: torch.LongTensor | None = None,
        do_sample: bool = True,
        temperature: float = 1.0,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """Samples whole images -> uint8 `[batch, height, width, channels]` (see `save_png`)."""
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
        tokens = self.generate(start, class_labels=class_labels, use_cache=False, **kwargs)
        return input_ids_to_images(tokens, config)


__all__ = [
    "ImageTransformerPreTrainedModel",
    "ImageTransformerModel",
    "ImageTransformerForCausalLM",
    "images_to_input_ids",
    "input_ids_to_images",
    "save_png",
]
