"""One tiny config per variant (keyword arguments of its config class), the start of every test that builds a tiny
model (`tiny_config(model_type, **overrides)`): the shared model tester, transformers' common tests, export/compile,
PEFT, mixed precision, the RL policies. A new variant adds its line here. `general_path_only` turns off
an XL-family model's one-position step for the tests of the general backbone's own caching."""

from __future__ import annotations

import sys

import pytest

import hf_txvariants as txv

TINY_CONFIGS = {
    "transfo-xl": dict(
        vocab_size=40,
        cutoffs=[10, 20],
        div_val=2,
        hidden_size=16,
        d_embed=16,
        num_attention_heads=2,
        head_dim=8,
        intermediate_size=32,
        num_hidden_layers=2,
        mem_len=5,
        clamp_len=6,
        pad_token_id=0,
    ),
    "txv_gtrxl": dict(
        vocab_size=29,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        mem_len=8,
        pad_token_id=0,
    ),
    "txv_vanilla": dict(
        vocab_size=23,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        num_future_targets=2,
        intermediate_loss_weight=1.0,
        pad_token_id=0,
    ),
    "txv_shaw": dict(
        vocab_size=21,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=24,
        max_relative_position=3,
        pad_token_id=0,
    ),
    "txv_r_transformer": dict(
        vocab_size=19,
        hidden_size=16,
        num_hidden_layers=2,
        num_rnn_layers=1,
        num_attention_heads=2,
        local_window=3,
        pad_token_id=0,
    ),
    "txv_universal": dict(
        vocab_size=37,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        halting_bias_init=-1.0,
        pad_token_id=0,
        is_decoder=True,
    ),
    "txv_adaptive_span": dict(
        vocab_size=31,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        attn_span=12,
        adapt_span_ramp=3,
        adapt_span_init=0.25,
        pad_token_id=0,
    ),
    "txv_adaptive_span_original": dict(
        vocab_size=29,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        attn_span=6,
        adapt_span_enabled=True,
        adapt_span_ramp=2,
        adapt_span_init=0.5,
        adapt_span_loss=2e-6,
        adapt_span_cache=True,
        pad_token_id=0,
    ),
    "txv_sparse_transformer": dict(
        vocab_size=37,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        attention_pattern="strided",
        pattern_mode="interleaved",
        stride=3,
        block_size=4,
        pad_token_id=0,
    ),
    "txv_image_transformer": dict(
        image_size=[4, 4],
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        attention_type="local_2d",
        block_length=8,
        query_shape=[2, 4],
        memory_flange=[1, 4],
    ),
    "txv_reformer": dict(
        vocab_size=31,
        hidden_size=16,
        num_attention_heads=2,
        attention_head_size=8,
        feed_forward_size=24,
        attn_layers=["local", "lsh"],
        axial_pos_shape=[8, 8],
        axial_pos_embds_dim=[8, 8],
        max_position_embeddings=64,
        lsh_attn_chunk_length=4,
        local_attn_chunk_length=4,
        num_buckets=4,
        pad_token_id=0,
    ),
    "txv_act_rnn": dict(
        vocab_size=23,
        embedding_size=6,
        hidden_size=8,
        rnn_type="tanh",
        max_ponder_steps=5,
        halting_bias_init=-1.0,
        initializer_range=0.5,
        pad_token_id=0,
    ),
}

# Vocabularies of at least 16: transformers' resize test shrinks the vocabulary by 15.
# Standard config names (hidden_size, ...), not the papers' aliases: transformers' ConfigTester finds every given
# keyword in the saved JSON. (The Universal Transformer's num_hidden_layers is its maximum number of steps.)

# Input length per variant where the default (8) does not fit: the Image Transformer reads one whole image.
SEQ_LENGTHS = {"txv_image_transformer": 4 * 4 * 3}


class _Default:
    def __repr__(self):
        return "DEFAULT"


DEFAULT = _Default()  # as an override: the field is left out of the tiny config, so the config's default applies


def tiny_config(model_type: str, **overrides):
    """The tiny config of `model_type` (`TINY_CONFIGS`) with `overrides` replacing its fields: every test that builds a
    tiny model starts here, and says by its overrides what it needs besides. An override may use a paper's name (it
    reaches the config as given; the tiny config's standard name for the same field is left out), or be `DEFAULT`
    (the field left at the config's default, e.g. a field that is refused while the option using it is off)."""
    return config_class(model_type)(**tiny_config_kwargs(model_type, **overrides))


