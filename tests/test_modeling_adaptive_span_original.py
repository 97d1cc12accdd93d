"""The original adaptive-span Transformer (txv_adaptive_span_original): the shared tester (adaptive span, trimming
spans, fixed span, all-attention network), parity with the original facebookresearch/adaptive-span code on
checkpoints its own save_checkpoint wrote (both torch containers; fixtures made by
tests/fixtures/make_adaptive_span_original_models.py), its cache (per-layer lengths, zeros at the start), the span
penalty, the converter's checks and the paper's evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_txvariants  # noqa: F401  (registers the Auto classes)
from conversion.adaptive_span import main as convert_main
from conversion.adaptive_span import read_vocabulary
from conversion.evaluate_adaptive_span import full_eval, read_original_format
from hf_txvariants import (
    AdaptiveSpanOriginalConfig,
    AdaptiveSpanOriginalForCausalLM,
    AdaptiveSpanOriginalModel,
    SpanCache,
)
from hf_txvariants.txv_compat import output_cache
from tiny_configs import DEFAULT, span_off, tiny_config
from txv_tester import ATOL, TxvModelTesterMixin

FIXTURES = Path(__file__).parent / "fixtures" / "adaptive_span_original_models"
META = json.loads((FIXTURES / "meta.json").read_text())


class TestAdaptiveSpanOriginal(TxvModelTesterMixin):
    model_type = "txv_adaptive_span_original"
    model_classes = (AdaptiveSpanOriginalModel, AdaptiveSpanOriginalForCausalLM)
    causal_lm_class = AdaptiveSpanOriginalForCausalLM
    has_memory = True
    supports_sdpa = False  # the soft mask multiplies the softmax output and renormalises, as the original

    def make_inputs(self, config, batch_size=None, seq_length=None, seed=0):
        # ids from 1: the tester generates with pad_token_id=0, and the model has no padding
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size or self.batch_size, seq_length or self.seq_length)
        return {"input_ids": torch.randint(1, config.vocab_size, shape, generator=generator)}


class TestAdaptiveSpanOriginalTrimming(TestAdaptiveSpanOriginal):
    """Spans short enough for the original's 64-step trimming of keys and cache."""

    config_overrides = {"attn_span": 140, "adapt_span_init": 0.05}


class TestAdaptiveSpanOriginalFixedSpan(TestAdaptiveSpanOriginal):
    config_overrides = span_off("txv_adaptive_span_original")


class TestAllAttentionNetwork(TestAdaptiveSpanOriginal):
    config_overrides = {"persistent_memory_size": 3, "intermediate_size": DEFAULT}  # the all-attention network


def convert(tmp_path, case, container="", flags=None, corpus=True, name="model"):
    output = tmp_path / name
    argv = ["--checkpoint", str(FIXTURES / f"{case}{container}.pt"), "--output", str(output)]
    if corpus:
        argv += ["--corpus", str(FIXTURES / "corpus")]
    status = convert_main(argv + ["--", *(META["cases"][case]["flags"].split() if flags is None else flags)])
    return status, output


# ----------------------------------------------------------------------------------------------- original parity
@pytest.mark.parametrize("container", ["", "_legacy"], ids=["zip", "legacy"])
@pytest.mark.parametrize("case", ["trim", "fixed", "pers"])
def test_converted_checkpoint_matches_the_original_from_the_first_block(tmp_path, case, container):
    status, output = convert(tmp_path, case, container)
    assert status == 0
    model = AutoModelForCausalLM.from_pretrained(output).eval()
    reference = torch.load(FIXTURES / f"{case}_reference.pt", weights_only=True)
    info, block = META["cases"][case], META["cases"][case]["block_size"]
    cache, log_probs, lengths = None, [], []
    with torch.no_grad():
        for index in range(META["blocks"]):
            out = model(reference["input_ids"][:, index * block : (index + 1) * block], cache=cache)
            cache = output_cache(out)
            log_probs.append(torch.log_softmax(out.logits, dim=-1))
            lengths.append(cache.lengths)
    torch.testing.assert_close(torch.cat(log_probs, dim=1), reference["log_probs"], atol=ATOL, rtol=0)
    assert lengths == info["cache_lengths"]  # each layer's own cache length, as the original kept it


