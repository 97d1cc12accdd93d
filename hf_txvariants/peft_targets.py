"""The modules LoRA adapts in each variant, registered with PEFT (when installed) so that
`get_peft_model(model, LoraConfig(...))` works without `target_modules`, as for transformers' own models.

The attention projections, as PEFT does for Llama (queries and values), in each variant's own names. Called by the
package root; a model loaded by remote code (without this package) needs `LoraConfig(target_modules=...)` with the
names below, which each model card also lists.
"""

from __future__ import annotations

import importlib.util

LORA_TARGET_MODULES = {
    "transfo-xl": ["qkv_net", "o_net"],  # the XL family computes q, k, v with one fused projection
    "txv_gtrxl": ["qkv_net", "o_net"],
    "txv_adaptive_span": ["qkv_net", "o_net"],
    "txv_adaptive_span_original": ["proj_query", "proj_val"],
    "txv_vanilla": ["q_proj", "v_proj"],
    "txv_shaw": ["q_proj", "v_proj"],
    "txv_r_transformer": ["q_proj", "v_proj"],
    "txv_universal": ["q_proj", "v_proj"],
    "txv_sparse_transformer": ["q_proj", "v_proj"],
    "txv_image_transformer": ["q_proj", "v_proj"],
    "txv_reformer": ["query_key", "query", "value"],  # LSH layers share query/key; local layers have their own
    # PEFT's LoRA has no layer for RNN cells (nn.RNNCell/GRUCell/LSTMCell): the ACT RNN adapts its input embedding
    "txv_act_rnn": ["embed_tokens"],
}


def register_peft_target_modules() -> bool:
    """Adds the variants to PEFT's LoRA target-module table (entries PEFT already has are kept). False without PEFT."""
    if importlib.util.find_spec("peft") is None:
        return False
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as lora_targets

    for model_type, modules in LORA_TARGET_MODULES.items():
        lora_targets.setdefault(model_type, list(modules))
    return True
