"""No flag of `txv train` is dropped without a word: with `--model` (and a recipe or `--extra-config`) every flag the
user gives is applied to the loaded model, refused before any work when it contradicts the checkpoint's
architecture, or accepted silently when it equals the checkpoint's value; `--resume` refuses every flag that changes
the run's trajectory, naming each."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from hf_txvariants.cli import main
from hf_txvariants.training import TrainArgs, read_metrics
from hf_txvariants.training.arguments import (
    ARCHITECTURE_FLAGS,
    SETTING_FLAGS,
    UNTRACKED_RUN_FLAGS,
    flag_name,
    mark_given,
    plan_flags,
    resume_differences,
    resume_length_note,
)
from hf_txvariants.training.models import ModelError, build_config
from tiny_configs import TINY_TRAINING_FLAGS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAINING = Path(__file__).resolve().parents[1] / "hf_txvariants" / "training"


def _fields_read_as_args() -> set[str]:
    """Every `args.<name>` the training package reads (the loop, the corpus plan, the Trainer path)."""
    names = set()
    for path in TRAINING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
                names.add(node.attr)
    return names


def test_every_flag_has_a_role_when_a_model_is_loaded():
    """Walks the parser's options: each is an architecture flag (compared with the checkpoint), a setting (applied
    to the loaded config) or read by the training loop itself."""
    read = _fields_read_as_args()
    for field in dataclasses.fields(TrainArgs):
        roles = [field.name in ARCHITECTURE_FLAGS, field.name in SETTING_FLAGS, field.name in read]
        assert any(roles), f"--{flag_name(field.name)} has no role: it would be dropped without a word"
    assert set(ARCHITECTURE_FLAGS).isdisjoint(SETTING_FLAGS)


def _config(variant="transfo-xl", **fields):
    base = dict(d_model=32, n_layer=2, n_head=2, mem_len=16, seg_len=16, dropout=0.1)
    return build_config(variant, 40, **{**base, **fields})


def _plan(config, **flags):
    args = TrainArgs(**flags)
    return plan_flags(args, config, "m1/model", set(flags))


@pytest.mark.parametrize("variant", ["transfo-xl", "txv_vanilla"])
def test_each_class_of_flag_against_a_loaded_config(variant):
    config = _config(variant)
    # equal to the checkpoint's: accepted silently
    plan = _plan(config, d_model=32, n_layer=2, dropout=0.1, variant=variant)
    assert plan.overrides == {} and plan.changes == []
    # a setting: applied, said once
    plan = _plan(config, dropout=0.3)
    assert plan.overrides == {"dropout": 0.3} and plan.changes == ["dropout 0.1 -> 0.3 from --dropout"]
    # the architecture: refused, naming the flag, its value and the checkpoint's
    with pytest.raises(ModelError) as refused:
        _plan(config, n_layer=6, d_model=64)
    message = str(refused.value)
    assert "--n-layer 6 contradicts m1/model's num_hidden_layers 2" in message
    assert "--d-model 64 contradicts m1/model's hidden_size 32" in message
    with pytest.raises(ModelError, match="--variant 'txv_shaw' contradicts m1/model's model_type"):
        _plan(config, variant="txv_shaw")


def test_memory_length_is_a_setting_of_the_xl_family_and_refused_where_there_is_none():
    plan = _plan(_config(), mem_len=8)
    assert plan.overrides == {"mem_len": 8} and plan.changes == ["mem_len 16 -> 8 from --mem-len"]
    with pytest.raises(ModelError, match="--mem-len 8: txv_vanilla has no mem_len"):
        _plan(_config("txv_vanilla"), mem_len=8)
    assert _plan(_config("txv_vanilla"), mem_len=0).overrides == {}  # "no memory" for a model without one


def test_extra_config_fields_are_applied_when_settings_and_refused_when_architecture():
    plan = _plan(_config(), extra_config={"clamp_len": 400, "attention_dropout": 0.2})
    assert plan.overrides == {"clamp_len": 400, "attention_dropout": 0.2}
    with pytest.raises(ModelError, match="--extra-config pre_lnorm True contradicts m1/model's pre_lnorm False"):
        _plan(_config(), extra_config={"pre_lnorm": True})
    # the initialisation of weights that exist already has no effect: refused, not silently kept
    with pytest.raises(ModelError, match="--extra-config initializer_range 0.5 contradicts"):
        _plan(_config(), extra_config={"initializer_range": 0.5})
    with pytest.raises(ModelError, match="--extra-config no_such_field 1: transfo-xl has no no_such_field"):
        _plan(_config(), extra_config={"no_such_field": 1})


def test_a_flag_a_loaded_variant_has_no_field_for_is_refused_and_a_new_one_says_so():
    with pytest.raises(ModelError, match="--n-layer 3: txv_act_rnn has no num_hidden_layers"):
        _plan(_config("txv_act_rnn", n_layer=1), n_layer=3)
    config = _config("txv_act_rnn", n_layer=1)
    plan = plan_flags(TrainArgs(n_layer=3), config, "a new txv_act_rnn model", {"n_layer"}, loaded=False)
    assert plan.changes == ["--n-layer 3 does not apply: txv_act_rnn has no num_hidden_layers"]


def test_the_python_api_treats_values_other_than_the_defaults_as_given():
    from hf_txvariants.training.arguments import given_fields

    assert given_fields(TrainArgs(lr=0.5, mem_len=8)) == {"lr", "mem_len"}
    assert given_fields(mark_given(TrainArgs(lr=0.5), {"dropout"})) == {"dropout"}


def test_resume_refuses_every_flag_that_changes_the_trajectory_and_names_each():
    saved = json.loads(json.dumps(dataclasses.asdict(TrainArgs()), default=str))
    assert resume_differences(saved, TrainArgs(eval_every=7, save_every=3, progress=False)) == []
    diffs = resume_differences(saved, TrainArgs(lr=0.5, dropout=0.2, data_order="adaptive-span"))
    assert set(diffs) == {
        "--dropout 0.1 in the checkpoint, 0.2 now",
        "--lr 0.001 in the checkpoint, 0.5 now",
        "--data-order 'transformer-xl' in the checkpoint, 'adaptive-span' now",
    }
    # compiled dropout draws other masks than eager's: a resumed run keeps the --compile it began with
    assert resume_differences(saved, TrainArgs(compile=True)) == ["--compile False in the checkpoint, True now"]
    # more (or fewer) steps lengthen the run: allowed, and said where the schedule depends on them
    assert resume_differences(saved, TrainArgs(max_steps=400)) == []
    assert resume_length_note(saved, TrainArgs(max_steps=400)) == (
        "--max-steps 200 -> 400: the cosine schedule runs over 400 steps from the resumed step on (the steps before "
        "ran on a schedule of 200)"
    )
    constant = {**saved, "lr_schedule": "constant"}
    assert resume_length_note(constant, TrainArgs(max_steps=400, lr_schedule="constant")) is None
    assert {f.name for f in dataclasses.fields(TrainArgs)} >= UNTRACKED_RUN_FLAGS


def _train(tmp_path, name, *flags):
    return main(["train", "--output-dir", str(tmp_path / name), *TINY_TRAINING_FLAGS, *flags])


@pytest.mark.slow
def test_a_run_from_a_saved_model_applies_refuses_or_accepts_each_flag(tmp_path, capsys):
    assert _train(tmp_path, "m1", "--max-steps", "2") == 0
    source = str(tmp_path / "m1" / "model")
    capsys.readouterr()
    # settings applied to the loaded model, and said once
    assert _train(tmp_path, "m2", "--model", source, "--mem-len", "8", "--dropout", "0.3", "--max-steps", "2") == 0
    err = capsys.readouterr().err
    assert f"txv: {source}: mem_len 16 -> 8 from --mem-len" in err
    assert f"txv: {source}: dropout 0.1 -> 0.3 from --dropout" in err
    saved = json.loads((tmp_path / "m2" / "model" / "config.json").read_text())
    assert (saved["mem_len"], saved["dropout"]) == (8, 0.3)
    # the architecture refused before any work: no run folder content, one line
    assert _train(tmp_path, "m3", "--model", source, "--n-layer", "6", "--max-steps", "2") == 2
    err = capsys.readouterr().err
    assert err.strip().startswith("txv: error: ") and "--n-layer 6 contradicts" in err and "num_hidden_layers 2" in err
    assert read_metrics(tmp_path / "m3") == []
    # equal values: silent
    assert _train(tmp_path, "m4", "--model", source, "--n-layer", "2", "--mem-len", "16", "--max-steps", "1") == 0
    assert " -> " not in capsys.readouterr().err


@pytest.mark.slow
def test_a_recipe_with_a_saved_model_refuses_its_architecture(tmp_path, capsys):
    assert _train(tmp_path, "m1", "--max-steps", "1") == 0
    source = str(tmp_path / "m1" / "model")
    capsys.readouterr()
    code = main(
        ["train", "--recipe", "transfo-xl-enwik8-base", "--model", source, "--output-dir", str(tmp_path / "r")]
        + ["--max-steps", "1", "--no-tensorboard", "--no-progress"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--n-layer 12 contradicts" in err and "--d-model 512 contradicts" in err
