"""transformers' pipelines with the tokenizers the project writes: both have a pad token, so `batch_size > 1`
batches (and gives what each input gives alone), and the word-level converted tokenizer keeps the space between the
prompt and the continuation."""

from __future__ import annotations

import pytest
import torch
from transformers import pipeline

from conversion.vocab import build_tokenizer
from hf_txvariants import VanillaForCausalLM, VanillaForSequenceClassification
from hf_txvariants.training.data import build_char_tokenizer
from tiny_configs import tiny_config

TEXT = "the quick brown fox jumps over the lazy dog. "
WORDS = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog"]


def _config(tokenizer, **overrides):
    return tiny_config(
        "txv_vanilla",
        vocab_size=len(tokenizer),
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
        **overrides,
    )


def _alone_and_batched(generator, prompts, **kwargs):
    """The texts generated for each prompt alone, and for all prompts in batches of 2."""
    alone = [generator(prompt, **kwargs)[0]["generated_text"] for prompt in prompts]
    batched = [out[0]["generated_text"] for out in generator(prompts, batch_size=2, **kwargs)]
    return alone, batched


def test_char_tokenizer_has_pad_token_after_the_characters():
    tokenizer = build_char_tokenizer(TEXT)
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id == len(tokenizer) - 1
    assert tokenizer.padding_side == "left"
    assert tokenizer.decode(tokenizer("the fox")["input_ids"]) == "the fox"


def test_char_tokenizer_batched_text_generation_equals_one_by_one():
    tokenizer = build_char_tokenizer(TEXT)
    torch.manual_seed(0)
    model = VanillaForCausalLM(_config(tokenizer)).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    prompts = ["the quick", "a dog"]
    alone, batched = _alone_and_batched(generator, prompts, max_new_tokens=5, do_sample=False)
    assert batched == alone
    assert all(text.startswith(prompt) and len(text) == len(prompt) + 5 for text, prompt in zip(alone, prompts))


def test_char_tokenizer_batched_text_classification_equals_one_by_one():
    tokenizer = build_char_tokenizer(TEXT)
    torch.manual_seed(0)
    model = VanillaForSequenceClassification(_config(tokenizer, num_labels=3)).eval()
    classifier = pipeline("text-classification", model=model, tokenizer=tokenizer, device="cpu", top_k=None)
    texts = ["the quick brown fox", "a dog"]
    alone = [classifier(text) for text in texts]
    batched = classifier(texts, batch_size=2)
    for row_alone, row_batched in zip(alone, batched):
        row_alone = row_alone[0] if isinstance(row_alone[0], list) else row_alone
        assert [r["label"] for r in row_batched] == [r["label"] for r in row_alone]
        assert [r["score"] for r in row_batched] == pytest.approx([r["score"] for r in row_alone], abs=1e-5)


def test_word_level_converted_tokenizer_pads_and_keeps_spaces_in_generation():
    info = {"idx2sym": WORDS, "lower_case": False, "delimiter": None, "dataset": None}
    tokenizer, kind = build_tokenizer(info)
    assert kind == "word" and tokenizer.pad_token == "<eos>" and tokenizer.padding_side == "left"
    torch.manual_seed(0)
    model = VanillaForCausalLM(_config(tokenizer)).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    prompts = ["the cat sat", "a dog"]
    alone, batched = _alone_and_batched(generator, prompts, max_new_tokens=3, do_sample=False)
    assert batched == alone
    for text, prompt in zip(alone, prompts):
        continuation = text[len(prompt) :]
        assert text.startswith(prompt) and continuation.startswith(" ")
        assert all(word in WORDS for word in continuation.split())  # whole words, none glued to another
