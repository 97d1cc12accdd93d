"""Plain causal attention reaches SDPA's fused causal kernel (`is_causal=True`, no mask) and stays equal to the
explicit-mask reference; padding and caches keep the explicit mask."""

import pytest
import torch
from torch import nn

from hf_txvariants import RTransformerForCausalLM, VanillaConfig, VanillaForCausalLM
from hf_txvariants.txv_attention import CausalMask, attention_forward, eager_attention_forward
from hf_txvariants.txv_mha import self_attention_mask
from tiny_configs import tiny_config


class SdpaSpy:
    """Records the `is_causal` flag and whether a mask was given, for every SDPA call."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = torch.nn.functional.scaled_dot_product_attention

        def spy(*args, **kwargs):
            self.calls.append((bool(kwargs.get("is_causal", False)), kwargs.get("attn_mask") is not None))
            return original(*args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)


def _qkv(length=10, past=0, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 3, length, 8, generator=generator)
    key, value = (torch.randn(2, 3, past + length, 8, generator=generator) for _ in range(2))
    return query, key, value


@pytest.mark.parametrize("length, past", [(10, 0), (4, 6), (1, 9)])
def test_causal_mask_equals_dense_mask(length, past, monkeypatch):
    spy = SdpaSpy(monkeypatch)
    module = nn.Module()
    query, key, value = _qkv(length, past)
    dense = self_attention_mask(None, 2, length, past, True, torch.float32, "cpu")
    expected, _ = eager_attention_forward(module, query, key, value, dense, scaling=0.3)
    fused, _ = attention_forward(module, "sdpa", query, key, value, CausalMask(past), scaling=0.3)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=0)
    # No cache: the fused causal kernel; a cache: an explicit mask (is_causal would align to the top left); one
    # query: no mask at all.
    assert spy.calls == [{(10, 0): (True, False), (4, 6): (False, True), (1, 9): (False, False)}[length, past]]
    eager, _ = attention_forward(module, "eager", query, key, value, CausalMask(past), scaling=0.3)
    torch.testing.assert_close(eager, expected, atol=1e-6, rtol=0)


def test_fused_mask_keeps_padding_explicit():
    ones = torch.ones(2, 6, dtype=torch.long)
    assert self_attention_mask(ones, 2, 6, 0, True, torch.float32, "cpu", fused=True) == CausalMask(0)
    assert self_attention_mask(None, 2, 6, 0, False, torch.float32, "cpu", fused=True) is None
    padded = ones.clone()
    padded[0, 0] = 0
    torch.testing.assert_close(
        self_attention_mask(padded, 2, 6, 0, True, torch.float32, "cpu", fused=True),
        self_attention_mask(padded, 2, 6, 0, True, torch.float32, "cpu"),
    )
    with pytest.raises(ValueError, match="attention_mask"):
        self_attention_mask(torch.ones(2, 5), 2, 6, 0, True, torch.float32, "cpu", fused=True)


@pytest.mark.parametrize(
    "config",
    [tiny_config("txv_vanilla"), tiny_config("txv_r_transformer")],
    ids=["vanilla", "r_transformer"],
)
def test_models_reach_fused_causal_kernel(config, monkeypatch):
    torch.manual_seed(0)
    model = (VanillaForCausalLM if isinstance(config, VanillaConfig) else RTransformerForCausalLM)(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        expected = model(ids).logits
    model.set_attn_implementation("sdpa")
    spy = SdpaSpy(monkeypatch)
    with torch.no_grad():
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    assert spy.calls and all(call == (True, False) for call in spy.calls)
