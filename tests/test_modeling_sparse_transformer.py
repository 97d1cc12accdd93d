"""Sparse Transformer: the shared tester, the three pattern modes, and the three implementations giving equal models."""

import pytest
import torch

from hf_txvariants import (
    SparseTransformerForCausalLM,
    SparseTransformerForSequenceClassification,
    SparseTransformerModel,
)
from hf_txvariants.modeling_sparse_transformer import layer_patterns
from hf_txvariants.txv_patterns import FixedBlock, FixedSummary, PerHead, Strided, StridedColumn, StridedLocal
from tiny_configs import tiny_config
from txv_tester import TxvModelTesterMixin


class TestSparseTransformer(TxvModelTesterMixin):
    model_type = "txv_sparse_transformer"
    model_classes = (SparseTransformerModel, SparseTransformerForCausalLM, SparseTransformerForSequenceClassification)
    causal_lm_class = SparseTransformerForCausalLM
    seq_length = 11

    def test_eager_equals_sdpa(self):
        """The dense path through eager and SDPA (blocked and FlexAttention are compared with it below)."""
        self.config_overrides = {"pattern_implementation": "dense"}
        super().test_eager_equals_sdpa()


def _model(**overrides):
    torch.manual_seed(0)
    return SparseTransformerForCausalLM(tiny_config("txv_sparse_transformer", **overrides)).eval()


def test_pattern_modes():
    config = tiny_config("txv_sparse_transformer", num_hidden_layers=3)
    assert layer_patterns(config) == [StridedLocal(3), StridedColumn(3), StridedLocal(3)]
    config = tiny_config("txv_sparse_transformer", pattern_mode="merged")
    assert layer_patterns(config) == [Strided(3)] * 2
    config = tiny_config("txv_sparse_transformer", pattern_mode="per_head", attention_pattern="fixed", summary_size=1)
    assert layer_patterns(config) == [PerHead((FixedBlock(3), FixedSummary(3, 1)))] * 2


@pytest.mark.parametrize(
    "mode, pattern, convention",
    [(mode, pattern, "reference") for mode in ("interleaved", "merged", "per_head") for pattern in ("strided", "fixed")]
    + [(mode, pattern, "paper") for mode in ("interleaved", "per_head") for pattern in ("strided", "fixed")]
    + [
        ("merged", "local1d", "reference"),
        ("merged", "causal", "reference"),
        ("merged", "sliding_window", "reference"),
    ],
)
def test_implementations_agree(mode, pattern, convention):
    """blocked (tiles, the training path) == auto == dense eager reference == dense sdpa == FlexAttention, on the whole
    model, for every pattern x mode x convention (merged is the same set under both conventions)."""
    ids = torch.randint(0, 37, (2, 23), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 23, dtype=torch.long)
    mask[1, -5:] = 0
    outputs = {}
    for implementation, attn in (
        ("dense", "eager"),
        ("dense", "sdpa"),
        ("blocked", "eager"),
        ("flex", "eager"),
        ("auto", "sdpa"),
    ):
        model = _model(
            pattern_mode=mode,
            attention_pattern=pattern,
            summary_size=1,
            pattern_implementation=implementation,
            pattern_convention=convention,
        )
        model.set_attn_implementation(attn)
        with torch.no_grad():
            outputs[implementation, attn] = model(ids, attention_mask=mask).logits
    reference = outputs["dense", "eager"]
    for key, logits in outputs.items():
        torch.testing.assert_close(logits[0], reference[0], atol=1e-5, rtol=0, msg=str(key))
        torch.testing.assert_close(logits[1, :-5], reference[1, :-5], atol=1e-5, rtol=0, msg=str(key))


def test_paper_convention_factor_sets():
    """pattern_convention="paper": strided A(1) = {max(0, i - l), ..., i} (l + 1 keys), fixed A(2) = the summary
    positions only; the reference convention keeps today's sets."""
    strided = tiny_config("txv_sparse_transformer", pattern_convention="paper")
    assert layer_patterns(strided) == [StridedLocal(4), StridedColumn(3)]
    fixed = tiny_config("txv_sparse_transformer", pattern_convention="paper", attention_pattern="fixed", summary_size=1)
    assert layer_patterns(fixed) == [FixedBlock(3), FixedSummary(3, 1, include_query=False)]
    assert layer_patterns(tiny_config("txv_sparse_transformer", attention_pattern="fixed", summary_size=1))[
        1
    ] == FixedSummary(3, 1)
    assert layer_patterns(tiny_config("txv_sparse_transformer", pattern_mode="merged", pattern_convention="paper"))[
        0
    ] == Strided(3, paper=True)


