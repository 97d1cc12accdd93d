"""Image Transformer: shared tester, local 1D / 2D attention as the paper defines it, bits per dimension, class
conditioning, image generation and PNG output."""

import math
from pathlib import Path

import pytest
import torch

from hf_txvariants import ImageTransformerForCausalLM, ImageTransformerModel
from hf_txvariants.modeling_image_transformer import (
    generation_order,
    images_to_input_ids,
    input_ids_to_images,
)
from hf_txvariants.training.images import save_png
from hf_txvariants.txv_compat import output_cache
from tiny_configs import tiny_config
from txv_tester import TxvModelTesterMixin


def _images(batch, seed=0, config=None):
    config = config or tiny_config("txv_image_transformer")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, *config.image_size, config.num_channels), generator=generator)


class TestImageTransformer(TxvModelTesterMixin):
    model_type = "txv_image_transformer"
    model_classes = (ImageTransformerModel, ImageTransformerForCausalLM)
    causal_lm_class = ImageTransformerForCausalLM
    seq_length = 30

    def make_inputs(self, config, batch_size=None, seq_length=None, seed=0):
        ids = images_to_input_ids(_images(batch_size or self.batch_size, seed, config), config)
        return {"input_ids": ids[:, : (seq_length or self.seq_length)]}

    def test_eager_equals_sdpa(self):
        """The dense path through eager and SDPA (blocked and FlexAttention are compared with it below)."""
        self.config_overrides = {"pattern_implementation": "dense"}
        super().test_eager_equals_sdpa()


def _model(**overrides):
    torch.manual_seed(0)
    return ImageTransformerForCausalLM(tiny_config("txv_image_transformer", **overrides)).eval()


@pytest.mark.exact
def test_images_round_trip_and_block_raster_order():
    config = tiny_config("txv_image_transformer")
    images = _images(2)
    ids = images_to_input_ids(images, config)
    assert ids.shape == (2, 49) and (ids[:, 0] == 256).all()
    assert torch.equal(input_ids_to_images(ids, config), images.to(torch.uint8))
    # Grid 4 x 12 (width * channels), query blocks 2 x 4: the first block is rows 0-1, grid columns 0-3.
    assert generation_order(config)[:8].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert generation_order(tiny_config("txv_image_transformer", attention_type="local_1d")).tolist() == list(range(48))


@pytest.mark.parametrize("attention_type", ["local_1d", "local_2d"])
def test_receptive_field_is_the_papers(attention_type):
    """Changing the intensity carried by step s changes the logits of step t only if the paper's pattern lets t see
    s (one layer): local 1D = own and previous query block; local 2D = memory block (flanges), causally."""
    model = _model(attention_type=attention_type, num_hidden_layers=1)
    config = model.config
    ids = images_to_input_ids(_images(1, 3), config)
    with torch.no_grad():
        base = model(ids).logits[0]
    order = generation_order(config)
    width, (bh, bw), (fh, fw) = config.grid_width, config.query_shape, config.memory_flange
    query = 40
    for key in range(0, query + 1):
        changed = ids.clone()
        changed[0, key] = (changed[0, key] + 77) % 256
        with torch.no_grad():
            moved = not torch.allclose(model(changed).logits[0, query], base[query], atol=1e-6)
        if attention_type == "local_1d":
            expected = key // 8 >= query // 8 - 1
        else:
            q_row, q_col = divmod(int(order[query]), width)
            k_row, k_col = divmod(int(order[key]), width)
            top, left = q_row // bh * bh, q_col // bw * bw
            expected = top - fh <= k_row < top + bh and left - fw <= k_col < left + bw + fw
        assert moved == expected, (key, moved, expected)


@pytest.mark.parametrize("attention_type", ["local_1d", "local_2d"])
def test_implementations_agree(attention_type):
    ids = images_to_input_ids(_images(2, 1), tiny_config("txv_image_transformer"))
    logits = []
    for implementation in ("dense", "blocked", "flex"):
        model = _model(attention_type=attention_type, pattern_implementation=implementation)
        with torch.no_grad():
            logits.append(model(ids).logits)
    for other in logits[1:]:
        torch.testing.assert_close(other, logits[0], atol=1e-5, rtol=0)


