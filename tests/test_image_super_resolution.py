"""Image Transformer super-resolution (Parmar et al. 2018, section 3.4): a low-resolution image encoded, the
high-resolution image decoded with local attention and cross-attention to the encoder."""

import pytest
import torch
from transformers import AutoModelForImageToImage

from hf_txvariants import ImageTransformerForCausalLM, ImageTransformerForSuperResolution
from hf_txvariants.modeling_image_transformer import (
    conditioning_neighbourhood,
    generation_order,
    images_to_conditioning_ids,
    images_to_input_ids,
)
from hf_txvariants.training.images import downsample, synthetic_shapes
from tiny_configs import DEFAULT, tiny_config

# this file's tiny model: tiny_config("txv_image_transformer") as a super-resolution model, 8x8 grey images conditioned
# on 4x4 ones, local 1D attention
SUPER_RESOLUTION = dict(
    image_size=[8, 8],
    num_channels=1,
    conditioning_image_size=[4, 4],
    num_encoder_layers=1,
    attention_type="local_1d",
    query_shape=DEFAULT,
    memory_flange=DEFAULT,
)


def super_resolution_config(**overrides):
    return tiny_config("txv_image_transformer", **{**SUPER_RESOLUTION, **overrides})


def _model(**overrides):
    torch.manual_seed(0)
    return ImageTransformerForSuperResolution(super_resolution_config(**overrides)).eval()