def test_left_padding_is_refused():
    """Positions count from the first column: a left-padded row (or one continuing after padding, as in batched
    generation) would silently differ from the row alone, so it is refused; right padding keeps working."""
    model = _model()
    ids = torch.randint(1, 37, (2, 8), generator=torch.Generator().manual_seed(4))
    left = torch.ones_like(ids)
    left[1, :3] = 0
    with pytest.raises(ValueError, match="padding must come at the end of a row"):
        model(ids, attention_mask=left)
    with pytest.raises(ValueError, match="padding must come at the end of a row"):
        model.generate(ids, attention_mask=left, max_new_tokens=2, do_sample=False, pad_token_id=0)
    right = torch.ones_like(ids)
    right[1, -3:] = 0
    with torch.no_grad():
        padded = model(ids, attention_mask=right).logits
        alone = model(ids[1:, :5]).logits
    torch.testing.assert_close(padded[1, :5], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["merged", "per_head"])
@pytest.mark.slow  # torch.export and torch.compile
def test_export_and_compile_trace(mode):
    """torch.export and torch.compile(fullgraph=True) trace the model, padding mask included (no check on tensor
    values in forward), and the traced model gives the eager logits."""
    model = _model(pattern_mode=mode, attention_pattern="fixed", summary_size=1, pattern_implementation="blocked")
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, use_cache=False).logits
        exported = torch.export.export(model, (ids,), kwargs={"attention_mask": mask, "use_cache": False})
        torch.testing.assert_close(exported.module()(ids, attention_mask=mask, use_cache=False).logits, expected)
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(ids, attention_mask=mask, use_cache=False).logits, expected)


def test_pattern_restricts_attention():
    """A token outside every allowed set of the last position does not change its logits; one inside does."""
    model = _model(num_hidden_layers=1, pattern_mode="merged", stride=4)
    ids = torch.randint(0, 37, (1, 20), generator=torch.Generator().manual_seed(1))
    base = model(ids).logits[0, -1]
    # Position 19 sees 16..19 (local) and 15, 11, 7, 3 (column): position 5 is outside, 7 inside.
    outside, inside = ids.clone(), ids.clone()
    outside[0, 5] = (ids[0, 5] + 1) % 37
    inside[0, 7] = (ids[0, 7] + 1) % 37
    torch.testing.assert_close(model(outside).logits[0, -1], base, atol=1e-6, rtol=0)
    assert not torch.allclose(model(inside).logits[0, -1], base, atol=1e-4)


@pytest.mark.parametrize(
    "mode, convention", [("per_head", "reference"), ("merged", "reference"), ("interleaved", "paper")]
)
def test_blocked_training_gradients_equal_dense(mode, convention):
    grads = []
    for implementation in ("dense", "blocked"):
        model = _model(
            pattern_implementation=implementation,
            pattern_mode=mode,
            pattern_convention=convention,
            attention_pattern="fixed",
            summary_size=1,
        ).train()
        ids = torch.randint(0, 37, (2, 19), generator=torch.Generator().manual_seed(2))
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.exact
def test_cached_generation_equals_full_pass():
    model = _model(pattern_mode="merged")
    prompt = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompt)  # token 0 is a real token here, not padding
    generated = model.generate(prompt, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    without_cache = model.generate(
        prompt, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, use_cache=False
    )
    assert torch.equal(generated, without_cache)


def test_image_positions_and_checkpointing_default():
    config = tiny_config(
        "txv_sparse_transformer", image_shape=[4, 3, 3], num_hidden_layers=3, gradient_checkpointing_min_layers=3
    )
    model = SparseTransformerForCausalLM(config)
    assert model.is_activation_checkpointing
    assert not SparseTransformerForCausalLM(tiny_config("txv_sparse_transformer")).is_activation_checkpointing
    ids = torch.randint(0, 37, (2, 36))
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert model.model.embed_rows.weight.grad is not None and model.model.embed_channels.weight.grad is not None


@pytest.mark.parametrize(
    "field, value",
    [
        ("attention_pattern", "axial"),
        ("pattern_mode", "mixed"),
        ("pattern_implementation", "cuda"),
        ("stride", 0),
        ("image_shape", [4, 4]),
        ("image_shape", [100, 100, 3]),
        ("pattern_convention", "openai"),
    ],
)
def test_bad_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_sparse_transformer", **{field: value})


def test_bad_input_names_tensor():
    model = _model()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.zeros(1, 5, dtype=torch.long), attention_mask=torch.ones(1, 4))
