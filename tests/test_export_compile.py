"""Every variant's causal LM traces whole: `torch.export.export` and `torch.compile(fullgraph=True)` give the eager
logits. A data-dependent Python check in a forward (`if tensor.any(): raise`) breaks both; such checks are written so
that they run in eager mode only, or are moved to config time. Each variant is traced on its default attention
implementation (what a user gets) and on eager where that differs; the test id names it."""

from __future__ import annotations

import pytest
import torch

import hf_txvariants as txv
from tiny_configs import SEQ_LENGTHS, attention_cases, default_attention, model_class, tiny_config

pytestmark = pytest.mark.slow  # tracing costs a few seconds per model

VARIANTS = sorted(txv.VARIANTS)
CASES = attention_cases({model_type: model_type for model_type in VARIANTS})
NEEDS_DYNAMO_RNN = {"txv_r_transformer"}


def _causal_lm_and_inputs(model_type, attn_implementation):
    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = model_class(model_type, "AutoModelForCausalLM")(config).eval()
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    assert model.config._attn_implementation == (attn_implementation or default_attention(model_type))
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, config.vocab_size, (2, SEQ_LENGTHS.get(model_type, 8)), generator=generator)
    return model, {"input_ids": input_ids, "use_cache": False}


class LogitsOnly(torch.nn.Module):
    """The model's logits as a plain tensor (export needs tensor outputs, not a ModelOutput with a cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


@pytest.mark.parametrize(("model_type", "attn_implementation"), CASES)
def test_torch_export_equals_eager(model_type, attn_implementation):
    model, inputs = _causal_lm_and_inputs(model_type, attn_implementation)
    wrapped = LogitsOnly(model).eval()
    with torch.no_grad():
        expected = wrapped(inputs["input_ids"])
        exported = torch.export.export(wrapped, (inputs["input_ids"],), strict=False)
        actual = exported.module()(inputs["input_ids"])
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "attn_implementation"), CASES)
def test_torch_compile_fullgraph_equals_eager(model_type, attn_implementation):
    model, inputs = _causal_lm_and_inputs(model_type, attn_implementation)
    wrapped = LogitsOnly(model).eval()
    torch._dynamo.reset()
    compiled = torch.compile(wrapped, fullgraph=True, backend="aot_eager")
    # TorchDynamo refuses nn.GRU / nn.LSTM / nn.RNN modules unless its `allow_rnn` switch is on (the R-Transformer's
    # LocalRNN): users set torch._dynamo.config.allow_rnn = True, as its model card says.
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=model_type in NEEDS_DYNAMO_RNN):
        expected = wrapped(inputs["input_ids"])
        actual = compiled(inputs["input_ids"])
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
