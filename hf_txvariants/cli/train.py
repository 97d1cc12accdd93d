"""`txv train`: a causal language model of any text variant, with the Accelerate loop (`training/loop.py`, also under
`accelerate launch`) or with transformers' Trainer (`--trainer`, `training/trainer.py`); every flag is a field of
`hf_txvariants.training.TrainArgs`, and `--recipe NAME` starts from an original training script's settings."""

from __future__ import annotations

import argparse
import dataclasses


def add_parser(sub, name: str, help_text: str):
    """`txv train` (see hf_txvariants_commands.COMMANDS)."""
    from ..training.arguments import TrainArgs
    from ..training.models import text_variant_names

    train = sub.add_parser(
        name,
        help=help_text,
        description="Train a causal language model of any text variant. Every flag is a field of "
        "hf_txvariants.training.TrainArgs.",
        dataclass_types=[TrainArgs],
    )
    train.add_argument(
        "--trainer",
        action="store_true",
        help="train with transformers' Trainer (MemoryTrainer: memory carried, one process) instead "
        "of the Accelerate loop",
    )
    train.add_argument(
        "--recipe",
        metavar="NAME",
        help="start from the hyper-parameters of an original training script (every flag given "
        "overrides it; the preset is printed in full); `--recipe list` lists them",
    )
    # the registered text variants are known only once the package is imported, after TrainArgs was defined
    train._option_string_actions["--variant"].help = f"model variant, one of: {', '.join(text_variant_names())}"
    # `main` calls it with the command line and stores its answer as `given_flags`, read by `run`
    train.set_defaults(func=run, read_given_flags=given_train_fields)
    return train


def given_train_fields(argv: list[str]) -> set[str]:
    """The TrainArgs fields that `argv` (a `txv train` command line) sets explicitly: it is parsed again by a parser
    whose defaults are all suppressed, so only what was given lands in the namespace."""
    from ..training.arguments import TrainArgs
    from . import build_parser

    parser = build_parser()
    train = next(action for action in parser._subparsers._group_actions).choices["train"]
    for action in train._actions:
        action.default = argparse.SUPPRESS
    train.set_defaults(**{})
    given = vars(parser.parse_args(argv))
    return {f.name for f in dataclasses.fields(TrainArgs)} & set(given)


def train_args_from(args: argparse.Namespace):
    """The `TrainArgs` of a parsed `txv train` command line (validated: a bad number names its flag)."""
    from ..training.arguments import TrainArgs

    return TrainArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainArgs)})


def run(args):
    from ..training.arguments import mark_given

    given = getattr(args, "given_flags", set())
    if args.recipe is not None:
        from ..training.recipes import describe_recipe, list_recipes, recipe_given_fields, recipe_train_args

        if args.recipe == "list":
            print(list_recipes())
            return
        train_args = recipe_train_args(args.recipe, **{name: getattr(args, name) for name in given})
        print(describe_recipe(args.recipe, train_args, given))
        # a recipe's settings are asked for as much as the flags: with --model each is applied, refused or equal
        given = given | recipe_given_fields(args.recipe)
    else:
        train_args = train_args_from(args)  # validated (a bad number names its flag) before anything is loaded
    mark_given(train_args, given)
    if args.trainer:
        from ..training.trainer import train_with_trainer

        metrics = train_with_trainer(train_args)
        print(
            f"validation: {metrics['eval_bpc']:.4f} bits per token, perplexity {metrics['eval_perplexity']:.3f}"
            + (f"; model saved to {train_args.output_dir}/model" if train_args.save_model else "")
        )
        return
    from ..training.loop import describe_training, train

    result = train(train_args)
    if result["eval"] and result["history"]:  # printed by the main process only
        final = result["eval"][-1]
        if result["last_training"]:
            print(f"last training step: {describe_training(result['last_training'])}")
        print(
            f"validation: {final['bpc']:.4f} bits per token, perplexity {final['perplexity']:.3f} "
            f"({final['tokens']} tokens)" + (f"; model saved to {result['model_dir']}" if args.save_model else "")
        )
