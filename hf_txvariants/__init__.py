"""hf-txvariants: the Transformer family from the classic papers as Hugging Face models.

`import hf_txvariants` registers every config and model with the transformers Auto classes."""

import sys

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageToImage,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from .configuration_act_rnn import ACTRNNConfig
from .configuration_adaptive_span import AdaptiveSpanConfig
from .configuration_adaptive_span_original import AdaptiveSpanOriginalConfig
from .configuration_gtrxl import GTrXLConfig
from .configuration_image_transformer import ImageTransformerConfig
from .configuration_r_transformer import RTransformerConfig
from .configuration_shaw import ShawConfig
from .configuration_sparse_transformer import SparseTransformerConfig
from .configuration_transfo_xl import TransfoXLConfig
from .configuration_txv_reformer import TxvReformerConfig
from .configuration_universal import UniversalTransformerConfig
from .configuration_vanilla import VanillaConfig
from .modeling_act_rnn import (
    ACTRNNForCausalLM,
    ACTRNNForSequenceClassification,
    ACTRNNModel,
    ACTRNNPreTrainedModel,
)
from .modeling_adaptive_span import (
    AdaptiveSpanForCausalLM,
    AdaptiveSpanModel,
    AdaptiveSpanPreTrainedModel,
)
from .modeling_adaptive_span_original import (
    AdaptiveSpanOriginalForCausalLM,
    AdaptiveSpanOriginalModel,
    AdaptiveSpanOriginalPreTrainedModel,
)
from .modeling_gtrxl import GTrXLForCausalLM, GTrXLModel, GTrXLPreTrainedModel
from .modeling_image_transformer import (
    ImageTransformerForCausalLM,
    ImageTransformerForSuperResolution,
    ImageTransformerModel,
    ImageTransformerPreTrainedModel,
)
from .modeling_r_transformer import (
    RTransformerForCausalLM,
    RTransformerForSequenceClassification,
    RTransformerModel,
    RTransformerPreTrainedModel,
)
from .modeling_shaw import (
    ShawForCausalLM,
    ShawForMaskedLM,
    ShawForSequenceClassification,
    ShawModel,
    ShawPreTrainedModel,
)
from .modeling_sparse_transformer import (
    SparseTransformerForCausalLM,
    SparseTransformerForSequenceClassification,
    SparseTransformerModel,
    SparseTransformerPreTrainedModel,
)
from .modeling_transfo_xl import (
    TransfoXLForSequenceClassification,
    TransfoXLLMHeadModel,
    TransfoXLModel,
    TransfoXLPreTrainedModel,
)
from .modeling_txv_reformer import (
    TxvReformerCache,
    TxvReformerForCausalLM,
    TxvReformerForSequenceClassification,
    TxvReformerModel,
    TxvReformerPreTrainedModel,
)
from .modeling_universal import (
    UniversalTransformerForCausalLM,
    UniversalTransformerForMaskedLM,
    UniversalTransformerForSequenceClassification,
    UniversalTransformerModel,
    UniversalTransformerPreTrainedModel,
)
from .modeling_vanilla import (
    VanillaForCausalLM,
    VanillaForMaskedLM,
    VanillaForSequenceClassification,
    VanillaModel,
    VanillaPreTrainedModel,
)
from .peft_targets import register_peft_target_modules
from .tokenization_transfo_xl import TransfoXLTokenizer
from .txv_compat import check_transformers_version
from .txv_span_cache import SpanCache
from .txv_xl_memory import MemoryCache

__version__ = "0.1.0"

AUTO_CLASSES = {
    "AutoModel": AutoModel,
    "AutoModelForCausalLM": AutoModelForCausalLM,
    "AutoModelForImageToImage": AutoModelForImageToImage,
    "AutoModelForMaskedLM": AutoModelForMaskedLM,
    "AutoModelForSequenceClassification": AutoModelForSequenceClassification,
}

