"""The supported transformers releases (issue: transformers 5.24 renamed `past_key_values` to `cache`).

CI runs this whole suite on the oldest and on the newest supported release (`.ci/run`); these tests check what differs
between them: the cache arrives under every name a release (or a user) may pass it and is never lost, outputs carry it
under the installed release's field name, generation reproduces the reference tokens, the declared range is the one
CI tests, and a folder saved with older code can get the plugin's code back.
"""

from __future__ import annotations

import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

import hf_txvariants as txv
from hf_txvariants import txv_compat
from hf_txvariants.hub import refresh_code
from tiny_configs import TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = json.loads((ROOT / "tests" / "fixtures" / "release_generation.json").read_text())
# every variant with a causal-LM head (the reference generations predate the newer ones)
CAUSAL_VARIANTS = sorted(
    name for name in TINY_CONFIGS if type(AutoConfig.for_model(name)) in MODEL_FOR_CAUSAL_LM_MAPPING
)


def tiny_causal_lm(name):
    config = AutoConfig.for_model(name, **TINY_CONFIGS[name])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def two_segments(name, model):
    vocab = 256 if name == "txv_image_transformer" else model.config.vocab_size
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(1, vocab, (2, 6), generator=generator)
    if name == "txv_reformer":  # its cache takes one new token per step
        return ids[:, :5], ids[:, 5:]
    return ids[:, :4], ids[:, 4:]


def test_the_installed_release_is_supported():
    assert txv_compat.check_transformers_version()


def test_a_release_outside_the_range_warns_naming_the_range():
    with pytest.warns(UserWarning, match=r"tested with transformers >=5\.23\.0,<5\.25\.0; transformers 5\.25\.0"):
        assert not txv_compat.check_transformers_version("5.25.0")
    with pytest.warns(UserWarning, match="5.22.2 is installed"):
        assert not txv_compat.check_transformers_version("5.22.2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert txv_compat.check_transformers_version("5.24.1")


def test_pyproject_declares_exactly_the_range_ci_tests():
    pyproject = (ROOT / "pyproject.toml").read_text()
    (declared,) = re.findall(r'"transformers(>=[^"]+)"', pyproject)
    oldest, first_unsupported = txv_compat.OLDEST_SUPPORTED_TRANSFORMERS, txv_compat.FIRST_UNSUPPORTED_TRANSFORMERS
    assert declared == f">={oldest.removesuffix('.0')},<{first_unsupported.removesuffix('.0')}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "OLDEST_SUPPORTED_TRANSFORMERS" in ci and 'transformers==$oldest' in ci
    readme = (ROOT / "README.md").read_text()
    assert f"transformers {oldest.removesuffix('.0')}" in readme and f"<{first_unsupported.removesuffix('.0')}" in readme


@pytest.mark.parametrize("name", CAUSAL_VARIANTS)
def test_the_cache_is_used_under_every_name(name):
    """The second segment's logits given the first segment's cache as `cache=`, `past_key_values=` (and the legacy
    `mems=` of Transformer-XL) are the same, and differ from the logits without that context: no name is swallowed by
    `**kwargs`."""
    model = tiny_causal_lm(name)
    first, second = two_segments(name, model)

    def logits_after_first(**how):
        with torch.no_grad():
            out = model(first, use_cache=True)
            cache = txv_compat.output_cache(out)
            assert cache is not None
            if how.pop("legacy_mems", False):
                return model(second, mems=out.mems, use_cache=True).logits
            return model(second, use_cache=True, **{key: cache for key in how}).logits

    under_new_name = logits_after_first(cache=True)
    torch.testing.assert_close(logits_after_first(past_key_values=True), under_new_name, rtol=0, atol=0)
    if name == "transfo-xl":
        torch.testing.assert_close(logits_after_first(legacy_mems=True), under_new_name, rtol=0, atol=1e-6)
    if name != "txv_reformer":  # a Reformer call without its cache takes any length: compare with the context
        with torch.no_grad():
            without_context = model(second, use_cache=False).logits
        # (tiny random models: the context moves Transformer-XL's log-probabilities by ~6e-5, the others' by more)
        assert (without_context - under_new_name).abs().max() > 1e-5, "the cache did not change the output"


def test_two_different_caches_are_refused():
    model = tiny_causal_lm("transfo-xl")
    first, second = two_segments("transfo-xl", model)
    with torch.no_grad():
        cache_a = txv_compat.output_cache(model(first))
        cache_b = txv_compat.output_cache(model(first))
    with pytest.raises(ValueError, match="the cache was given twice, as cache and past_key_values"):
        model(second, cache=cache_a, past_key_values=cache_b)


@pytest.mark.parametrize("name", CAUSAL_VARIANTS)
def test_outputs_signatures_and_generation_inputs_use_the_installed_release_names(name):
    """The output field and the forward parameter have the installed release's name, and what `generate()` passes
    to `prepare_inputs_for_generation` under that name reaches the model inputs."""
    model = tiny_causal_lm(name)
    first, second = two_segments(name, model)
    with torch.no_grad():
        out = model(first, use_cache=True)
    cache = txv_compat.output_cache(out)
    assert txv_compat.CACHE_NAME in out.keys() and cache is not None
    assert txv_compat.CACHE_NAME in inspect.signature(model.forward).parameters
    sequence = torch.cat([first, second[:, :1]], dim=1)
    inputs = model.prepare_inputs_for_generation(
        sequence, attention_mask=torch.ones_like(sequence), **{txv_compat.CACHE_NAME: cache}
    )
    assert [value for key, value in inputs.items() if key in txv_compat.CACHE_NAMES] == [cache]


@pytest.mark.parametrize("name", sorted(REFERENCE["generations"]))
def test_generation_reproduces_the_reference_release(name):
    """Greedy tokens, with and without the cache, equal those of the plugin before 5.24 on transformers 5.23
    (tests/fixtures/make_release_generation_fixture.py)."""
    reference = REFERENCE["generations"][name]
    model = tiny_causal_lm(name)
    prompt = torch.tensor(reference["prompt"])
    for label, use_cache in (("cached", True), ("uncached", False)):
        with torch.no_grad():
            tokens = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                                    use_cache=use_cache, pad_token_id=0)
        assert tokens.tolist() == reference[label], f"{label} on transformers {transformers.__version__}"


