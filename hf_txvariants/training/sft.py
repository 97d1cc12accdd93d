"""Fine-tuning with TRL (the `trl` extra): `TxvSFTTrainer`, TRL's `SFTTrainer` trained on each variant's own
objective.

TRL's `SFTTrainer` computes its loss in a fused LM head of its own: it runs `model.base_model`, takes the last
hidden state and projects it through `model.get_output_embeddings().weight`. With hf_txvariants models that
- fails for Transformer-XL with an adaptive softmax (`cutoffs` non-empty): it has no single output matrix
  (`get_output_embeddings()` is None) and TRL stops at the first step with
  `AttributeError: 'NoneType' object has no attribute 'weight'`;
- leaves out every auxiliary term of the variants' objectives: the span penalty (txv_adaptive_span,
  txv_adaptive_span_original), the ponder cost (txv_universal, txv_act_rnn), Al-Rfou's intermediate-layer and
  multiple-target losses (txv_vanilla), the adaptive span of a gated Transformer-XL (txv_gtrxl with
  adapt_span_enabled); the spans and halting units then get no gradient towards being short.

`TxvSFTTrainer` keeps everything of `SFTTrainer` (datasets, chat templates, collators, PEFT, packing) but the loss:
the model's own `outputs.loss` with the labels, as `txv train` and `MemoryTrainer` optimise it (its own LM head,
adaptive softmax included, plus the auxiliary terms), with Al-Rfou's schedule and the span clamping as callbacks.
TRL's token-accuracy and entropy metrics, which come from its fused head, are not logged. Each batch starts without a
memory (SFT rows are independent examples)."""

from __future__ import annotations

from transformers import Trainer
from trl import SFTTrainer

from .callbacks import add_objective_callbacks


class TxvSFTTrainer(SFTTrainer):
    """`trl.SFTTrainer` whose loss is the model's own objective (see the module's docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        add_objective_callbacks(self)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = {**inputs, "use_cache": False}
        # transformers' Trainer.compute_loss: `model(**inputs)` with the labels, the loss the model returns
        return Trainer.compute_loss(
            self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )


__all__ = ["TxvSFTTrainer"]
