"""`txv train --recipe NAME`: the hyper-parameters of the original training scripts, as `TrainArgs` presets.

* kimiyoung/transformer-xl, pytorch/run_{wt103,enwik8,text8}_{base,large}.sh (`train` branch), with pytorch/train.py's
  defaults for what a script leaves out (train.py also picks the WikiText-103 cutoffs and `tie_projs`);
* facebookresearch/adaptive-span, experiments/{enwik8,enwik8_large,text8,text8_large}.sh, with config.py's defaults,
  mapped onto `txv_adaptive_span_original` by the one mapping the checkpoint converter uses (adaptive_span_flags.py).

A recipe holds `TrainArgs` fields and the config fields beyond them (`extra_config`); any flag given on the command
line overrides the recipe, and `--extra-config` adds to (and overrides) the recipe's config fields. What `txv train`
cannot do as the original did is listed in the recipe's `differences` and printed with it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .adaptive_span_flags import PRESETS, parse_original_flags, train_settings_from_flags
from .data import DataError
from .transfo_xl_flags import train_py_settings

TRANSFO_XL_REPO = "kimiyoung/transformer-xl"
ADAPTIVE_SPAN_REPO = "facebookresearch/adaptive-span"

# pytorch/train.py: the argparse defaults the recipes read (what the run_*.sh scripts leave out).
TRANSFO_XL_TRAIN_DEFAULTS = dict(
    clip=0.25,
    scheduler="cosine",
    eta_min=0.0,
    warmup_step=0,
    seed=1111,
    eval_interval=4000,
    div_val=1,
    init="normal",
    init_std=0.02,
    proj_init_std=0.01,
    init_range=0.1,
    clamp_len=-1,
    same_length=False,
    pre_lnorm=False,
    optim="adam",
)

# pytorch/run_enwik8_base.sh (run_text8_base.sh sets the same flags)
_ENWIK8_BASE = dict(
    dataset="enwik8",
    n_layer=12,
    d_model=512,
    n_head=8,
    d_head=64,
    d_inner=2048,
    dropout=0.1,
    dropatt=0.0,
    optim="adam",
    lr=0.00025,
    warmup_step=0,
    max_step=400000,
    tgt_len=512,
    mem_len=512,
    eval_tgt_len=128,
    batch_size=22,
    eval=dict(tgt_len=80, mem_len=2100, clamp_len=820, same_length=True),
)

# The `train` flags of pytorch/run_*.sh (those that set the model or the optimisation), and the `eval` branch.
TRANSFO_XL_SCRIPTS = {
    "wt103-base": dict(
        dataset="wt103",
        adaptive=True,
        n_layer=16,
        d_model=410,
        n_head=10,
        d_head=41,
        d_inner=2100,
        dropout=0.1,
        dropatt=0.0,
        optim="adam",
        lr=0.00025,
        warmup_step=0,
        max_step=200000,
        tgt_len=150,
        mem_len=150,
        eval_tgt_len=150,
        batch_size=60,
        eval=dict(tgt_len=64, mem_len=640, clamp_len=400, same_length=True),
    ),
    "wt103-large": dict(
        dataset="wt103",
        adaptive=True,
        div_val=4,
        n_layer=18,
        d_model=1024,
        n_head=16,
        d_head=64,
        d_inner=4096,
        dropout=0.2,
        dropatt=0.2,
        optim="adam",
        lr=0.00025,
        warmup_step=16000,
        max_step=4000000,
        tgt_len=384,
        mem_len=384,
        eval_tgt_len=128,
        batch_size=128,
        eval=dict(tgt_len=128, mem_len=1600, clamp_len=1000, same_length=True),
    ),
    "enwik8-base": _ENWIK8_BASE,
    "enwik8-large": dict(
        dataset="enwik8",
        n_layer=24,
        d_model=1024,
        n_head=8,
        d_head=128,
        d_inner=3072,
        dropout=0.15,
        dropatt=0.15,
        optim="adam",
        lr=0.00025,
        warmup_step=4000,
        max_step=400000,
        tgt_len=768,
        mem_len=768,
        eval_tgt_len=128,
        batch_size=64,
        eval=dict(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True),
    ),
    "text8-base": {**_ENWIK8_BASE, "dataset": "text8"},  # run_text8_base.sh: run_enwik8_base.sh's flags
    "text8-large": dict(
        dataset="text8",
        n_layer=24,
        d_model=1024,
        n_head=8,
        d_head=128,
        d_inner=3072,
        dropout=0.15,
        dropatt=0.15,
        optim="adam",
        lr=0.00025,
        tgt_len=768,
        mem_len=768,
        eval_tgt_len=128,
        batch_size=64,
        max_step=400000,
        eval=dict(tgt_len=128, mem_len=3800, clamp_len=1000, same_length=True),
    ),
}

# What each corpus is made of in the originals, as a `--tokenizer`. kimiyoung's and adaptive-span's enwik8 (both
# prep_enwik8.py) write each byte of the file as one symbol; text8 (prep_text8.py) is lower-case letters and spaces,
# one symbol per character; WikiText-103 is words (data_utils.py: split on whitespace, `<eos>` per line, no
# lower-casing, every word of the training set in the vocabulary: min_freq 0, no max_size).
TOKENIZERS = {"wt103": "word", "enwik8": "byte", "text8": "char"}
VOCABULARIES = {
    "wt103": "every whitespace-separated word of the training set (min_freq 0, no max_size, case kept) + <eos> "
    "per line (267,735 symbols)",
    "enwik8": "the bytes that occur in the training set, one symbol each (prep_enwik8.py)",
    "text8": "the characters of the training set (27: a-z and space; prep_text8.py)",
}


@dataclass(frozen=True)
class Recipe:
    """One original training script as `txv train` settings."""

    name: str
    source: str  # repository and script(s) the values come from
    train_args: dict  # TrainArgs fields
    extra_config: dict  # config fields beyond TrainArgs' size fields
    original_optimisation: str  # the optimiser and schedule as the original runs them
    differences: tuple[str, ...]  # what `txv train` does differently, or cannot do
    evaluation: str  # how the original evaluates the trained model
    vocabulary: str
    config_follows: dict = field(default_factory=dict)  # config field -> the TrainArgs field it always equals
    train_follows: dict = field(default_factory=dict)  # TrainArgs field -> the one it equals unless given itself


def _transfo_xl_recipe(key: str) -> Recipe:
    script = {**TRANSFO_XL_TRAIN_DEFAULTS, **TRANSFO_XL_SCRIPTS[key]}
    dataset = script["dataset"]
    # the one mapping of train.py's options onto txv train (training/transfo_xl_flags.py)
    settings = train_py_settings({name: value for name, value in script.items() if name != "eval"})
    train_args, extra = settings.train_args, settings.extra_config
    evaluation = script["eval"]
    size = key.split("-")[1]
    differences = [
        "Adam is AdamW with --weight-decay 0 (the same update)",
        "txv keeps the last model (OUT/model); train.py keeps the model of the best validation and tests that one",
    ]
    return Recipe(
        name=f"transfo-xl-{key}",
        source=f"{TRANSFO_XL_REPO} pytorch/run_{dataset}_{size}.sh train (+ pytorch/train.py defaults)",
        train_args=train_args,
        extra_config=extra,
        original_optimisation=(
            f"Adam lr {script['lr']}, linear warm-up {script['warmup_step']} steps then cosine "
            f"annealing to eta_min {script['eta_min']} at max_step {script['max_step']}, "
            f"gradient-norm clip {script['clip']}"
        ),
        differences=tuple(differences),
        evaluation=(
            f"run_{dataset}_{size}.sh eval: test split, tgt_len {evaluation['tgt_len']}, mem_len "
            f"{evaluation['mem_len']}, clamp_len {evaluation['clamp_len']}, same_length: set "
            f'"clamp_len": {evaluation["clamp_len"]}, "same_length": true in OUT/model/config.json, then '
            f"`txv eval --model OUT/model --data TEST --seg-len {evaluation['tgt_len']} --mem-len "
            f"{evaluation['mem_len']} --batch-size 10`"
        ),
        vocabulary=VOCABULARIES[dataset],
    )


def _adaptive_span_recipe(preset: str) -> Recipe:
    spec = PRESETS[preset]
    flags, _ = parse_original_flags(spec["flags"].split(), error_class=DataError)
    train_args, config = train_settings_from_flags(flags)
    train_args["tokenizer"] = TOKENIZERS[spec["data"]]
    differences = [
        "mem_len 0: the model keeps its own cache of past hidden states (attn_span, trimmed by adapt_span_cache)",
        "the original validates on a fixed number of batches after every iteration of --nbatches steps; txv on the "
        "validation text every --eval-every steps",
    ]
    if spec.get("fine_tune"):
        tune, _ = parse_original_flags(spec["fine_tune"].split(), error_class=DataError)
        extra_steps = (tune["nb_iter"] - flags["nb_iter"]) * flags["nb_batches_per_iter"]
        differences.append(
            f"the script then fine-tunes {extra_steps} more steps at lr {tune['lr']} ({spec['fine_tune']}, resuming "
            f"the optimiser); a recipe is one stage: run `txv train --recipe adaptive-span-{preset.replace('_', '-')} "
            f"--model OUT/model --lr {tune['lr']} --max-steps {extra_steps} --warmup-steps 0` (new Adagrad state)"
        )
    return Recipe(
        name=f"adaptive-span-{preset.replace('_', '-')}",
        source=f"{ADAPTIVE_SPAN_REPO} experiments/{preset}.sh (+ config.py defaults)",
        train_args=train_args,
        extra_config=config,
        original_optimisation=(
            f"Adagrad lr {flags['lr']} with each parameter's gradient clipped at "
            f"{flags['grad_clip']} (adagrad_with_grad_clip.py), linear warm-up {flags['lr_warmup']} "
            f"steps then constant, {flags['nb_iter']} iterations of {flags['nb_batches_per_iter']} "
            f"batches of {flags['batch_size']} x {flags['block_size']} "
            f"(batch split {flags['batch_split']})"
        ),
        differences=tuple(differences),
        evaluation=(
            f"experiments/{preset}.sh: --full-eval-mode --batch-sz 8 (every token of the validation and test "
            "text): `txv eval --model OUT/model --data TEST "
            f"--seg-len {flags['block_size']} --batch-size 8`; published: {spec['result']}"
        ),
        vocabulary=VOCABULARIES[spec["data"]],
        config_follows={"block_size": "seg_len", "attention_dropout": "dropout"},
        train_follows={"eval_batch_size": "batch_size"},  # its validation data has the training batch's rows
    )


def _all_recipes() -> dict[str, Recipe]:
    recipes = [_transfo_xl_recipe(key) for key in TRANSFO_XL_SCRIPTS]
    recipes += [_adaptive_span_recipe(preset) for preset in ("enwik8", "enwik8_large", "text8", "text8_large")]
    return {recipe.name: recipe for recipe in recipes}


RECIPES = _all_recipes()


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise DataError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)} (`txv train --recipe list`)")
    return RECIPES[name]


def recipe_train_args(name: str, **overrides):
    """The `TrainArgs` of recipe `name`, with `overrides` (TrainArgs fields) taking precedence; an `extra_config`
    override is merged into the recipe's config fields."""
    from .arguments import TrainArgs
    from .models import config_class

    recipe = get_recipe(name)
    known = {f.name for f in dataclasses.fields(TrainArgs)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise DataError(f"recipe {name}: no TrainArgs field(s) {unknown}")
    values = {**recipe.train_args, **overrides}
    for train_field, source in recipe.train_follows.items():
        if train_field not in overrides:
            values[train_field] = values[source]
    # a config field given under a paper's name (`d_head`) replaces the recipe's field of the same meaning (`head_dim`)
    aliases = getattr(config_class(values["variant"]), "attribute_map", {})

    def canonical(fields: dict) -> dict:
        return {aliases.get(key, key): value for key, value in fields.items()}

    given = canonical(dict(overrides.get("extra_config") or {}))
    extra = {**canonical(recipe.extra_config), **given}
    for config_field, train_field in recipe.config_follows.items():
        if aliases.get(config_field, config_field) not in given:
            extra[config_field] = values[train_field]
    return TrainArgs(**{**values, "extra_config": extra})


def recipe_given_fields(name: str) -> set[str]:
    """The TrainArgs fields recipe `name` sets (its config fields count as `extra_config`)."""
    recipe = get_recipe(name)
    return set(recipe.train_args) | ({"extra_config"} if recipe.extra_config or recipe.config_follows else set())


def describe_recipe(name: str, args=None, given: set[str] = frozenset()) -> str:
    """The recipe in full, one block: its source, every TrainArgs field (marked where the command line overrides the
    recipe, or where neither sets it), the config fields, the original's optimisation, what differs, how the
    original evaluates and its vocabulary."""
    from .arguments import TrainArgs

    recipe = get_recipe(name)
    args = args if args is not None else recipe_train_args(name)
    lines = [f"recipe {recipe.name}: {recipe.source}", "  txv train settings:"]
    for f in dataclasses.fields(TrainArgs):
        if f.name == "extra_config":
            continue
        value = getattr(args, f.name)
        if f.name in given:
            note = (
                f"  (command line; recipe: {recipe.train_args[f.name]!r})"
                if f.name in recipe.train_args
                else "  (command line)"
            )
        else:
            note = "" if f.name in recipe.train_args else "  (txv default)"
        lines.append(f"    {f.name}: {value!r}{note}")
    lines.append("  model config fields (--extra-config):")
    for key, value in args.extra_config.items():
        note = ""
        if key in recipe.config_follows:
            note = f"  (= {recipe.config_follows[key]})"
        elif key not in recipe.extra_config or recipe.extra_config[key] != value:
            note = "  (command line)"
        lines.append(f"    {key}: {value!r}{note}")
    lines.append(f"  original optimisation: {recipe.original_optimisation}")
    lines.append(f"  vocabulary of the original: {recipe.vocabulary}")
    lines += ["  differs in txv train:"] + [f"    - {d}" for d in recipe.differences]
    lines.append(f"  evaluation as the original: {recipe.evaluation}")
    return "\n".join(lines)


def list_recipes() -> str:
    return "\n".join(f"{recipe.name}: {recipe.source}" for recipe in RECIPES.values())


__all__ = [
    "RECIPES",
    "Recipe",
    "describe_recipe",
    "get_recipe",
    "list_recipes",
    "recipe_given_fields",
    "recipe_train_args",
]