def test_fixture_spans_trim_keys_and_cache():
    """The "trim" fixture really exercises trimming: its layers keep caches of different, trimmed lengths."""
    assert META["cases"]["trim"]["cache_lengths"][0] == [96, 160]


@pytest.mark.parametrize("case", ["trim", "pers"])
def test_evaluation_reproduces_the_original_full_eval(tmp_path, case):
    _, output = convert(tmp_path, case)
    model = AutoModelForCausalLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    data = read_original_format(tokenizer, FIXTURES / "corpus" / "test.txt")
    assert data.numel() == META["cases"][case]["test_tokens"]
    loss, _ = full_eval(model, data, META["batch_size"], META["cases"][case]["block_size"])
    assert abs(loss - META["cases"][case]["full_eval_loss"]) < 1e-5


@pytest.mark.exact
def test_tokenizer_gives_the_original_ids(tmp_path):
    _, output = convert(tmp_path, "fixed")
    tokenizer = AutoTokenizer.from_pretrained(output)
    reference = torch.load(FIXTURES / "fixed_reference.pt", weights_only=True)["input_ids"]
    data = read_original_format(tokenizer, FIXTURES / "corpus" / "test.txt")
    rows = data.numel() // META["batch_size"]
    expected = data[: rows * META["batch_size"]].view(META["batch_size"], rows)[:, : reference.shape[1]]
    assert torch.equal(expected, reference)  # the original's data.py numbering of test.txt
    line = (FIXTURES / "corpus" / "test.txt").read_text().splitlines()[0]
    assert tokenizer(line + "\n")["input_ids"] == data[: len(line.split()) + 1].tolist()  # newline -> <eos>


def test_vocabulary_from_corpus_pt_equals_train_txt(tmp_path):
    (tmp_path / "train.txt").write_bytes((FIXTURES / "corpus" / "train.txt").read_bytes())
    assert read_vocabulary(FIXTURES / "corpus") == read_vocabulary(tmp_path)  # corpus.pt vs the text


# ----------------------------------------------------------------------------------------------- converter checks
def test_flag_contradicting_a_tensor_is_an_error_naming_both(tmp_path, capsys):
    flags = META["cases"]["trim"]["flags"].replace("--attn-span 160", "--attn-span 128").split()
    status, output = convert(tmp_path, "trim", flags=flags)
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and not output.exists()
    assert "--attn-span 128" in message and "key_pe" in message and "160" in message


def test_missing_adapt_span_flag_is_an_error(tmp_path, capsys):
    flags = META["cases"]["trim"]["flags"].replace("--adapt-span ", "--adapt-span-ramp 8 ").split()
    status, _ = convert(tmp_path, "trim", flags=flags)
    assert status == 2 and "--adapt-span False" in capsys.readouterr().err


def test_without_flags_the_architecture_is_inferred(tmp_path):
    status, output = convert(tmp_path, "pers", flags=[], corpus=False)
    config = AdaptiveSpanOriginalConfig.from_pretrained(output)
    assert status == 0
    assert (config.num_hidden_layers, config.attn_span, config.persistent_memory_size) == (2, 140, 6)
    assert config.adapt_span_enabled and config.adapt_span_ramp == 32  # the original's default ramp


class Trap:
    def __reduce__(self):
        return (print, ("executed",))


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_trapped_pickle_is_refused_and_nothing_is_written(tmp_path, capsys, legacy):
    checkpoint = tmp_path / "trapped.pt"
    torch.save({"iter_no": 0, "model": {}, "logger": Trap()}, checkpoint, _use_new_zipfile_serialization=not legacy)
    output = tmp_path / "out"
    status = convert_main(["--checkpoint", str(checkpoint), "--output", str(output)])
    err = capsys.readouterr()
    assert status == 2 and not output.exists() and "executed" not in err.out
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and "refusing to load global" in lines[0] and "print" in lines[0]


def test_corpus_of_another_size_is_refused(tmp_path, capsys):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.txt").write_text("1 2 3\n")
    status = convert_main(
        [
            "--checkpoint",
            str(FIXTURES / "fixed.pt"),
            "--output",
            str(tmp_path / "out"),
            "--corpus",
            str(tmp_path / "corpus"),
        ]
    )
    assert status == 2 and "4 symbols" in capsys.readouterr().err and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------- model behaviour
