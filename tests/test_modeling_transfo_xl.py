"""Transformer-XL: the shared tester, parity with transformers 4.46.3's TransfoXL, memory, generation, bad input."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

import hf_txvariants
from hf_txvariants import (
    MemoryCache,
    TransfoXLForSequenceClassification,
    TransfoXLLMHeadModel,
    TransfoXLModel,
)
from hf_txvariants.txv_compat import output_cache
from tiny_configs import tiny_config
from txv_tester import ATOL, TxvModelTesterMixin

LEGACY_FIXTURES = Path(__file__).parent / "fixtures" / "transfo_xl_legacy"
LEGACY_CASES = sorted(p.name for p in LEGACY_FIXTURES.iterdir() if p.is_dir())


# this file's tiny model: tiny_config("transfo-xl") with the paper's evaluation setting (same_length), no dropout and
# N(0, 0.2) weights
TINY_OVERRIDES = dict(same_length=True, dropout=0.0, dropatt=0.0, init_std=0.2, proj_init_std=0.2)


def xl_config(**overrides):
    return tiny_config("transfo-xl", **{**TINY_OVERRIDES, **overrides})


class TestTransfoXL(TxvModelTesterMixin):
    model_type = "transfo-xl"
    model_classes = (TransfoXLModel, TransfoXLLMHeadModel, TransfoXLForSequenceClassification)
    causal_lm_class = TransfoXLLMHeadModel
    config_overrides = TINY_OVERRIDES
    has_memory = True
    memory_test_config_kwargs = dict(memory_init="empty", mem_len=7)


class TestTransfoXLPreNormNoCutoffs(TestTransfoXL):
    config_overrides = {
        **TINY_OVERRIDES,
        "cutoffs": [],
        "div_val": 1,
        "pre_lnorm": True,
        "untie_r": False,
        "d_embed": 12,
    }


# ---------------------------------------------------------------------------------------------------- legacy parity
@pytest.mark.parametrize("case", LEGACY_CASES)
def test_legacy_checkpoint_reproduces_transformers_4_46(case):
    """Folders saved by transformers 4.46.3 load with AutoModelForCausalLM and reproduce its log-probs, per-token
    losses, loss, hidden states and memory over three consecutive segments (fixtures: tests/fixtures/)."""
    folder = LEGACY_FIXTURES / case
    reference = load_file(folder / "reference.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert isinstance(model, TransfoXLLMHeadModel)
    base = AutoModel.from_pretrained(folder).eval()
    cache = base_cache = None
    for segment in range(3):
        ids = reference[f"segment{segment}.input_ids"]
        with torch.no_grad():
            with_labels = model(ids, labels=ids, cache=cache.clone() if cache else None)
            output = model(ids, cache=cache)
            base_output = base(ids, cache=base_cache)
        cache, base_cache = output_cache(output), output_cache(base_output)
        expected = lambda name, segment=segment: reference[f"segment{segment}.{name}"]  # noqa: E731
        torch.testing.assert_close(output.logits, expected("log_probs"), atol=ATOL, rtol=0)
        torch.testing.assert_close(with_labels.losses, expected("losses"), atol=ATOL, rtol=0)
        torch.testing.assert_close(with_labels.loss, expected("loss"), atol=ATOL, rtol=0)
        torch.testing.assert_close(base_output.last_hidden_state, expected("hidden"), atol=ATOL, rtol=0)
        for layer, memory in enumerate(output.mems):
            torch.testing.assert_close(memory, expected(f"mems.{layer}"), atol=ATOL, rtol=0)


def test_legacy_mems_argument_round_trips():
    folder = LEGACY_FIXTURES / "cutoffs_div2_untied"
    reference = load_file(folder / "reference.safetensors")
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    mems = [reference[f"segment0.mems.{i}"] for i in range(model.config.num_hidden_layers)]
    with torch.no_grad():
        output = model(reference["segment1.input_ids"], mems=mems)
    torch.testing.assert_close(output.prediction_scores, reference["segment1.log_probs"], atol=ATOL, rtol=0)
    assert [m.shape for m in output.mems] == [m.shape for m in mems]


def test_safetensors_fixture_really_lacks_tied_weights():
    """The fixture exercises re-tying: the legacy safetensors file has no crit.out_layers.0.weight."""
    keys = json.loads((LEGACY_FIXTURES / "cutoffs_div1_proj" / "case.json").read_text())["saved_weight_keys"]
    assert "crit.out_layers.0.weight" not in keys and "transformer.word_emb.emb_layers.0.weight" in keys
    model = AutoModelForCausalLM.from_pretrained(LEGACY_FIXTURES / "cutoffs_div1_proj")
    assert model.crit.out_layers[0].weight is model.transformer.word_emb.emb_layers[0].weight
    assert model.crit.out_projs[1] is model.transformer.word_emb.emb_projs[0]


# ---------------------------------------------------------------------------------------------------- safety, bad input
class _Trap:
    def __reduce__(self):
        return (os.system, (f"touch {_Trap.marker}",))


def test_pickle_in_pytorch_model_bin_is_never_executed(tmp_path):
    folder = tmp_path / "trap"
    shutil.copytree(LEGACY_FIXTURES / "cutoffs_div2_shared_bias", folder)
    _Trap.marker = tmp_path / "pwned"
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({**state, "trap": _Trap()}, f)
    # whichever error the weights-only loader raises for the foreign global: what matters is that nothing runs (below)
    with pytest.raises(Exception):  # noqa: B017
        AutoModelForCausalLM.from_pretrained(folder)
    with pytest.raises(ValueError, match="weights_only=False"):
        AutoModelForCausalLM.from_pretrained(folder, weights_only=False)
    assert not _Trap.marker.exists()


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_checkpoint_with_missing_or_extra_tensor_is_an_error(tmp_path, change):
    folder = tmp_path / "ckpt"
    shutil.copytree(LEGACY_FIXTURES / "cutoffs_div2_untied", folder)
    state = load_file(folder / "model.safetensors")
    name = "transformer.layers.1.dec_attn.qkv_net.weight"
    if change == "missing":
        del state[name]
    else:
        state[name.replace("layers.1", "layers.7")] = state[name].clone()
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.[17]\.dec_attn\.qkv_net\.weight"):
        AutoModelForCausalLM.from_pretrained(folder)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(cutoffs=[20, 10]), "cutoffs"),
        (dict(cutoffs=[10, 40]), "cutoffs"),
        (dict(div_val=0), "div_val"),
        (dict(mem_len=-1), "mem_len"),
        (dict(d_head=None, d_model=15, n_head=2), "num_attention_heads"),
        (dict(d_embed=3, div_val=2), "d_embed"),
        (dict(tie_projs=[True]), "tie_projs"),
        (dict(memory_init="random"), "memory_init"),
        (dict(attn_type=1), "attn_type"),
        (dict(same_length=True, mem_len=0), "same_length"),
        (dict(dropout=1.5), "dropout"),
    ],
)
def test_inconsistent_config_is_a_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        xl_config(**overrides)


def test_token_ids_out_of_range():
    model = TransfoXLLMHeadModel(xl_config()).eval()
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[1, 2, 40]]))
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.tensor([[1, -2, 3]]))
    with pytest.raises(ValueError, match="labels"):
        model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 99]]))


def test_memory_from_another_batch_size_or_config():
    config = xl_config()
    model = TransfoXLLMHeadModel(config).eval()
    memory = output_cache(model(torch.randint(0, 40, (2, 4))))
    with pytest.raises(ValueError, match="batch size 2"):
        model(torch.randint(0, 40, (3, 4)), cache=memory)
    wider = TransfoXLLMHeadModel(xl_config(d_model=32, d_head=16)).eval()
    with pytest.raises(ValueError, match="hidden size"):
        wider(torch.randint(0, 40, (2, 4)), cache=memory)
    deeper = TransfoXLLMHeadModel(xl_config(n_layer=3)).eval()
    with pytest.raises(ValueError, match="layers"):
        deeper(torch.randint(0, 40, (2, 4)), cache=memory)


# ---------------------------------------------------------------------------------------------------- memory
def test_memory_is_detached_trimmed_and_rows_reset_independently():
    config = xl_config(memory_init="empty", same_length=False)
    model = TransfoXLLMHeadModel(config).train()
    ids = torch.randint(0, 40, (3, 4))
    cache = output_cache(model(ids, labels=ids))
    assert cache.memory_length == 4 and all(not m.requires_grad for m in cache.memories)
    cache = output_cache(model(ids, labels=ids, cache=cache))
    assert cache.memory_length == config.mem_len
    model.eval()
    follow_up = torch.randint(0, 40, (3, 4))
    kept = cache.clone()
    cache.reset_rows(torch.tensor([False, True, False]), memory_init=config.memory_init)
    with torch.no_grad():
        after_reset = model(follow_up, cache=cache).logits
        fresh_row = model(follow_up[1:2]).logits
        untouched = model(follow_up, cache=kept).logits
    torch.testing.assert_close(after_reset[1], fresh_row[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(after_reset[[0, 2]], untouched[[0, 2]], atol=ATOL, rtol=0)
    assert not torch.allclose(after_reset[1], untouched[1], atol=1e-3)


def test_zero_memory_reset_row_equals_fresh_row():
    config = xl_config()  # memory_init="zeros", the legacy behaviour
    model = TransfoXLLMHeadModel(config).eval()
    with torch.no_grad():
        cache = output_cache(model(torch.randint(0, 40, (2, 6))))
        cache.reset_rows(torch.tensor([True, False]))
        follow_up = torch.randint(0, 40, (2, 3))
        torch.testing.assert_close(
            model(follow_up, cache=cache).logits[0], model(follow_up[:1]).logits[0], atol=ATOL, rtol=0
        )


# ---------------------------------------------------------------------------------------------------- generation
def _generation_model(**overrides):
    torch.manual_seed(0)
    config = xl_config(**{"memory_init": "empty", "mem_len": 6, **overrides})
    return TransfoXLLMHeadModel(config).eval()


@pytest.mark.exact
def test_generate_feeds_one_token_per_step_and_keeps_memory_bounded():
    model = _generation_model()
    seen = []
    hook = model.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append((kwargs["input_ids"].shape[1], kwargs["cache"])),
        with_kwargs=True,
    )
    prompt = torch.randint(1, 40, (1, 5))
    output = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    hook.remove()
    assert [length for length, _ in seen] == [5] + [1] * 7
    assert all(isinstance(c, MemoryCache) and c.memory_length <= 6 for _, c in seen[1:])
    # greedy decoding with memory equals a manual loop that feeds one token at a time with the same memory
    with torch.no_grad():
        step = model(prompt)
        tokens = [step.logits[:, -1].argmax(-1)]
        for _ in range(7):
            step = model(tokens[-1][:, None], cache=step.cache)
            tokens.append(step.logits[:, -1].argmax(-1))
    assert torch.equal(output[0, 5:], torch.stack(tokens, 1)[0])


@pytest.mark.exact
def test_left_padded_batch_generates_like_each_row_alone():
    model = _generation_model(same_length=False)
    rows = [torch.randint(1, 40, (1, n)) for n in (5, 3, 1)]
    padded = torch.zeros(3, 5, dtype=torch.long)
    mask = torch.zeros(3, 5, dtype=torch.long)
    for i, row in enumerate(rows):
        padded[i, 5 - row.shape[1] :] = row
        mask[i, 5 - row.shape[1] :] = 1
    kwargs = dict(max_new_tokens=9, do_sample=False, pad_token_id=0, eos_token_id=None)
    batched = model.generate(padded, attention_mask=mask, **kwargs)
    for i, row in enumerate(rows):
        alone = model.generate(row, attention_mask=torch.ones_like(row), **kwargs)
        assert torch.equal(batched[i, 5:], alone[0, row.shape[1] :]), i


def test_beam_search_and_sampling_use_memory():
    model = _generation_model()
    prompt = torch.randint(1, 40, (2, 4))
    beams = model.generate(
        prompt, num_beams=3, num_return_sequences=2, max_new_tokens=5, pad_token_id=0, eos_token_id=None
    )
    assert beams.shape == (4, 9)
    torch.manual_seed(0)
    sampled = model.generate(
        prompt, do_sample=True, temperature=0.7, max_new_tokens=5, pad_token_id=0, eos_token_id=None
    )
    assert sampled.shape == (2, 9)


# ---------------------------------------------------------------------------------------------------- training
def test_loss_is_scalar_mean_over_shifted_labels_and_honours_ignore_index():
    model = TransfoXLLMHeadModel(xl_config()).eval()
    ids = torch.randint(0, 40, (2, 6))
    labels = ids.clone()
    labels[0, 3] = -100
    with torch.no_grad():
        output = model(ids, labels=labels)
        log_probs = model(ids).logits
    targets = labels[:, 1:]
    expected = -log_probs[:, :-1].gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    expected = expected.masked_fill(targets == -100, 0.0)
    torch.testing.assert_close(output.losses, expected, atol=ATOL, rtol=0)
    assert output.loss.dim() == 0
    torch.testing.assert_close(output.loss, expected.sum() / (targets != -100).sum(), atol=ATOL, rtol=0)
    with torch.no_grad():
        scaled = model(ids, labels=labels, num_items_in_batch=20)
    torch.testing.assert_close(scaled.loss, expected.sum() / 20, atol=ATOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_forward_backward_is_finite(dtype):
    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(xl_config(dropout=0.1)).to(dtype).train()
    ids = torch.randint(0, 40, (2, 6))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :2] = 0
    output = model(ids, labels=ids, attention_mask=attention_mask)
    output.loss.backward()
    assert torch.isfinite(output.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    second = model(ids, labels=ids, cache=output_cache(output))
    assert torch.isfinite(second.loss)


def test_sequence_classification_uses_the_last_real_token():
    config = xl_config(num_labels=3, memory_init="empty")
    model = TransfoXLForSequenceClassification(config).eval()
    ids = torch.randint(1, 40, (1, 4))
    padded = torch.cat([ids, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    with torch.no_grad():
        alone = model(ids).logits
        right_padded = model(padded).logits  # pad_token_id=0 found in input_ids
        masked = model(padded, attention_mask=(padded != 0).long()).logits
    torch.testing.assert_close(right_padded, alone, atol=ATOL, rtol=0)
    torch.testing.assert_close(masked, alone, atol=ATOL, rtol=0)
    loss = model(ids, labels=torch.tensor([2])).loss
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_auto_classes_are_registered():
    config = xl_config()
    assert isinstance(AutoModel.from_config(config), TransfoXLModel)
    assert isinstance(AutoModelForCausalLM.from_config(config), TransfoXLLMHeadModel)
    assert isinstance(AutoModelForSequenceClassification.from_config(config), TransfoXLForSequenceClassification)
    assert hf_txvariants.TransfoXLForCausalLM is TransfoXLLMHeadModel


def test_failed_save_leaves_no_folder(tmp_path, monkeypatch):
    model = TransfoXLLMHeadModel(xl_config())
    from hf_txvariants import txv_pretrained

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(txv_pretrained, "write_remote_code", broken)
    with pytest.raises(OSError, match="disk full"):
        model.save_pretrained(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.exact
def test_generate_without_memory_recomputes_the_whole_context():
    """mem_len=0: nothing carries the context, so every step must see the whole sequence (not one token)."""
    model = _generation_model(mem_len=0, same_length=False)
    prompt = torch.randint(1, 40, (1, 4))
    output = model.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
    expected = prompt
    with torch.no_grad():
        for _ in range(5):
            expected = torch.cat([expected, model(expected).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(output, expected)


@pytest.mark.exact
def test_labels_keep_the_logits_unless_the_caller_opts_out():
    model = TransfoXLLMHeadModel(xl_config()).eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        with_labels = model(ids, labels=ids)
        plain = model(ids)
        without_logits = model(ids, labels=ids, return_logits=False)
    # exact: the labels add a loss; the log-probabilities and the loss come from the same operations either way
    torch.testing.assert_close(with_labels.logits, plain.logits, atol=0, rtol=0)
    assert without_logits.logits is None
    torch.testing.assert_close(without_logits.loss, with_labels.loss, atol=0, rtol=0)


@pytest.mark.exact
def test_resize_token_embeddings_keeps_the_shared_rows():
    torch.manual_seed(0)
    config = xl_config(cutoffs=[], div_val=1, d_embed=12)
    model = TransfoXLLMHeadModel(config).eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        before = model(ids, output_hidden_states=True)
    model.resize_token_embeddings(45)
    assert model.config.vocab_size == 45
    assert model.crit.out_layers[0].weight is model.transformer.word_emb.emb_layers[0].weight  # still tied
    with torch.no_grad():
        after = model(ids, output_hidden_states=True)
        new_tokens = model(torch.tensor([[41, 44, 3]]), labels=torch.tensor([[41, 44, 3]]))
    # exact: ids < 40 read only the kept rows, and the body runs the same operations on them
    torch.testing.assert_close(after.hidden_states[-1], before.hidden_states[-1], atol=0, rtol=0)
    assert after.logits.shape[-1] == 45 and torch.isfinite(new_tokens.loss)
    model.resize_token_embeddings(30)
    assert model.transformer.word_emb.emb_layers[0].weight.shape[0] == 30


def test_resize_token_embeddings_with_cutoffs_names_the_reason():
    model = TransfoXLLMHeadModel(xl_config())
    with pytest.raises(ValueError, match="cutoffs"):
        model.resize_token_embeddings(50)
