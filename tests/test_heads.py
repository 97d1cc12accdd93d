"""The task heads of every variant (each written in its modeling file): what each head promises, checked the same way
everywhere."""

from __future__ import annotations

import pytest
import torch

from tiny_configs import SEQ_LENGTHS, TINY_CONFIGS, model_class, tiny_config

CAUSAL_LM_TYPES = [t for t in TINY_CONFIGS if model_class(t, "AutoModelForCausalLM") is not None]
CLASSIFIER_TYPES = [t for t in TINY_CONFIGS if model_class(t, "AutoModelForSequenceClassification") is not None]


def tiny_inputs(model_type: str, config, batch: int = 2) -> torch.Tensor:
    length = SEQ_LENGTHS.get(model_type, 8)
    generator = torch.Generator().manual_seed(0)
    if model_type == "txv_image_transformer":  # start token, then intensities
        ids = torch.randint(0, 256, (batch, length), generator=generator)
        ids[:, 0] = 256
        return ids
    return torch.randint(1, config.vocab_size, (batch, length), generator=generator)


def build(model_type: str, auto_name: str):
    torch.manual_seed(0)
    config = tiny_config(model_type)
    return model_class(model_type, auto_name)(config).eval(), config


@pytest.mark.parametrize("model_type", CAUSAL_LM_TYPES)
def test_logits_to_keep_with_labels_keeps_the_full_loss(model_type):
    """With labels, `logits_to_keep` cuts only the returned logits: the loss is still over every position (cutting the
    logits before the loss mis-shaped it against the labels)."""
    model, config = build(model_type, "AutoModelForCausalLM")
    input_ids = tiny_inputs(model_type, config)
    with torch.no_grad():
        torch.manual_seed(1)
        full = model(input_ids=input_ids, labels=input_ids, use_cache=False)
        torch.manual_seed(1)
        kept = model(input_ids=input_ids, labels=input_ids, use_cache=False, logits_to_keep=2)
    assert kept.logits.shape[1] == 2
    torch.testing.assert_close(kept.logits, full.logits[:, -2:])
    torch.testing.assert_close(kept.loss, full.loss)


@pytest.mark.parametrize(
    "model_type",
    [
        t
        for t in CAUSAL_LM_TYPES
        if "return_logits" in getattr(model_class(t, "AutoModelForCausalLM"), "head_options", ())
    ],
)
def test_return_logits_false_leaves_the_logits_out_and_the_loss_unchanged(model_type):
    """`return_logits=False` (a head option of the XL family: what the training loop and MemoryTrainer pass) gives
    no logits and the same loss."""
    model, config = build(model_type, "AutoModelForCausalLM")
    input_ids = tiny_inputs(model_type, config)
    with torch.no_grad():
        full = model(input_ids=input_ids, labels=input_ids, use_cache=False)
        loss_only = model(input_ids=input_ids, labels=input_ids, use_cache=False, return_logits=False)
    assert full.logits is not None and loss_only.logits is None
    torch.testing.assert_close(loss_only.loss, full.loss)


@pytest.mark.parametrize("model_type", CAUSAL_LM_TYPES)
def test_trainer_sees_labels_as_the_only_label_argument(model_type):
    """The Trainer computes an evaluation loss only when the batch holds every forward argument named like a label
    (`find_labels`); `shift_labels` is therefore a keyword (a loss kwarg), not a named argument, or `evaluate()` on
    batches with `labels` reports no `eval_loss`."""
    from transformers.utils import find_labels

    assert find_labels(model_class(model_type, "AutoModelForCausalLM")) == ["labels"]


@pytest.mark.parametrize("model_type", CLASSIFIER_TYPES)
def test_sequence_classification_reads_the_last_real_token(model_type):
    """The classifier's logits of a right-padded row are those of the row alone (pooled at its last real token, or
    averaged over its real positions), and the loss is the cross-entropy of those logits."""
    model, config = build(model_type, "AutoModelForSequenceClassification")
    input_ids = tiny_inputs(model_type, config, batch=1)
    length = input_ids.shape[1]
    padded = torch.cat([input_ids, torch.full((1, 3), config.pad_token_id)], dim=1)
    mask = torch.cat([torch.ones(1, length, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)], dim=1)
    labels = torch.tensor([1])
    with torch.no_grad():
        torch.manual_seed(1)
        alone = model(input_ids=input_ids, labels=labels)
        torch.manual_seed(1)
        with_padding = model(input_ids=padded, attention_mask=mask, labels=labels)
    torch.testing.assert_close(with_padding.logits, alone.logits, atol=1e-5, rtol=1e-5)
    expected = torch.nn.functional.cross_entropy(alone.logits, labels)
    if getattr(alone, "ponder_cost", None) is None:
        torch.testing.assert_close(alone.loss, expected)
    else:  # plus the ponder cost (ACT), which is at least 1 per position
        assert alone.loss > expected
