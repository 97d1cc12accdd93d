"""kimiyoung's train.py options onto `txv train` (training/transfo_xl_flags.py): every option train.py parses has one
entry, each value `txv train` cannot honour is refused by name with its reason, and the others land on the
TrainArgs and config fields that run them. The options and their defaults are the fixture read from train.py
(tests/fixtures/recipes_source.json, made by make_recipe_fixtures.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_txvariants.training import TrainArgs, build_config
from hf_txvariants.training.arguments import size_fields
from hf_txvariants.training.data import DataError
from hf_txvariants.training.transfo_xl_flags import TRAIN_PY_OPTIONS, train_py_settings

SOURCE = json.loads((Path(__file__).parent / "fixtures" / "recipes_source.json").read_text())["transformer_xl"]
DEFAULTS = SOURCE["enwik8_base"]["train"]  # train.py's argparse defaults under run_enwik8_base.sh's flags


def test_every_option_of_train_py_has_one_entry():
    for script in SOURCE.values():
        assert set(script["train"]) == set(TRAIN_PY_OPTIONS)


def test_the_run_scripts_options_map_to_a_valid_run():
    for name, script in SOURCE.items():
        if script["train"]["dataset"] == "lm1b":
            continue
        settings = train_py_settings(script["train"])
        args = TrainArgs(**settings.train_args, extra_config=settings.extra_config)
        config = build_config(args.variant, 300000, **{**size_fields(args), **args.extra_config})
        train = script["train"]
        assert (args.seg_len, args.mem_len, args.eval_seg_len, args.grad_accum) == (
            train["tgt_len"],
            train["mem_len"],
            train["eval_tgt_len"],
            train["batch_chunk"],
        ), name
        assert (config.head_dim, config.attention_dropout, config.div_val) == (
            train["d_head"],
            train["dropatt"],
            train["div_val"],
        )
        assert args.lr_schedule == "transformer-xl" and (args.optimizer, args.weight_decay) == ("adamw", 0.0)
        assert config.cutoffs == ([20000, 40000, 200000] if train["adaptive"] else [])


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("ext_len", 8, "--ext_len 8: the extended context"),
        ("varlen", True, "--varlen True: variable segment lengths"),
        ("fp16", True, "--fp16 True: apex's FP16_Optimizer"),
        ("attn_type", 2, "--attn_type 2: only the paper's relative attention"),
        ("sample_softmax", 1000, "--sample_softmax 1000: the sampled softmax"),
        ("clip_nonemb", True, "--clip_nonemb True"),
        ("mom", 0.9, "--mom 0.9: SGD with momentum"),
        ("optim", "sgd", "--optim 'sgd': train.py's plain sgd is not offered"),
        ("scheduler", "dev_perf", "--scheduler 'dev_perf': the learning rate halved on a validation plateau"),
        ("dataset", "lm1b", "--dataset 'lm1b': the one-billion-word shuffled sentence iterator"),
        ("restart", True, "--restart True: train.py's restart"),
    ],
)
def test_an_option_txv_train_cannot_honour_is_refused_by_name_with_its_reason(option, value, words):
    with pytest.raises(DataError, match="train.py option\\(s\\) txv train cannot honour: ") as refused:
        train_py_settings({**DEFAULTS, option: value})
    assert words in str(refused.value)


def test_the_schedules_and_their_floor_map_to_the_originals_schedules():
    for scheduler, ours in (("inv_sqrt", "transformer-xl-inv-sqrt"), ("constant", "transformer-xl-constant")):
        assert train_py_settings({**DEFAULTS, "scheduler": scheduler}).train_args["lr_schedule"] == ours
    settings = train_py_settings({**DEFAULTS, "eta_min": 1e-6, "max_eval_steps": 5, "not_tied": True})
    assert settings.train_args["eta_min"] == 1e-6 and settings.train_args["eval_segments"] == 5
    assert settings.extra_config["tie_word_embeddings"] is False


def test_an_unknown_option_is_refused():
    with pytest.raises(DataError, match="train.py has no option\\(s\\) --n_layers"):
        train_py_settings({**DEFAULTS, "n_layers": 3})