def _sharp(model):
    """Weights larger than the initialisation's, so that every path's effect shows."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


def _batch(config, count=2, seed=0):
    images = synthetic_shapes(count, config.image_size[0], config.num_channels, seed)
    low = downsample(images, config.image_size[0] // config.conditioning_image_size[0])
    return images_to_input_ids(images, config), images_to_conditioning_ids(low, config)


def test_the_low_resolution_image_conditions_every_position():
    """Changing one low-resolution intensity changes the logits of the first position too (cross-attention sees the
    whole encoded image, which local self-attention could not reach)."""
    model = _sharp(_model())
    ids, conditioning = _batch(model.config)
    changed = conditioning.clone()
    changed[:, -1] = (changed[:, -1] + 128) % 256
    with torch.no_grad():
        a = model(ids, conditioning_ids=conditioning).logits
        b = model(ids, conditioning_ids=changed).logits
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-2


def _nearest_neighbour_batch(config, count, generator):
    """High-resolution images that are the nearest-neighbour upsampling of random 4-level low-resolution ones: the
    input determines every pixel; without it, the first pixel of each upsampled block costs 2 bits."""
    low_height, low_width = config.conditioning_image_size
    low = (torch.randint(0, 4, (count, low_height, low_width, 1), generator=generator) * 85).to(torch.uint8)
    factor = config.image_size[0] // low_height
    high = low.repeat_interleave(factor, 1).repeat_interleave(factor, 2)
    return images_to_input_ids(high, config), images_to_conditioning_ids(low, config)


def test_the_decoder_learns_to_use_the_low_resolution_image():
    """The defect behind "conditional no better than unconditional": with full cross-attention the decoder starts
    from a uniform average over the whole encoded image and, in short runs, stays there (held-out loss equal with
    the true and with shuffled conditioning images, 2.00 bits/dim). Attending to the covering pixel's encoding (and
    the encoder's intensity embeddings scaled by sqrt(hidden)) lets the low-resolution image reach the decoder: after
    60 steps the true images give far fewer bits than shuffled ones."""
    torch.manual_seed(0)
    config = super_resolution_config(
        image_size=[4, 4],
        conditioning_image_size=[2, 2],
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        block_length=4,
    )
    model = ImageTransformerForSuperResolution(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        ids, conditioning = _nearest_neighbour_batch(config, 32, generator)
        loss = model(ids, conditioning_ids=conditioning, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ids, conditioning = _nearest_neighbour_batch(config, 256, generator)
    model.eval()
    with torch.no_grad():
        true_images = model(ids, conditioning_ids=conditioning, labels=ids).loss.item()
        shuffled = model(ids, conditioning_ids=conditioning.roll(1, 0), labels=ids).loss.item()
    assert true_images < 1.0, true_images
    assert shuffled > true_images + 1.0, (true_images, shuffled)


@pytest.mark.parametrize("attention_type, radius", [("local_1d", 0), ("local_1d", 1), ("local_2d", 0), ("local_2d", 1)])
def test_cross_attention_neighbourhood_is_the_pixels_around_the_covering_one(attention_type, radius):
    """Naive check: for every decoder step, the allowed encoder positions are the channels of the low-resolution
    pixels within `radius` rows and columns of the one covering the pixel that step predicts."""
    config = super_resolution_config(
        num_channels=2,
        attention_type=attention_type,
        query_shape=[2, 4],
        memory_flange=[1, 4],
        conditioning_attention_radius=radius,
    )
    allowed = conditioning_neighbourhood(config, torch.arange(config.num_positions + 1))
    order = generation_order(config)
    low_width, channels, width = config.conditioning_image_size[1], config.num_channels, config.image_size[1]
    for step in range(config.num_positions + 1):
        raster = int(order[min(step, config.num_positions - 1)])
        row, column = raster // (width * channels), (raster % (width * channels)) // channels
        expected = [
            abs(row // 2 - low // (low_width * channels)) <= radius
            and abs(column // 2 - (low % (low_width * channels)) // channels) <= radius
            for low in range(config.num_conditioning_positions)
        ]
        assert allowed[step].tolist() == expected, step


def test_loss_is_bits_per_dimension_and_trains():
    model = _model().train()
    ids, conditioning = _batch(model.config, count=4)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(ids, conditioning_ids=conditioning, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert abs(losses[0] - 8.0) < 0.5  # untrained: about log2(256) bits
    assert losses[-1] < losses[0] - 1.0
    assert all(p.grad is not None for n, p in model.named_parameters() if n.startswith("encoder.")), "encoder trains"


@pytest.mark.exact
@pytest.mark.parametrize("attention_type", ["local_1d", "local_2d"])
def test_cached_upscaling_equals_recomputing(attention_type):
    model = _sharp(_model(attention_type=attention_type, query_shape=[2, 4], memory_flange=[1, 4]))
    _, conditioning = _batch(model.config)
    kwargs = dict(
        conditioning_ids=conditioning,
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    start = torch.full((2, 1), 256)
    cached, full = model.generate(start, use_cache=True, **kwargs), model.generate(start, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, full.sequences)
    for a, b in zip(cached.logits, full.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_upscale_returns_images_and_auto_class_loads(tmp_path):
    model = _model()
    low = downsample(synthetic_shapes(1, 8, 1, seed=3), 2)
    assert model.upscale(low).shape == (1, 8, 8, 1)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForImageToImage.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, ImageTransformerForSuperResolution)
    ids, conditioning = _batch(model.config)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(ids, conditioning_ids=conditioning).logits, model(ids, conditioning_ids=conditioning).logits
        )


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="conditioning_image_size"):
        ImageTransformerForSuperResolution(super_resolution_config(conditioning_image_size=None))
    with pytest.raises(ValueError, match="conditioning_image_size"):
        super_resolution_config(conditioning_image_size=[0, 4])
    with pytest.raises(ValueError, match="conditioning_attention_radius"):
        super_resolution_config(conditioning_attention_radius=-1)
    model = _model()
    ids, conditioning = _batch(model.config)
    with pytest.raises(ValueError, match="conditioning_ids"):
        model(ids)
    with pytest.raises(ValueError, match="conditioning_ids"):
        model(ids, conditioning_ids=conditioning[:, :-1])
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        ImageTransformerForCausalLM(model.config)(ids)
    with pytest.raises(ValueError, match="low-resolution"):
        images_to_conditioning_ids(torch.zeros(1, 8, 8, 1), model.config)