def test_loss_is_bits_per_dimension():
    model = _model()
    ids = images_to_input_ids(_images(2, 2), model.config)
    output = model(ids, labels=ids)
    log_probs = torch.log_softmax(output.logits[:, :-1].double(), -1)
    nats = -log_probs.gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(output.loss.double(), nats / math.log(2), atol=1e-5, rtol=0)
    assert abs(output.loss.item() - 8.0) < 0.5  # untrained: about log2(256) bits


@pytest.mark.exact
def test_class_conditioning_and_generation(tmp_path):
    model = _model(num_classes=3)
    ids = images_to_input_ids(_images(1, 4), model.config)
    with torch.no_grad():
        a = model(ids, class_labels=torch.tensor([0])).logits
        b = model(ids, class_labels=torch.tensor([2])).logits
    assert not torch.allclose(a, b)
    with pytest.raises(ValueError, match="class_labels"):
        model(ids)
    torch.manual_seed(0)
    images = model.generate_images(class_labels=torch.tensor([0, 1]))
    assert images.shape == (2, 4, 4, 3) and images.dtype == torch.uint8
    greedy = model.generate_images(class_labels=torch.tensor([1]), do_sample=False)
    # Greedy generation = argmax of the model's own logits, step by step.
    ids = images_to_input_ids(greedy, model.config)
    with torch.no_grad():
        logits = model(ids, class_labels=torch.tensor([1])).logits
    assert torch.equal(logits[0, :-1].argmax(-1), ids[0, 1:])
    path = tmp_path / "samples.png"
    save_png(images, path, scale=2)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 16  # 2 images x 4 px x 2


@pytest.mark.parametrize(
    "field, value", [("attention_type", "global"), ("query_shape", [3, 4]), ("vocab_size", 256), ("image_size", [4])]
)
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_image_transformer", **{field: value})


def test_bad_input_names_tensor():
    config = tiny_config("txv_image_transformer")
    with pytest.raises(ValueError, match="images"):
        images_to_input_ids(torch.zeros(1, 4, 4, 1), config)
    with pytest.raises(ValueError, match="longer than an image"):
        _model()(torch.zeros(1, 50, dtype=torch.long))


def test_images_outside_the_intensity_range_are_refused():
    """Intensities must lie in 0..255: one above or below is a ValueError naming the images and the range found."""
    config = tiny_config("txv_image_transformer")
    height, width = config.image_size
    for bad_value in (256, -1):
        images = torch.zeros(1, height, width, config.num_channels)
        images[0, 0, 0, 0] = bad_value
        with pytest.raises(ValueError, match=rf"images must be in \[0, 256\).*{bad_value}"):
            images_to_input_ids(images, config)


