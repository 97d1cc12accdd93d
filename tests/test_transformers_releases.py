"""The supported transformers releases (issue: transformers 5.24 renamed `past_key_values` to `cache`).

CI runs this whole suite on the oldest and on the newest supported release (`.ci/run`); these tests check what differs
between them: the cache arrives under every name a release (or a user) may pass it and is never lost, outputs carry it
under the installed release's field name, generation reproduces the reference tokens, the declared range is the one
CI tests, and a folder saved with older code can get the plugin's code back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
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


@contextlib.contextmanager
def old_cache_name_warning(old_name: str):
    """What passing the cache as `old_name` gives: from 5.24 on the plugin's FutureWarning (caught here; yields the
    record), before 5.24 none (the old name is the release's own)."""
    if txv_compat.CACHE_NAME == "cache":
        with pytest.warns(FutureWarning, match=f"`{old_name}` is deprecated for `.*`. Use `cache` instead") as caught:
            yield caught
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yield None


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
    assert "OLDEST_SUPPORTED_TRANSFORMERS" in ci and "transformers==$oldest" in ci
    readme = (ROOT / "README.md").read_text()
    assert (
        f"transformers {oldest.removesuffix('.0')}" in readme and f"<{first_unsupported.removesuffix('.0')}" in readme
    )


@pytest.mark.exact
@pytest.mark.parametrize("name", CAUSAL_VARIANTS)
def test_the_cache_is_used_under_every_name(name):
    """The second segment's logits given the first segment's cache as `cache=`, `past_key_values=` (and the legacy
    `mems=` of Transformer-XL) are the same, and differ from the logits without that context: no name is swallowed by
    `**kwargs`."""
    model = tiny_causal_lm(name)
    first, second = two_segments(name, model)

    def logits_after_first(**how):
        # The same random numbers for every call: without `hash_seed` the Reformer draws its LSH rotations from the
        # global RNG at each forward, and other rotations sort the keys into another order, which moves the sums of
        # its attention by an ulp (7.45e-9; which RNG states do depends on the CPU's kernels) although every key
        # stays visible at this length. The name the cache is given under changes nothing in that path.
        torch.manual_seed(0)
        with torch.no_grad():
            out = model(first, use_cache=True)
            cache = txv_compat.output_cache(out)
            assert cache is not None
            if how.pop("legacy_mems", False):
                return model(second, mems=out.mems, use_cache=True).logits
            return model(second, use_cache=True, **{key: cache for key in how}).logits

    under_new_name = logits_after_first(cache=True)
    with old_cache_name_warning("past_key_values"):
        under_old_name = logits_after_first(past_key_values=True)
    torch.testing.assert_close(under_old_name, under_new_name, rtol=0, atol=0)
    if name == "transfo-xl":
        torch.testing.assert_close(logits_after_first(legacy_mems=True), under_new_name, rtol=0, atol=1e-6)
    if name != "txv_reformer":  # a Reformer call without its cache takes any length: compare with the context
        with torch.no_grad():
            without_context = model(second, use_cache=False).logits
        # (tiny random models: the context moves Transformer-XL's log-probabilities by ~6e-5, the others' by more)
        assert (without_context - under_new_name).abs().max() > 1e-5, "the cache did not change the output"


@pytest.mark.parametrize("name", txv_compat.CACHE_NAMES)
def test_every_cache_name_reaches_the_function_as_the_same_call(name):
    """`accepts_cache_names` turns each name into the one keyword `cache` before the function runs: the function
    gets the very same arguments (the same cache object) under every name, so no later code can tell them apart."""
    calls = []

    @txv_compat.accepts_cache_names
    def forward(input_ids, cache=None, use_cache=None, **kwargs):
        calls.append(((input_ids,), {"cache": cache, "use_cache": use_cache, **kwargs}))

    cache, ids = object(), torch.tensor([[1, 2]])
    forward(ids, cache=cache, use_cache=True, position_ids=None)
    with old_cache_name_warning(name) if name != "cache" else contextlib.nullcontext():
        forward(ids, **{name: cache}, use_cache=True, position_ids=None)
    (args_new, kwargs_new), (args_old, kwargs_old) = calls
    assert args_old[0] is args_new[0] and kwargs_old.keys() == kwargs_new.keys()
    assert all(kwargs_old[key] is kwargs_new[key] for key in kwargs_new)


@pytest.mark.parametrize("category", [FutureWarning, DeprecationWarning])
@pytest.mark.parametrize("module", ["hf_txvariants.txv_compat", "hf_txvariants.rl.policy", "conversion.common"])
def test_deprecations_from_plugin_code_are_errors(category, module):
    """pyproject.toml's filterwarnings: a deprecation attributed to the plugin's code fails the test that triggers
    it; the same warning attributed to a test module does not."""
    with pytest.raises(category, match="deprecated"):
        warnings.warn_explicit("`x` is deprecated", category, "plugin.py", 1, module=module)
    with pytest.warns(category, match="deprecated"):
        warnings.warn_explicit("`x` is deprecated", category, "test_x.py", 1, module="test_x")


def test_an_old_cache_name_is_an_error_only_when_plugin_code_passes_it():
    """The plugin's FutureWarning for an old cache name points at the code that passed it (past `nn.Module.__call__`
    and transformers' decorators): from plugin code it fails the test (pyproject.toml's filterwarnings), from a user or
    a test it is a warning, which a test passing the old name on purpose catches."""
    model = tiny_causal_lm("txv_vanilla")
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        cache = txv_compat.output_cache(model(ids, use_cache=True))
        with old_cache_name_warning("past_key_values") as caught:
            model(ids, past_key_values=cache)
        if txv_compat.CACHE_NAME == "cache":
            assert [Path(warning.filename).name for warning in caught] == [Path(__file__).name]
            plugin_code = {"__name__": "hf_txvariants.txv_probe", "model": model, "ids": ids, "cache": cache}
            with pytest.raises(FutureWarning, match="`past_key_values` is deprecated for"):
                exec("model(ids, past_key_values=cache)", plugin_code)


def test_the_cache_name_is_read_from_the_release():
    """`CACHE_NAME`, read from the fields of transformers' public `BaseModelOutputWithPast`, is the name transformers'
    own Llama takes in `forward`, returns in its outputs and gets from `generate()` in `prepare_inputs_for_generation`;
    the other cache names are none of these."""
    name, others = txv_compat.CACHE_NAME, set(txv_compat.CACHE_NAMES) - {txv_compat.CACHE_NAME}
    config = LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    parameters = inspect.signature(model.forward).parameters
    assert name in parameters and not others & set(parameters)
    given = []
    original = model.prepare_inputs_for_generation

    @functools.wraps(original)
    def recording(*args, **kwargs):
        given.append({key for key in txv_compat.CACHE_NAMES if key in kwargs})
        return original(*args, **kwargs)

    model.prepare_inputs_for_generation = recording
    prompt = torch.tensor([[3, 4, 5]])
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False, return_dict_in_generate=True
    )
    assert given and all(keys == {name} for keys in given)
    fields = {field.name for field in dataclasses.fields(out)}
    assert name in fields and not others & fields
    with torch.no_grad():
        assert name in model(prompt, use_cache=True).keys()


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
            tokens = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=8,
                do_sample=False,
                use_cache=use_cache,
                pad_token_id=0,
            )
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