# One line per variant: its config class and the module holding the classes named in its `auto_classes`.
VARIANTS = {
    "transfo-xl": (TransfoXLConfig, TransfoXLPreTrainedModel),
    "txv_gtrxl": (GTrXLConfig, GTrXLPreTrainedModel),
    "txv_vanilla": (VanillaConfig, VanillaPreTrainedModel),
    "txv_shaw": (ShawConfig, ShawPreTrainedModel),
    "txv_r_transformer": (RTransformerConfig, RTransformerPreTrainedModel),
    "txv_universal": (UniversalTransformerConfig, UniversalTransformerPreTrainedModel),
    "txv_adaptive_span": (AdaptiveSpanConfig, AdaptiveSpanPreTrainedModel),
    "txv_adaptive_span_original": (AdaptiveSpanOriginalConfig, AdaptiveSpanOriginalPreTrainedModel),
    "txv_sparse_transformer": (SparseTransformerConfig, SparseTransformerPreTrainedModel),
    "txv_image_transformer": (ImageTransformerConfig, ImageTransformerPreTrainedModel),
    "txv_reformer": (TxvReformerConfig, TxvReformerPreTrainedModel),
    "txv_act_rnn": (ACTRNNConfig, ACTRNNPreTrainedModel),
}

# The standard ForCausalLM name for Transformer-XL's LM head.
TransfoXLForCausalLM = TransfoXLLMHeadModel


def _register(config_class, pretrained_class):
    module = sys.modules[pretrained_class.__module__]
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    for auto_name, class_name in pretrained_class.auto_classes.items():
        AUTO_CLASSES[auto_name].register(config_class, getattr(module, class_name), exist_ok=True)


check_transformers_version()

for _config_class, _pretrained_class in VARIANTS.values():
    _register(_config_class, _pretrained_class)
# Legacy `transfo-xl` folders name "TransfoXLTokenizer" in tokenizer_config.json (or nothing: then the config's type)
AutoTokenizer.register(TransfoXLConfig, tokenizer_class=TransfoXLTokenizer, exist_ok=True)
register_peft_target_modules()

__all__ = [
    "ACTRNNConfig",
    "ACTRNNForCausalLM",
    "ACTRNNForSequenceClassification",
    "ACTRNNModel",
    "ACTRNNPreTrainedModel",
    "AdaptiveSpanConfig",
    "AdaptiveSpanForCausalLM",
    "AdaptiveSpanModel",
    "AdaptiveSpanOriginalConfig",
    "AdaptiveSpanOriginalForCausalLM",
    "AdaptiveSpanOriginalModel",
    "AdaptiveSpanOriginalPreTrainedModel",
    "AdaptiveSpanPreTrainedModel",
    "GTrXLConfig",
    "GTrXLForCausalLM",
    "GTrXLModel",
    "GTrXLPreTrainedModel",
    "ImageTransformerConfig",
    "ImageTransformerForCausalLM",
    "ImageTransformerForSuperResolution",
    "ImageTransformerModel",
    "ImageTransformerPreTrainedModel",
    "MemoryCache",
    "RTransformerConfig",
    "RTransformerForCausalLM",
    "RTransformerForSequenceClassification",
    "RTransformerModel",
    "RTransformerPreTrainedModel",
    "ShawConfig",
    "ShawForCausalLM",
    "ShawForMaskedLM",
    "ShawForSequenceClassification",
    "ShawModel",
    "ShawPreTrainedModel",
    "SpanCache",
    "SparseTransformerConfig",
    "SparseTransformerForCausalLM",
    "SparseTransformerForSequenceClassification",
    "SparseTransformerModel",
    "SparseTransformerPreTrainedModel",
    "TransfoXLConfig",
    "TransfoXLForCausalLM",
    "TransfoXLForSequenceClassification",
    "TransfoXLLMHeadModel",
    "TransfoXLModel",
    "TransfoXLPreTrainedModel",
    "TransfoXLTokenizer",
    "TxvReformerCache",
    "TxvReformerConfig",
    "TxvReformerForCausalLM",
    "TxvReformerForSequenceClassification",
    "TxvReformerModel",
    "TxvReformerPreTrainedModel",
    "UniversalTransformerConfig",
    "UniversalTransformerForCausalLM",
    "UniversalTransformerForMaskedLM",
    "UniversalTransformerForSequenceClassification",
    "UniversalTransformerModel",
    "UniversalTransformerPreTrainedModel",
    "VARIANTS",
    "VanillaConfig",
    "VanillaForCausalLM",
    "VanillaForMaskedLM",
    "VanillaForSequenceClassification",
    "VanillaModel",
    "VanillaPreTrainedModel",
]
