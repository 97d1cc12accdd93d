"""The shared language-modelling losses (txv_losses) and every causal-LM head honouring `shift_labels`
(transformers' loss kwarg for context parallelism: the targets come already shifted, `labels` is then ignored)."""

from __future__ import annotations

import pytest
import torch

import hf_txvariants as txv
from hf_txvariants.txv_losses import causal_lm_loss, next_token_targets
from tiny_configs import SEQ_LENGTHS, model_class, tiny_config


def test_next_token_targets_shift_and_offsets():
    labels = torch.tensor([[1, 2, 3, 4]])
    assert next_token_targets(labels).tolist() == [[2, 3, 4, -100]]
    assert next_token_targets(labels, offset=3).tolist() == [[4, -100, -100, -100]]
    assert next_token_targets(labels, offset=9).tolist() == [[-100, -100, -100, -100]]
    shifted = torch.tensor([[2, 3, 4, 5]])  # e.g. a shard whose last target comes from the next shard
    assert next_token_targets(None, shifted).tolist() == [[2, 3, 4, 5]]
    assert next_token_targets(labels, shifted, offset=2).tolist() == [[3, 4, 5, -100]]
    with pytest.raises(ValueError, match="labels or shift_labels"):
        next_token_targets(None, None)


def test_causal_lm_loss_uses_shift_labels():
    logits = torch.randn(1, 4, 7, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 2, 3, 4]])
    shifted = torch.tensor([[2, 3, 4, 5]])
    naive = torch.nn.functional.cross_entropy(logits[0], shifted[0])
    torch.testing.assert_close(causal_lm_loss(logits, labels, shift_labels=shifted), naive)
    naive_shifted_inside = torch.nn.functional.cross_entropy(logits[0, :3], labels[0, 1:])
    torch.testing.assert_close(causal_lm_loss(logits, labels), naive_shifted_inside)
    with pytest.raises(ValueError, match="shift_labels must have shape"):
        causal_lm_loss(logits, labels, shift_labels=shifted[:, :3])


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("model_type", sorted(txv.VARIANTS))
def test_causal_lm_head_honours_shift_labels(model_type, training):
    """loss(labels=L) == loss(shift_labels=L shifted by one), and with shift_labels given, labels do not matter.
    In training mode the variants' auxiliary losses (Al-Rfou's future targets, ...) take the same targets."""
    config = tiny_config(model_type)
    torch.manual_seed(0)
    model = model_class(model_type, "AutoModelForCausalLM")(config).train(training)
    generator = torch.Generator().manual_seed(0)
    shape = (2, SEQ_LENGTHS.get(model_type, 8))
    input_ids = torch.randint(1, config.vocab_size, shape, generator=generator)
    labels = torch.randint(1, config.vocab_size, shape, generator=generator)
    shift_labels = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)

    def loss(**targets):
        torch.manual_seed(0)  # the same dropout / LSH draws in every call
        return model(input_ids=input_ids, use_cache=False, **targets).loss

    with torch.no_grad():
        reference = loss(labels=labels)
        torch.testing.assert_close(loss(labels=labels, shift_labels=shift_labels), reference)
        torch.testing.assert_close(loss(labels=torch.flip(labels, [1]), shift_labels=shift_labels), reference)
        other_targets = torch.roll(shift_labels, 1, dims=1).masked_fill(shift_labels == -100, -100)
        assert not torch.allclose(loss(labels=labels, shift_labels=other_targets), reference)