def test_refresh_code_removes_the_blocks_the_new_code_no_longer_imports(tmp_path):
    """A folder saved before the heads were written into the modeling files carries `txv_heads.py` (and, for the XL
    family, `txv_xl_model.py` and the Sparse Transformer's pattern files): refreshed, it holds the new payload only,
    the tokenizer's blocks kept, and still loads."""
    model = tiny_causal_lm("transfo-xl")
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    (folder / "tokenization_transfo_xl.py").write_bytes(
        (Path(txv.__file__).parent / "tokenization_transfo_xl.py").read_bytes()
    )
    (folder / "txv_safe_pickle.py").write_bytes((Path(txv.__file__).parent / "txv_safe_pickle.py").read_bytes())
    for old_block in ("txv_heads.py", "txv_xl_model.py", "txv_pattern_flex.py"):
        (folder / old_block).write_text("# a block of an earlier version of the plugin\n")

    refresh_code(folder)

    shipped = {path.name for path in folder.glob("*.py")}
    assert not shipped & {"txv_heads.py", "txv_xl_model.py", "txv_pattern_flex.py"}
    assert {"modeling_transfo_xl.py", "txv_xl_memory.py", "tokenization_transfo_xl.py", "txv_safe_pickle.py"} <= shipped
    reloaded = type(model).from_pretrained(folder)
    assert reloaded.config.model_type == "transfo-xl"


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