def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return AdaptiveSpanOriginalForCausalLM(tiny_config("txv_adaptive_span_original", **overrides)).eval()


def test_cache_lengths_follow_the_spans_and_start_as_zeros():
    model = build(attn_span=200, adapt_span_init=0.05)
    with torch.no_grad():
        model.model.layers[1].attn.adaptive_span.current_val.fill_(0.5)
    cache = model.initial_cache(2)
    # layer 0: span 10 + ramp 2 -> trim 128 -> keeps 72 + 64; layer 1: span 100 + 2 -> trim 64 -> keeps 200
    assert cache.lengths == [136, 200] and all(bool((s == 0).all()) for s in cache.states)
    out = model(torch.randint(1, 29, (2, 5)), cache=cache)
    assert output_cache(out).lengths == [136, 200] and output_cache(out).seen_tokens == 5


@pytest.mark.exact
def test_first_block_attends_to_zero_vectors():
    """Without a cache the first block starts from zero vectors: the same as an explicit zero cache."""
    model = build()
    ids = torch.randint(1, 29, (2, 5))
    with torch.no_grad():
        # exact: without a cache the model builds the same zero state, so both calls run the same operations
        torch.testing.assert_close(model(ids).logits, model(ids, cache=model.initial_cache(2)).logits, atol=0, rtol=0)


def test_reset_rows_makes_a_fresh_row():
    model = build()
    ids = torch.randint(1, 29, (2, 6))
    with torch.no_grad():
        cache = output_cache(model(ids))
        cache.reset_rows(torch.tensor([True, False]))
        after = model(ids, cache=cache).logits
        fresh = model(ids[:1]).logits
    torch.testing.assert_close(after[0], fresh[0], atol=ATOL, rtol=0)


def test_span_penalty_is_added_to_the_loss():
    model = build(adapt_span_loss=0.01)
    ids = torch.randint(1, 29, (2, 6))
    out = model(ids, labels=ids)
    spans = [layer.attn.adaptive_span.spans().mean() for layer in model.model.layers]
    torch.testing.assert_close(out.span_penalty, sum(spans))
    torch.testing.assert_close(out.loss, out.lm_loss + 0.01 * sum(spans))


@pytest.mark.exact
def test_generate_keeps_the_span_cache_and_equals_recomputation():
    model = build()
    prompt = torch.randint(1, 29, (2, 4))
    generated = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):  # whole sequence each step, no cache
            ids = torch.cat([ids, model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, ids)
    out = model.generate(
        prompt, max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None, return_dict_in_generate=True
    )
    assert isinstance(output_cache(out), SpanCache)


def test_padding_is_refused():
    model = build()
    with pytest.raises(ValueError, match="attention_mask must be all ones"):
        model(torch.ones(1, 3, dtype=torch.long), attention_mask=torch.tensor([[0, 1, 1]]))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_attention_heads=3), "head_dim"),
        (dict(adapt_span_enabled=False, adapt_span_ramp=4), "adapt_span_ramp"),
        (dict(persistent_memory_size=4, intermediate_size=64), "intermediate_size"),
        (dict(tie_word_embeddings=True), "tie_word_embeddings"),
        (dict(attn_span=0), "attn_span"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config("txv_adaptive_span_original", **overrides)


@pytest.mark.exact
def test_trainer_trains_every_parameter_with_the_span_penalty(tmp_path):
    """transformers' Trainer: the loss (span penalty included) trains every parameter, the spans too. (Each batch
    starts from zero vectors here: the plugin's MemoryTrainer carries only the XL family's MemoryCache.)"""
    from transformers import Trainer, TrainingArguments

    model = build(adapt_span_loss=0.01).train()
    ids = torch.randint(1, 29, (8, 12), generator=torch.Generator().manual_seed(0))
    train_set = [{"input_ids": row, "labels": row} for row in ids]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    result = Trainer(model=model, args=args, train_dataset=train_set).train()
    assert math.isfinite(result.training_loss)
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert not unchanged, unchanged
