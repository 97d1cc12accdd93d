"""PEFT: `get_peft_model(model, LoraConfig(...))` finds each variant's target modules by itself (registered by
`hf_txvariants.peft_targets`), and a training step changes the LoRA weights only."""

from __future__ import annotations

import pytest
import torch

import hf_txvariants as txv
from hf_txvariants.peft_targets import LORA_TARGET_MODULES
from tiny_configs import SEQ_LENGTHS, model_class, tiny_config

peft = pytest.importorskip("peft")

# Target names a tiny config does not instantiate (the Reformer's LSH layers have `query_key`, local layers `query`).
_ABSENT_FROM_TINY_CONFIG: dict[str, set[str]] = {}


def test_every_variant_has_lora_targets():
    assert set(LORA_TARGET_MODULES) == set(txv.VARIANTS)
    for model_type, modules in LORA_TARGET_MODULES.items():
        assert peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING[model_type] == modules


@pytest.mark.exact
# peft 0.21's PeftModel reads transformers' deprecated `is_gradient_checkpointing`: peft's call, not the plugin's
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("model_type", sorted(txv.VARIANTS))
def test_lora_wraps_variant_and_trains_only_adapters(model_type):
    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = model_class(model_type, "AutoModelForCausalLM")(config)
    # init_lora_weights=False: lora_B random rather than zero, so that one step moves every adapter weight.
    lora_config = peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, init_lora_weights=False)
    lora_model = peft.get_peft_model(model, lora_config)

    adapted = {name.split(".")[-1] for name, module in lora_model.named_modules() if hasattr(module, "lora_A")}
    assert adapted == set(LORA_TARGET_MODULES[model_type]) - _ABSENT_FROM_TINY_CONFIG.get(model_type, set())
    trainable = {name for name, parameter in lora_model.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)

    before = {name: parameter.detach().clone() for name, parameter in lora_model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, config.vocab_size, (2, SEQ_LENGTHS.get(model_type, 8)), generator=generator)
    optimizer = torch.optim.Adam([p for p in lora_model.parameters() if p.requires_grad], lr=1e-2)
    lora_model.train()
    lora_model(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()
    optimizer.step()

    changed = {name for name, parameter in lora_model.named_parameters() if not torch.equal(parameter, before[name])}
    assert changed <= trainable, f"non-LoRA weights changed: {sorted(changed - trainable)}"
    # Every adapter is on the forward path (a module whose weight is used directly would bypass its adapter).
    assert changed == trainable, f"LoRA weights that did not train: {sorted(trainable - changed)}"
