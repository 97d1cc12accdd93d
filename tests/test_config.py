"""The variants' configs on their shared bases (`txv_config.TxvConfig` / `TxvTransformerConfig`,
`txv_xl_config.XLFamilyConfig`): every config holds exactly what it held when each one was written out (recorded by
tests/fixtures/make_config_defaults.py from the code before the bases), the bases' fields are declared once, the
XL-family mechanism fields that a config would ignore are refused, and the field type checks also run where the
config is loaded as remote code."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from transformers.dynamic_module_utils import get_class_from_dynamic_module, get_relative_import_files

import hf_txvariants as txv
from hf_txvariants.txv_config import PAPER_NAMES, TxvConfig, TxvTransformerConfig
from hf_txvariants.txv_gates import GATES
from hf_txvariants.txv_xl_config import ADAPTIVE_SPAN_SETTINGS, XLFamilyConfig
from tiny_configs import TINY_CONFIGS, span_off, tiny_config

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "config_defaults.json").read_text())
CONFIG_CLASSES = {
    obj.model_type: obj
    for obj in vars(txv).values()
    if isinstance(obj, type) and obj.__module__.startswith("hf_txvariants.configuration_")
}
XL_CONFIGS = [c for _, c in sorted(CONFIG_CLASSES.items()) if issubclass(c, XLFamilyConfig)]
GATES_WITHOUT_BIAS = ["trxl", "trxl_i"] + [
    name for name, gate in GATES.items() if not gate.has_bias and name != "residual"
]
GATES_WITH_BIAS = [name for name, gate in GATES.items() if gate.has_bias]


def _saved(config, method: str) -> dict:
    values = getattr(config, method)()
    values.pop("transformers_version", None)
    return json.loads(json.dumps(values, sort_keys=True))


# ------------------------------------------------------------------------------------------ unchanged by the bases
# variants added after the record was made (they never had configs written out before the bases)
NEWER_VARIANTS = {"txv_adaptive_span_original"}


def test_every_variant_has_a_recorded_config():
    assert sorted(set(CONFIG_CLASSES) - NEWER_VARIANTS) == sorted(RECORDED)


@pytest.mark.parametrize("model_type", sorted(RECORDED))
def test_config_holds_what_it_held_before_the_bases(model_type):
    """Defaults, derived fields and what save_pretrained writes (to_diff_dict), for the default and the tiny config:
    every recorded entry is there with its recorded value (a field added later by a new option may come on top)."""
    config_class, recorded = CONFIG_CLASSES[model_type], RECORDED[model_type]
    configs = {"default": config_class(), "tiny": tiny_config(config_class.model_type)}
    for name, config in configs.items():
        for method in ("to_dict", "to_diff_dict"):
            saved = _saved(config, method)
            expected = recorded[f"{name}_{method}"]
            assert {key: saved.get(key, "<missing>") for key in expected} == expected, (name, method)


@pytest.mark.parametrize("model_type", sorted(RECORDED))
def test_every_name_accepted_before_is_still_accepted(model_type):
    config_class = CONFIG_CLASSES[model_type]
    for alias, field in RECORDED[model_type]["attribute_map"].items():
        assert config_class.attribute_map.get(alias) == field, alias


# ------------------------------------------------------------------------------------------ the bases
def test_every_config_is_built_on_the_base():
    assert all(issubclass(c, TxvConfig) for c in CONFIG_CLASSES.values())
    transformer_like = [c for c in CONFIG_CLASSES.values() if issubclass(c, TxvTransformerConfig)]
    assert len(transformer_like) == 10  # all but the ACT RNN (no attention) and the Reformer (transformers' names)


@pytest.mark.parametrize("model_type", sorted(CONFIG_CLASSES))
def test_no_config_repeats_a_base_field_with_the_base_default(model_type):
    """A variant re-declares a shared field only to change its default (or its type): a copy would drift."""
    config_class = CONFIG_CLASSES[model_type]
    inherited = {field.name: field for field in dataclasses.fields(config_class.__mro__[1])}
    own = {field.name: field for field in dataclasses.fields(config_class)}
    for name in config_class.__dict__.get("__annotations__", {}):
        if name in inherited:
            assert (own[name].default, str(own[name].type)) != (inherited[name].default, str(inherited[name].type)), (
                name
            )


@pytest.mark.parametrize(
    "model_type", sorted(m for m, c in CONFIG_CLASSES.items() if issubclass(c, TxvTransformerConfig))
)
def test_every_transformer_config_accepts_the_papers_names(model_type):
    config_class = CONFIG_CLASSES[model_type]
    assert PAPER_NAMES.items() <= config_class.attribute_map.items()
    tiny = TINY_CONFIGS[model_type]
    names = {alias: tiny[field] for alias, field in PAPER_NAMES.items() if field in tiny}
    kwargs = {k: v for k, v in tiny.items() if k not in PAPER_NAMES.values()}
    assert _saved(config_class(**kwargs, **names), "to_dict") == _saved(tiny_config(config_class.model_type), "to_dict")


# ------------------------------------------------------------------------------------------ ignored fields refused
@pytest.mark.parametrize("gate_type", GATES_WITHOUT_BIAS)
@pytest.mark.parametrize("config_class", XL_CONFIGS, ids=lambda c: c.model_type)
def test_gate_bias_without_a_biased_gate_is_refused(config_class, gate_type):
    with pytest.raises(ValueError, match=f"gate_bias=0.5 would be ignored: gate_type='{gate_type}' has no gate bias"):
        tiny_config(config_class.model_type, gate_type=gate_type, gate_bias=0.5)
    assert (
        tiny_config(config_class.model_type, gate_type=gate_type, gate_bias=2.0).gate_type == gate_type
    )  # the default: saved configs


@pytest.mark.parametrize("gate_type", GATES_WITH_BIAS)
@pytest.mark.parametrize("config_class", XL_CONFIGS, ids=lambda c: c.model_type)
def test_gate_bias_with_a_biased_gate_is_kept(config_class, gate_type):
    assert tiny_config(config_class.model_type, gate_type=gate_type, gate_bias=0.5).gate_bias == 0.5


SPAN_SETTINGS = {
    "adapt_span_ramp": 3,
    "adapt_span_init": 0.25,
    "adapt_span_loss": 0.0,
    "adapt_span_cache": False,
    "adapt_span_dynamic": True,
}


def test_span_settings_cover_every_adapt_span_field():
    fields = {f.name for f in dataclasses.fields(XLFamilyConfig) if f.name.startswith("adapt_span_")}
    assert set(ADAPTIVE_SPAN_SETTINGS) == set(SPAN_SETTINGS) == fields - {"adapt_span_enabled"}


@pytest.mark.parametrize("name, value", sorted(SPAN_SETTINGS.items()))
@pytest.mark.parametrize("config_class", XL_CONFIGS, ids=lambda c: c.model_type)
def test_span_setting_with_the_span_off_is_refused(config_class, name, value):
    model_type = config_class.model_type
    with pytest.raises(ValueError, match=name):
        tiny_config(model_type, **{**span_off(model_type), "adapt_span_enabled": False, name: value})
    span_on = tiny_config(
        model_type, **{**span_off(model_type), "attn_span": 8, "adapt_span_enabled": True, name: value}
    )
    assert getattr(span_on, name) == value


@pytest.mark.parametrize("config_class", XL_CONFIGS, ids=lambda c: c.model_type)
def test_saved_config_with_the_mechanisms_off_loads(config_class, tmp_path):
    """A saved config holds every mechanism field at its default (to_dict and the legacy full dump alike)."""
    model_type = config_class.model_type
    config = tiny_config(model_type, **span_off(model_type), adapt_span_enabled=False, gate_type="trxl")
    config.save_pretrained(tmp_path)
    assert config_class.from_pretrained(tmp_path).to_dict() == config.to_dict()
    full = config.to_dict()
    assert full["gate_bias"] == 2.0 and all(name in full for name in ADAPTIVE_SPAN_SETTINGS)
    assert config_class.from_dict(full).to_dict() == config.to_dict()


# ------------------------------------------------------------------------------------------ remote code
@pytest.mark.parametrize("model_type", sorted(CONFIG_CLASSES))
def test_field_types_are_checked_in_a_remote_code_config(model_type, tmp_path, monkeypatch):
    """Loaded by trust_remote_code, the config's module is `transformers_modules.<repo>...`: its own fields (and its
    bases') are still type-checked (they were skipped as if they were transformers' own)."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    config_class = CONFIG_CLASSES[model_type]
    source = Path(txv.__file__).parent / f"{config_class.__module__.rsplit('.', 1)[1]}.py"
    repo = tmp_path / "repo"
    repo.mkdir()
    for path in {str(source), *get_relative_import_files(str(source))}:
        shutil.copy(path, repo)
    remote = get_class_from_dynamic_module(f"{source.stem}.{config_class.__name__}", str(repo))
    assert remote.__module__.startswith("transformers_modules.")
    with pytest.raises(ValueError, match="use_cache must be of type bool"):
        remote(**TINY_CONFIGS[model_type], use_cache="yes")