# ------------------------------------------------------------------------------------------------ local 1D memory
@pytest.mark.parametrize("memory_length", [0, 3, 13])
def test_local_1d_memory_length_is_the_papers(memory_length):
    """Parmar et al. 3.2: a query block of l_q positions attends to itself and the l_m positions generated before it.
    One layer: changing step s moves the logits of step t exactly when the paper's set, written here from the text,
    contains s."""
    model = _model(attention_type="local_1d", num_hidden_layers=1, memory_length=memory_length)
    assert model.config.block_length == 8
    ids = images_to_input_ids(_images(1, 4), model.config)
    with torch.no_grad():
        base = model(ids).logits[0]
    query = 21
    block_start = (query // 8) * 8
    paper_set = set(range(max(0, block_start - memory_length), query + 1))
    for key in range(query + 1):
        changed = ids.clone()
        changed[0, key] = (changed[0, key] + 77) % 256
        with torch.no_grad():
            moved = not torch.allclose(model(changed).logits[0, query], base[query], atol=1e-6)
        assert moved == (key in paper_set), (key, moved)


def test_local_1d_memory_length_defaults_to_the_block():
    config = tiny_config("txv_image_transformer", attention_type="local_1d")
    assert config.memory_length == config.block_length == 8
    with pytest.raises(ValueError, match="memory_length"):
        tiny_config("txv_image_transformer", memory_length=-1)


# ------------------------------------------------------------------------------------------------ generation cache
GREEDY = dict(do_sample=False, output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)


def _sharp(model):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


@pytest.mark.exact
@pytest.mark.parametrize(
    "overrides",
    [
        dict(attention_type="local_1d"),
        dict(attention_type="local_1d", memory_length=5),
        dict(attention_type="local_2d", num_classes=3),
        dict(attention_type="local_2d", pattern_implementation="dense"),
    ],
)
def test_cached_generation_equals_recomputing_the_prefix(overrides):
    """Generated with the key/value cache (5 local 1D blocks, or 2.5 block rows of local 2D), the greedy intensities
    and every step's logits equal those of recomputing the prefix at every step."""
    model = _sharp(_model(**overrides))
    start = torch.full((2, 1), 256)
    kwargs = dict(max_new_tokens=40, **GREEDY)
    if model.config.num_classes:
        kwargs["class_labels"] = torch.tensor([0, 2])
    cached = model.generate(start, use_cache=True, **kwargs)
    full = model.generate(start, use_cache=False, **kwargs)
    assert output_cache(cached).get_seq_length() == 40
    assert torch.equal(cached.sequences, full.sequences)
    for step, (a, b) in enumerate(zip(cached.logits, full.logits)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_generate_returns_attentions_and_hidden_states_at_every_step():
    model = _model(attention_type="local_1d")
    out = model.generate(
        torch.full((1, 1), 256), max_new_tokens=3, output_attentions=True, output_hidden_states=True, **GREEDY
    )
    assert all(step is not None and step[0] is not None for step in out.attentions)
    assert all(step is not None and step[0] is not None for step in out.hidden_states)


@pytest.mark.exact
def test_assisted_decoding_gives_the_greedy_tokens():
    model = _sharp(_model(attention_type="local_1d"))
    assistant = _model(attention_type="local_1d", num_hidden_layers=1)
    start = torch.full((1, 1), 256)
    greedy = model.generate(start, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assisted = model.generate(
        start, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0, assistant_model=assistant
    )
    assert torch.equal(assisted, greedy)


def test_shift_labels_are_honoured():
    model = _model()
    ids = images_to_input_ids(_images(2, 5), model.config)
    shifted = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, shift_labels=shifted).loss, model(ids, labels=ids).loss)


@pytest.mark.parametrize("attention_type", ["local_1d", "local_2d"])
@pytest.mark.slow  # torch.export and torch.compile
def test_export_and_compile_trace_the_model(attention_type):
    model = _model(attention_type=attention_type, use_cache=False)
    ids = images_to_input_ids(_images(2, 6), model.config)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        reference = model(ids, attention_mask=mask).logits
        exported = torch.export.export(model, (), {"input_ids": ids, "attention_mask": mask})
        torch.testing.assert_close(exported.module()(input_ids=ids, attention_mask=mask).logits, reference)
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(ids, attention_mask=mask).logits, reference)


def test_png_writer_lives_outside_the_model_file():
    """Issue 15: image I/O is not model code (it would ship in every Hub repo)."""
    import hf_txvariants.modeling_image_transformer as modeling

    assert not hasattr(modeling, "save_png")
    assert "zlib" not in Path(modeling.__file__).read_text()


def test_left_padding_is_refused():
    """Positions (and the local blocks) count from the first column: a left-padded row, or one continuing after
    padding as in batched generation, would silently differ from the row alone, so it is refused; right padding keeps
    each row's outputs."""
    model = _model()
    ids = images_to_input_ids(_images(2, 7), model.config)[:, :12]
    left = torch.ones_like(ids)
    left[1, :3] = 0
    with pytest.raises(ValueError, match="padding must come at the end of a row"):
        model(ids, attention_mask=left)
    with pytest.raises(ValueError, match="padding must come at the end of a row"):
        model.generate(ids, attention_mask=left, max_new_tokens=2, do_sample=False, eos_token_id=None, pad_token_id=0)
    right = torch.ones_like(ids)
    right[1, -3:] = 0
    with torch.no_grad():
        padded = model(ids, attention_mask=right).logits
        alone = model(ids[1:, :-3]).logits
    torch.testing.assert_close(padded[1:, :-3], alone)