def test_refresh_code_replaces_the_code_and_keeps_the_weights(tmp_path):
    model = tiny_causal_lm("transfo-xl")
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "modeling_transfo_xl.py").write_text("raise ImportError('code from before the fix')\n")
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"]
    (folder / "config.json").write_text(json.dumps(config))

    written = refresh_code(folder)

    assert "modeling_transfo_xl.py" in written and "txv_compat.py" in written and "config.json" in written
    plugin_folder = Path(txv.__file__).parent
    for name in written[:-1]:
        assert (folder / name).read_bytes() == (plugin_folder / name).read_bytes(), name
    assert (folder / "model.safetensors").read_bytes() == weights
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == (
        "modeling_transfo_xl.TransfoXLLMHeadModel"
    )
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_refresh_code_refuses_what_is_not_a_plugin_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        refresh_code(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a variant of this plugin"):
        refresh_code(tmp_path)


@pytest.mark.exact
def test_a_folder_with_outdated_code_loads_the_plugin_code_when_installed(tmp_path):
    """A folder whose remote-code files predate the plugin's support of this release (here: files that fail to
    import) loads with the plugin's code when `trust_remote_code` is not asked for, and gives the same outputs."""
    model = tiny_causal_lm("txv_gtrxl")
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    for name in ("modeling_gtrxl.py", "configuration_gtrxl.py", "txv_xl.py"):
        (folder / name).write_text("raise ImportError('code from before the fix')\n")
    loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(loaded) is txv.GTrXLForCausalLM
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        # exact: the same weights through the same code (the plugin's), the same operations
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
