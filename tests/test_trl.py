"""Fine-tuning with TRL (the `trl` extra; skipped without it): `TxvSFTTrainer` runs SFT on a tiny model of every text
variant on the model's own objective (auxiliary terms included); plain `SFTTrainer` on a Transformer-XL with an
adaptive softmax fails at its fused LM head, as README "Training, fine-tuning, the Hub" says."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'hf-txvariants[trl]')")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hf_txvariants.training import build_char_tokenizer  # noqa: E402
from hf_txvariants.training.models import AUXILIARY_TERMS, text_variant_names  # noqa: E402
from hf_txvariants.training.sft import TxvSFTTrainer  # noqa: E402
from tiny_configs import TINY_CONFIGS, tiny_config  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def _setup(variant, tmp_path, trainer_class=TxvSFTTrainer, steps=8, **config):
    tokenizer = build_char_tokenizer(TEXT)
    torch.manual_seed(0)
    overrides = {"vocab_size": len(tokenizer)} if "vocab_size" in TINY_CONFIGS[variant] else {}
    overrides.update(config)
    model = AutoModelForCausalLM.from_config(tiny_config(variant, **overrides))
    dataset = Dataset.from_dict({"text": [TEXT[i : i + 30] for i in range(0, 600, 30)]})
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        max_length=32,
        save_strategy="no",
        disable_tqdm=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


@pytest.mark.parametrize("variant", text_variant_names())
def test_txv_sft_trainer_fine_tunes_every_text_variant(variant, tmp_path):
    trainer = _setup(variant, tmp_path)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 8 and all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("variant", text_variant_names())
def test_txv_sft_loss_is_the_models_own_objective(variant, tmp_path):
    """The loss TxvSFTTrainer optimises is the model's `outputs.loss` on the batch (the next-token loss plus the
    variant's auxiliary terms)."""
    trainer = _setup(variant, tmp_path, steps=1)
    batch = next(iter(trainer.get_train_dataloader()))
    model = trainer.model.train()  # the auxiliary terms are training terms
    with torch.no_grad():
        torch.manual_seed(1)  # the same dropout (and LSH rotations) in both calls
        loss = trainer.compute_loss(model, dict(batch))
        torch.manual_seed(1)
        own = model(**batch, use_cache=False)
    torch.testing.assert_close(loss, own.loss)


@pytest.mark.parametrize(
    "variant, config",
    [("txv_adaptive_span", {"adapt_span_loss": 0.1}), ("txv_vanilla", {}), ("txv_universal", {"act_loss_weight": 0.1})],
)
def test_trl_loss_leaves_out_the_auxiliary_terms_and_txv_sft_keeps_them(variant, config, tmp_path):
    """On one batch: plain SFTTrainer's loss is the next-token loss alone; TxvSFTTrainer's adds the span penalty,
    Al-Rfou's losses, the ponder cost (README "Training, fine-tuning, the Hub")."""
    losses = {}
    for trainer_class in (trl.SFTTrainer, TxvSFTTrainer):
        trainer = _setup(variant, tmp_path, trainer_class=trainer_class, steps=1, **config)
        batch = next(iter(trainer.get_train_dataloader()))
        model = trainer.model.train()  # the auxiliary terms are training terms
        with torch.no_grad():
            torch.manual_seed(1)  # the same dropout in every call
            losses[trainer_class] = trainer.compute_loss(model, dict(batch))
            torch.manual_seed(1)
            own = model(**batch, use_cache=False)
    terms = [name for name in AUXILIARY_TERMS if own.get(name) is not None]
    assert terms, variant
    torch.testing.assert_close(losses[trl.SFTTrainer], own.lm_loss, rtol=1e-4, atol=1e-4)
    assert losses[TxvSFTTrainer] > losses[trl.SFTTrainer] + 1e-3, (terms, losses)


def test_plain_sft_trainer_fails_on_the_adaptive_softmax(tmp_path):
    """What README documents: TRL's fused LM head needs `get_output_embeddings().weight`, which an adaptive softmax
    (Transformer-XL with cutoffs) does not have; TxvSFTTrainer trains it (the test above)."""
    assert TINY_CONFIGS["transfo-xl"]["cutoffs"]
    trainer = _setup("transfo-xl", tmp_path, trainer_class=trl.SFTTrainer, steps=1)
    assert trainer.model.get_output_embeddings() is None
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'weight'"):
        trainer.train()