def tiny_config_kwargs(model_type: str, **overrides) -> dict:
    """The keyword arguments `tiny_config(model_type, **overrides)` passes to the config class."""
    replaced = {config_class(model_type).attribute_map.get(name, name) for name in overrides}
    base = {name: value for name, value in TINY_CONFIGS[model_type].items() if name not in replaced}
    return {**base, **{name: value for name, value in overrides.items() if value is not DEFAULT}}


def config_class(model_type: str):
    return txv.VARIANTS[model_type][0]


def span_off(model_type: str) -> dict:
    """Overrides that leave a tiny config's adaptive-span fields (`adapt_span_*`) at their defaults: set ones are
    refused while the span is off."""
    return {name: DEFAULT for name in TINY_CONFIGS[model_type] if name.startswith("adapt_span_")}


POLICY_GTRXL = {"pad_token_id": DEFAULT, "mem_len": 6}  # the RL tests' GTrXL: the tiny one with these overrides


def tiny_policy_gtrxl(**overrides):
    """The tiny GTrXL of the RL tests' policies (`MemoryPolicy.gtrxl(..., config=tiny_policy_gtrxl())`): no vocabulary
    (observations come in as `inputs_embeds`, as in the configs `MemoryPolicy.gtrxl` builds) and a memory of 6."""
    return tiny_config("txv_gtrxl", **{"vocab_size": 1, **POLICY_GTRXL, **overrides})


def tiny_policy_gtrxl_fields(**overrides) -> dict:
    """`tiny_policy_gtrxl()` as the GTrXL fields that `make_policy` and `memory_module_spec` take (they set the
    vocabulary themselves)."""
    return tiny_config_kwargs("txv_gtrxl", **{"vocab_size": DEFAULT, **POLICY_GTRXL, **overrides})


def model_class(model_type: str, auto_name: str):
    """The class a variant registers for `auto_name` ("AutoModelForCausalLM", ...), or None."""
    _, pretrained_class = txv.VARIANTS[model_type]
    class_name = pretrained_class.auto_classes.get(auto_name)
    return getattr(sys.modules[pretrained_class.__module__], class_name) if class_name else None


def default_attention(model_type: str) -> str:
    """What `from_config` / `from_pretrained` / the class itself choose without `attn_implementation`: sdpa where the
    variant supports it, else eager."""
    _, pretrained_class = txv.VARIANTS[model_type]
    return "sdpa" if pretrained_class._supports_sdpa else "eager"


def attention_cases(model_types: dict) -> list:
    """pytest parameters `(name, attn_implementation)` for `{name: model_type}`: None (the default a user gets, named
    in the test id), then "eager" where the default is not eager. Tests run what users run, and eager as well."""
    cases = []
    for name, model_type in model_types.items():
        default = default_attention(model_type)
        cases.append(pytest.param(name, None, id=f"{name}-{default}(default)"))
        if default != "eager":
            cases.append(pytest.param(name, "eager", id=f"{name}-eager"))
    return cases


# A tiny `txv train` run (TrainArgs fields), shared by the training, objective, data-pipeline and reliability tests,
# and the same as command-line flags.
TINY_TRAINING = dict(
    max_chars=20000,
    d_model=32,
    n_layer=2,
    n_head=2,
    seg_len=16,
    mem_len=16,
    batch_size=4,
    eval_every=0,
    eval_batch_size=2,
    eval_segments=2,
    warmup_steps=1,
    lr=3e-3,
    progress=False,
    tensorboard=False,
)


def training_flags(fields: dict) -> list[str]:
    """`txv train` flags for TrainArgs `fields` (False booleans as `--no-<flag>`)."""
    flags = []
    for name, value in fields.items():
        flag = "--" + name.replace("_", "-")
        if value is False:
            flags.append(flag.replace("--", "--no-", 1))
        elif value is not True:
            flags += [flag, str(value)]
    return flags


TINY_TRAINING_FLAGS = training_flags(TINY_TRAINING)


def general_path_only(model):
    """An XL-family model with its one-position step (`txv_xl_step`) turned off, so that one-token calls run the
    general backbone and its own caching (what the tests that use this check)."""
    model.base_model.step_unsupported = lambda: "turned off by the test"
    return model
