"""`txv train --recipe`: each preset holds the values of its original script (tests/fixtures/recipes_source.json,
written by tests/fixtures/make_recipe_fixtures.py from clones of the two repositories), builds its model (on the meta
device: nothing of the size of the real models is allocated), is printed in full, and yields to the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from hf_txvariants.cli import main
from hf_txvariants.cli.train import given_train_fields
from hf_txvariants.training.adaptive_span_flags import PRESETS
from hf_txvariants.training.arguments import size_fields
from hf_txvariants.training.loop import read_metrics
from hf_txvariants.training.models import build_config, build_model
from hf_txvariants.training.optimizers import PerParameterClippedAdagrad
from hf_txvariants.training.recipes import RECIPES, describe_recipe, get_recipe, recipe_train_args

SOURCE = json.loads((Path(__file__).parent / "fixtures" / "recipes_source.json").read_text())
TRANSFO_XL = {f"transfo-xl-{key.replace('_', '-')}": key for key in SOURCE["transformer_xl"]}
ADAPTIVE_SPAN = {f"adaptive-span-{key.replace('_', '-')}": key for key in SOURCE["adaptive_span"]}
# the vocabulary sizes of the three corpora as the originals build them: WikiText-103's words (TransfoXLConfig's default
# vocab_size, the pretrained wt103 vocabulary), enwik8's bytes that occur (model_cards/transfo-xl-enwik8.md: 204
# symbols), text8's a-z and space
VOCAB = {"word": 267735, "byte": 204, "char": 27}
TOKENIZER_OF = {"wt103": "word", "enwik8": "byte", "text8": "char"}


def test_there_is_a_recipe_for_every_script_of_the_fixture():
    assert set(RECIPES) == set(TRANSFO_XL) | set(ADAPTIVE_SPAN)


def _config(args):
    return build_config(args.variant, VOCAB[args.tokenizer], **{**size_fields(args), **args.extra_config})


@pytest.mark.parametrize("name", sorted(TRANSFO_XL))
def test_transfo_xl_recipe_holds_its_scripts_values(name):
    script = SOURCE["transformer_xl"][TRANSFO_XL[name]]
    train, evaluation = script["train"], script["eval"]
    args = recipe_train_args(name)
    assert train["optim"] == "adam" and train["scheduler"] == "cosine" and train["eta_min"] == 0.0
    # Adam; train.py's cosine, counted from step 0 down to eta_min; its ordered iterator
    assert (args.optimizer, args.weight_decay, args.lr_schedule) == ("adamw", 0.0, "transformer-xl")
    assert (args.eta_min, args.data_order) == (train["eta_min"], "transformer-xl")
    assert args.variant == "transfo-xl" and args.tokenizer == TOKENIZER_OF[train["dataset"]]
    expected = dict(
        n_layer=train["n_layer"],
        d_model=train["d_model"],
        n_head=train["n_head"],
        d_inner=train["d_inner"],
        dropout=train["dropout"],
        seg_len=train["tgt_len"],
        mem_len=train["mem_len"],
        batch_size=train["batch_size"],
        lr=train["lr"],
        warmup_steps=train["warmup_step"],
        max_steps=train["max_step"],
        clip_norm=train["clip"],
        seed=train["seed"],
        eval_every=train["eval_interval"],
        eval_batch_size=script["eval_batch_size"],
        eval_seg_len=train["eval_tgt_len"],
    )
    assert {key: getattr(args, key) for key in expected} == expected
    config = _config(args)
    assert config.head_dim == train["d_head"] and config.attention_dropout == train["dropatt"]
    assert (config.clamp_len, config.same_length, config.pre_lnorm) == (train["clamp_len"], False, train["pre_lnorm"])
    assert (config.init, config.initializer_range, config.proj_init_std) == (
        train["init"],
        train["init_std"],
        train["proj_init_std"],
    )
    assert list(config.cutoffs) == script.get("cutoffs", [])
    if train["adaptive"]:
        assert config.div_val == train["div_val"] and list(config.tie_projs) == script["tie_projs"]
    with torch.device("meta"):
        model = build_model(config)
    assert model.config.num_hidden_layers == train["n_layer"]
    # how the script evaluates is printed with the recipe
    text = get_recipe(name).evaluation
    for key in ("tgt_len", "mem_len", "clamp_len"):
        assert f"{key} {evaluation[key]}" in text, key
    assert evaluation["same_length"] and "same_length" in text


@pytest.mark.parametrize("name", sorted(ADAPTIVE_SPAN))
def test_adaptive_span_recipe_holds_its_scripts_values(name):
    script = SOURCE["adaptive_span"][ADAPTIVE_SPAN[name]]
    train = script["train"]
    args = recipe_train_args(name)
    assert train["optim"] == "adagrad" and (args.optimizer, args.lr_schedule) == ("adagrad", "adaptive-span")
    assert args.data_order == "adaptive-span"
    assert args.variant == "txv_adaptive_span_original"
    assert args.tokenizer == TOKENIZER_OF[Path(train["data"]).name]
    expected = dict(
        n_layer=train["nlayers"],
        d_model=train["hid_sz"],
        n_head=train["nheads"],
        d_inner=train["inner_hid_sz"],
        dropout=train["dropout"],
        seg_len=train["block_sz"],
        batch_size=train["batch_sz"],
        grad_accum=train["batch_split"],
        lr=train["lr"],
        warmup_steps=train["lr_warmup"],
        max_steps=train["niter"] * train["nbatches"],
        clip_norm=train["grad_clip"],
        eval_every=train["nbatches"],
    )
    assert {key: getattr(args, key) for key in expected} == expected
    config = _config(args)
    assert (config.attn_span, config.block_size, config.attention_dropout, config.emb_dropout) == (
        train["attn_span"],
        train["block_sz"],
        train["dropout"],
        train["emb_dropout"],
    )
    assert (
        config.adapt_span_enabled,
        config.adapt_span_loss,
        config.adapt_span_ramp,
        config.adapt_span_init,
        config.adapt_span_cache,
    ) == (
        train["adapt_span"],
        train["adapt_span_loss"],
        train["adapt_span_ramp"],
        train["adapt_span_init"],
        train["adapt_span_cache"],
    )
    assert config.persistent_memory_size == train["pers_mem_size"]
    # the published size (README, kept in the converter's presets) of the model the recipe builds
    with torch.device("meta"):
        model = build_model(config)
    published = float(re.search(r"\((\d+)M parameters\)", PRESETS[ADAPTIVE_SPAN[name]]["result"]).group(1))
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(published, rel=0.02)
    if "fine_tune" in script:  # the second stage is printed as the command to run
        extra = (script["fine_tune"]["niter"] - train["niter"]) * train["nbatches"]
        assert any(f"--lr {script['fine_tune']['lr']} --max-steps {extra}" in d for d in get_recipe(name).differences)


def test_the_command_line_overrides_the_recipe_and_the_print_says_so():
    argv = [
        "train",
        "--recipe",
        "adaptive-span-text8",
        "--lr",
        "0.01",
        "--seg-len",
        "32",
        "--no-tensorboard",
        "--extra-config",
        '{"attn_span": 64}',
    ]
    given = given_train_fields(argv)
    assert given == {"lr", "seg_len", "tensorboard", "extra_config"}
    args = recipe_train_args(
        "adaptive-span-text8", lr=0.01, seg_len=32, tensorboard=False, extra_config={"attn_span": 64}
    )
    assert (args.lr, args.seg_len, args.tensorboard) == (0.01, 32, False)
    assert args.extra_config["attn_span"] == 64  # merged: the recipe's other config fields stay
    assert args.extra_config["adapt_span_loss"] == RECIPES["adaptive-span-text8"].extra_config["adapt_span_loss"]
    assert args.extra_config["block_size"] == 32  # follows --seg-len
    text = describe_recipe("adaptive-span-text8", args, given)
    assert "lr: 0.01  (command line; recipe: 0.07)" in text and "attn_span: 64  (command line)" in text
    assert "experiments/text8.sh" in text and "Adagrad lr 0.07" in text


def test_a_config_field_given_under_its_papers_name_replaces_the_recipes(tmp_path):
    """`--extra-config '{"d_head": 32}'` on a recipe that sets `head_dim` 41: the model gets 32 (one field, not two
    names of it that the config would have to choose between)."""
    from hf_txvariants.training.models import build_config

    args = recipe_train_args(
        "transfo-xl-wt103-base", extra_config={"d_head": 32, "d_embed": 128}, d_model=128, n_head=4
    )
    assert args.extra_config["head_dim"] == 32 and "d_head" not in args.extra_config
    config = build_config(
        args.variant, 300000, d_model=args.d_model, n_layer=2, n_head=args.n_head, **args.extra_config
    )
    assert (config.head_dim, config.d_embed) == (32, 128)


def test_a_recipe_trains_from_the_command_line(tmp_path, capsys):
    """A tiny run of the adaptive-span recipe (its Adagrad and constant schedule), every size overridden."""
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--recipe",
            "adaptive-span-enwik8",
            "--tokenizer",
            "char",
            "--d-model",
            "16",
            "--n-layer",
            "1",
            "--n-head",
            "2",
            "--d-inner",
            "32",
            "--seg-len",
            "8",
            "--batch-size",
            "2",
            "--max-steps",
            "3",
            "--warmup-steps",
            "2",
            "--max-chars",
            "2000",
            "--eval-every",
            "0",
            "--no-progress",
            "--no-tensorboard",
            "--no-save-model",
            "--output-dir",
            str(out),
            "--extra-config",
            '{"attn_span": 16}',
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    block = printed.split("validation:")[0]
    assert block.startswith("recipe adaptive-span-enwik8: facebookresearch/adaptive-span experiments/enwik8.sh")
    assert "optimizer: 'adagrad'" in block and "max_steps: 3  (command line; recipe: 600000)" in block
    lrs = [m["lr"] for m in read_metrics(out) if m["split"] == "train"]
    assert lrs == pytest.approx([0.035, 0.07, 0.07])  # linear warm-up over 2 steps, then constant


def test_recipe_list_and_an_unknown_name(capsys):
    assert main(["train", "--recipe", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in listed] == list(RECIPES)
    assert main(["train", "--recipe", "transfo-xl-wt2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("txv: error: unknown recipe 'transfo-xl-wt2'") and "transfo-xl-wt103-base" in err


def test_per_parameter_clipped_adagrad_is_adaptive_spans_update():
    """Below the clip it is torch's Adagrad; above, that step scaled by clip / norm, while the accumulator takes the
    whole squared gradient (adaptive-span's adagrad_with_grad_clip.py)."""
    small, large = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    reference = torch.nn.Parameter(torch.ones(3))
    optimizer = PerParameterClippedAdagrad([small, large], lr=0.1, grad_clip=1.0)
    torch_adagrad = torch.optim.Adagrad([reference], lr=0.1, eps=1e-10)
    for gradient in (torch.tensor([0.1, 0.2, -0.3]), torch.tensor([0.3, -0.1, 0.2])):
        small.grad, reference.grad, large.grad = gradient.clone(), gradient.clone(), gradient * 10
        before = large.detach().clone()
        optimizer.step()
        torch_adagrad.step()
        torch.testing.assert_close(small.detach(), reference.detach())
        expected_sum = optimizer.state[large]["sum"]
        scale = 1.0 / (float((gradient * 10).norm()) + 1e-10)
        torch.testing.assert_close(before - large.detach(), 0.1 * scale * gradient * 10 / (expected_sum.sqrt() + 1e-10))


def test_the_adaptive_span_flags_txv_train_cannot_honour_are_refused_by_name():
    from hf_txvariants.training.adaptive_span_flags import parse_original_flags, train_settings_from_flags

    flags, _ = parse_original_flags(["--optim", "adagrad", "--adapt-io"])
    with pytest.raises(ValueError, match="--adapt-io .* has no txv_adaptive_span_original field"):
        train_settings_from_flags(flags)
    flags, _ = parse_original_flags(["--optim", "sgd"])
    with pytest.raises(ValueError, match="--optim sgd has no txv train equivalent"):
        train_settings_from_flags(flags)
