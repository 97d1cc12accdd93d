"""Every variant's causal LM trains under mixed precision: a forward + backward under `torch.autocast` (bfloat16,
float16) and with the model cast to bfloat16 gives a finite loss and finite gradients, close to the float32 run of
the same weights within a tolerance that fits the dtype. Issue 12, item 1 (the GPU side: tests/test_cuda.py).

Each case runs on the attention implementation a user gets by default (`from_config` without `attn_implementation`:
sdpa wherever the variant supports it) and on eager where that differs (issue 24: the suite ran eager only while the
default path crashed under autocast); the test id names the implementation, and `build` checks it is the one used.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_txvariants  # noqa: F401  (registers the Auto classes)
import tiny_configs

NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0)
# name: model_type, tiny_config overrides (dropout off: the comparison with float32 needs the same masks), length
VARIANTS = {
    "transfo-xl div_val 2": ("transfo-xl", dict(same_length=True, **NO_DROPOUT), 12),
    "transfo-xl div_val 1": ("transfo-xl", dict(div_val=1, **NO_DROPOUT), 12),
    "gtrxl": ("txv_gtrxl", NO_DROPOUT, 12),
    "vanilla": ("txv_vanilla", NO_DROPOUT, 12),
    "shaw": ("txv_shaw", NO_DROPOUT, 12),
    "r_transformer": ("txv_r_transformer", dict(embedding_dropout=0.0, **NO_DROPOUT), 12),
    "universal": ("txv_universal", NO_DROPOUT, 12),
    "adaptive_span": ("txv_adaptive_span", dict(dropout=0.0), 12),
    "sparse_transformer": ("txv_sparse_transformer", NO_DROPOUT, 24),
    "image_transformer": ("txv_image_transformer", NO_DROPOUT, 48),
    "act_rnn": ("txv_act_rnn", dict(dropout=0.0), 12),
    "reformer": (  # two hashing rounds under a fixed seed: the float32 and low-precision runs hash alike
        "txv_reformer",
        dict(
            num_hashes=2,
            hash_seed=7,
            hidden_dropout_prob=0.0,
            local_attention_probs_dropout_prob=0.0,
            lsh_attention_probs_dropout_prob=0.0,
        ),
        64,
    ),
}
# (how the low precision is applied, dtype): autocast of the float32 model, or the whole model cast
PRECISIONS = {
    "autocast-bf16": ("autocast", torch.bfloat16),
    "autocast-fp16": ("autocast", torch.float16),
    "bf16-weights": ("cast", torch.bfloat16),
}
# relative tolerance on the loss and on the gradient (as a whole: ||g - g_fp32|| / ||g_fp32||): bfloat16 keeps 8
# mantissa bits (relative rounding 2^-8 = 0.4% per op), float16 11 bits; a tiny model accumulates a few of those
LOSS_TOLERANCE = {torch.bfloat16: 0.01, torch.float16: 0.002}
GRADIENT_TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}

# The Reformer's LSH masks were hard-coded (-1e9, -1e5 in txv_lsh.py), beyond float16's range (65504): its float16
# rows below are the regression test (txv_lsh now scores in float32).


def attention_cases(names) -> list:
    """`(variant, attn_implementation)` parameters for the named variants: the default (None), then eager where the
    default is not eager."""
    return tiny_configs.attention_cases({name: VARIANTS[name][0] for name in names})


def build(name: str, device: str = "cpu", attn_implementation: str | None = None, **overrides):
    """The variant's causal LM in train mode; `attn_implementation` None is what a user gets by default."""
    model_type, kwargs, length = VARIANTS[name]
    config = tiny_configs.tiny_config(model_type, **{**kwargs, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).train().to(device)
    expected = attn_implementation or tiny_configs.default_attention(model_type)
    assert model.config._attn_implementation == expected, (model.config._attn_implementation, expected)
    ids = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))
    return model, ids.to(device)


def loss_and_gradients(model, ids, forward=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`forward`: what computes the loss (e.g. `torch.compile(model)`), `model` by default."""
    model.zero_grad()
    loss = (model if forward is None else forward)(input_ids=ids, labels=ids).loss
    loss.backward()
    gradients = {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach().float(), gradients


def run_in_precision(model, ids, how: str, dtype: torch.dtype):
    if how == "cast":
        return loss_and_gradients(model.to(dtype), ids)
    with torch.autocast(ids.device.type, dtype=dtype):
        return loss_and_gradients(model, ids)


def relative_gradient_error(gradients, reference) -> float:
    difference = sum(((gradients[name] - reference[name]) ** 2).sum() for name in reference)
    return float(difference.sqrt() / sum((g**2).sum() for g in reference.values()).sqrt())


def check_mixed_precision_training(variant: str, precision: str, device: str, **build_kwargs):
    """The float32 run, then the same weights in `precision`: finite, and close to float32."""
    how, dtype = PRECISIONS[precision]
    model, ids = build(variant, device, **build_kwargs)
    reference_loss, reference_gradients = loss_and_gradients(model, ids)
    loss, gradients = run_in_precision(copy.deepcopy(model), ids, how, dtype)

    assert torch.isfinite(loss), f"{variant} {precision}: loss {loss}"
    not_finite = [name for name, g in gradients.items() if not torch.isfinite(g).all()]
    assert not not_finite, f"{variant} {precision}: non-finite gradients in {not_finite}"
    assert set(gradients) == set(reference_gradients), "the same parameters get gradients"
    assert abs(loss - reference_loss) <= LOSS_TOLERANCE[dtype] * max(1.0, abs(reference_loss))
    assert relative_gradient_error(gradients, reference_gradients) <= GRADIENT_TOLERANCE[dtype]


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize(("variant", "attn_implementation"), attention_cases(VARIANTS))
def test_trains_in_mixed_precision_close_to_float32(variant, attn_implementation, precision):
    check_mixed_precision_training(variant, precision, "cpu", attn_implementation=attn_implementation)


def without_dropout_overrides(kwargs: dict) -> dict:
    """The overrides less the dropout settings this file pins to 0 (the variant's defaults then apply)."""
    return {key: value for key, value in kwargs.items() if "drop" not in key}


def has_default_dropout(variant: str) -> bool:
    model_type, kwargs, _ = VARIANTS[variant]
    config = tiny_configs.tiny_config(model_type, **without_dropout_overrides(kwargs))
    return any(value for key, value in config.to_dict().items() if "drop" in key and isinstance(value, float))


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("variant", [name for name in VARIANTS if has_default_dropout(name)])
def test_trains_in_mixed_precision_with_the_default_dropout(variant, precision):
    """What a user runs: the default attention and the variant's default dropout (the comparison with float32 above
    needs dropout off, since the masks differ between runs): a finite loss and finite gradients for every parameter
    that gets one in float32. Variants whose default dropout is 0 are covered above."""
    model_type, kwargs, length = VARIANTS[variant]
    config = tiny_configs.tiny_config(model_type, **without_dropout_overrides(kwargs))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    assert model.config._attn_implementation == tiny_configs.default_attention(model_type)
    ids = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))
    _, reference_gradients = loss_and_gradients(model, ids)
    how, dtype = PRECISIONS[precision]
    loss, gradients = run_in_precision(copy.deepcopy(model), ids, how, dtype)
    assert torch.isfinite(loss), f"{variant} {precision}: loss {loss}"
    assert set(gradients) == set(reference_gradients)
    not_finite = [name for name, g in gradients.items() if not torch.isfinite(g).all()]
    assert not not_finite, f"{variant} {precision}: non-finite gradients in {not_finite}"
