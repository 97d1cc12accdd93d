"""`Trainer` for memory models: transformers 5 removed `TrainingArguments.past_index`, the only way Trainer carried a
Transformer-XL memory between steps. `MemoryTrainer` keeps the memory itself: the training memory is passed to every
training step and replaced by the one the model returns; evaluation starts from an empty memory of its own (and leaves
the training memory untouched). `OrderedSegmentSampler` reads the examples in order, so with a dataset made by
`segment_dataset` each batch continues the rows of the previous one. Models without memory train as with `Trainer`."""

from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler
from transformers import Trainer

from .models import init_memory, uses_memory


class OrderedSegmentSampler(Sampler):
    """Indices 0..n-1 in order, cut to a whole number of batches (a partial batch would break the rows' memory)."""

    def __init__(self, data_source, batch_size: int = 1):
        self.length = (len(data_source) // batch_size) * batch_size

    def __iter__(self):
        return iter(range(self.length))

    def __len__(self):
        return self.length


class MemoryTrainer(Trainer):
    """A `Trainer` that carries a Transformer-XL-family memory across steps and resets it at evaluation.

    Give it a dataset from `segment_dataset(tokens, per_device_batch_size, seg_len)` (one process). It adds
    `<prefix>_bpc` (bits per token: per character for a character tokenizer) and `<prefix>_perplexity` to the
    evaluation metrics."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_memory = None
        self.eval_memory = None
        if self.args.world_size > 1 and uses_memory(self.model):
            raise ValueError(
                "MemoryTrainer carries memory on one process only (Trainer deals batches to processes round-robin, "
                "which breaks the rows' order); use examples/train_lm.py (Accelerate) for multi-process training"
            )

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return OrderedSegmentSampler(dataset, self._train_batch_size)

    def _get_eval_sampler(self, eval_dataset):
        return OrderedSegmentSampler(eval_dataset, self.args.eval_batch_size)

    def _memory_for(self, model, batch_size: int, training: bool):
        memory = self.train_memory if training else self.eval_memory
        if memory is None or (memory.batch_size is not None and memory.batch_size != batch_size):
            memory = init_memory(model, batch_size)
        return memory

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not uses_memory(model):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        training = model.training
        memory = self._memory_for(model, inputs["input_ids"].shape[0], training)
        outputs = model(**inputs, past_key_values=memory, use_cache=True)
        if training:
            self.train_memory = outputs.past_key_values
        else:
            self.eval_memory = outputs.past_key_values
        loss = outputs.loss
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        if not uses_memory(model):
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs).detach()
        return loss, None, None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        self.eval_memory = None  # every evaluation starts from an empty memory
        try:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self.eval_memory = None
        loss = metrics.get(f"{metric_key_prefix}_loss")
        if loss is not None:
            extra = {f"{metric_key_prefix}_bpc": loss / math.log(2), f"{metric_key_prefix}_perplexity": math.exp(min(loss, 50))}
            metrics.update(extra)
            self.log(extra)
        return metrics
