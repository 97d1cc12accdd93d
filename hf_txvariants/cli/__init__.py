"""The `txv` command: `txv demo`, `txv train`, `txv eval`, `txv push`, `txv convert`, `txv refresh-code`,
`txv upgrade-legacy`, `txv serve`.

Every expected failure (a bad argument, a missing, corrupt or unsafe file, an offline Hub, a bad number) ends with one
line `txv: error: <what and where>` and exit status 2; `--debug` (anywhere on the line) shows the traceback instead."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from hf_txvariants_commands import COMMANDS, DESCRIPTION, add_version_argument

from .errors import UsageError, run_guarded


def _int_at_least(low: int, what: str):
    """An argparse type: an integer >= `low`, else an error that says what was expected and what was given."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def _train_args(args):
    import dataclasses

    from ..training.arguments import TrainArgs

    return TrainArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainArgs)})


def _train(args):
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
        train_args = _train_args(args)  # validated (a bad number names its flag) before anything is loaded
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


def _load_tokenizer(path):
    from transformers import AutoTokenizer

    from ..training.models import ModelError

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ModelError(f"no tokenizer in {path}: {str(error).splitlines()[0]}") from None


def _eval(args):
    from ..training import encode, evaluate_sliding_window, evaluate_text, load_model, load_text
    from ..training.models import uses_memory

    if args.no_progress:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the "Loading weights" bar too
    model = load_model(args.model)
    tokenizer = _load_tokenizer(args.model)
    text = load_text(args.data, args.text_column)
    if args.max_chars:
        text = text[: args.max_chars]
    tokens = encode(tokenizer, text)
    if args.mem_len is not None and hasattr(model, "reset_memory_length"):
        model.reset_memory_length(args.mem_len)
    progress = not args.no_progress
    if args.window:
        result = evaluate_sliding_window(model, tokens, args.window, args.batch_size, progress=progress)
        how = f"sliding window {args.window}"
    else:
        result = evaluate_text(model, tokens, args.batch_size, args.seg_len, progress=progress)
        how = f"segments of {args.seg_len}" + (f", memory {model.config.mem_len}" if uses_memory(model) else "")
    print(
        f"{result['bpc']:.4f} bits per token, perplexity {result['perplexity']:.3f}, {result['tokens']} tokens "
        f"({how}), {result['tokens_per_second']:,.0f} tokens/s"
    )
    print(json.dumps(result))


def _push(args):
    from huggingface_hub import constants

    from ..hub import push_to_hub
    from ..training import load_model

    # what is wrong on this machine first (a missing folder or card), then whether the Hub can be reached
    if not Path(args.model).is_dir():
        raise UsageError(f"model folder not found: {args.model}")
    if args.card is not None and not Path(args.card).is_file():
        raise UsageError(f"model card not found: {args.card}")
    if constants.HF_HUB_OFFLINE:
        raise UsageError("cannot push to the Hub: HF_HUB_OFFLINE is set (unset it to upload)")
    model = load_model(args.model)
    tokenizer = _load_tokenizer(args.model)
    metrics = {}
    results = Path(args.model) / "eval_results.json"
    if results.exists():
        try:
            metrics = json.loads(results.read_text())
        except json.JSONDecodeError as error:
            raise UsageError(f"{results} is not valid JSON ({error})") from None
    info = push_to_hub(
        model,
        args.repo_id,
        tokenizer,
        metrics,
        private=args.private,
        dataset=args.dataset,
        base_card=args.card,
        token=args.token,
        revision=args.revision,
        commit_message=args.commit_message,
        create_pr=args.create_pr,
    )
    print(f"pushed to {getattr(info, 'pr_url', None) or getattr(info, 'commit_url', info)}")


def _refresh_code(args):
    from ..hub import refresh_code

    try:
        written = refresh_code(args.folder)
    except (OSError, ValueError) as error:
        raise UsageError(str(error)) from None
    print(f"{args.folder}: model code refreshed ({', '.join(written)}); weights untouched")


class TxvParser(argparse.ArgumentParser):
    """argparse with `transformers.HfArgumentParser`'s dataclass support (used for `txv train`), whose usage errors
    become one `txv: error:` line like every other error."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}" if " " in self.prog else message)


def _hf_parser_class():
    from transformers import HfArgumentParser

    class TxvDataclassParser(HfArgumentParser):
        error = TxvParser.error

    return TxvDataclassParser


def add_train_parser(sub, name: str, help_text: str):
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
    train.set_defaults(func=_train)
    return train


def add_eval_parser(sub, name: str, help_text: str):
    ev = sub.add_parser(name, help=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ev.add_argument("--model", required=True, help="saved model folder or Hub repo id")
    ev.add_argument("--data", help="text file / folder / saved dataset (default: the embedded corpus)")
    ev.add_argument("--text-column", default="text", help="column of a saved `datasets` folder that holds the text")
    ev.add_argument("--max-chars", type=positive_int, help="use only the first N characters")
    ev.add_argument("--seg-len", type=positive_int, default=64, help="tokens per evaluation segment")
    ev.add_argument("--mem-len", type=non_negative_int, help="memory length at evaluation (memory models)")
    ev.add_argument("--batch-size", type=positive_int, default=1, help="rows evaluated in parallel")
    ev.add_argument(
        "--window", type=positive_int, help="score with a sliding window of this length instead (no memory)"
    )
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    ev.set_defaults(func=_eval)
    return ev


def add_refresh_code_parser(sub, name: str, help_text: str):
    refresh = sub.add_parser(name, help=help_text)
    refresh.add_argument("folder", help="the saved model folder (its config.json names the variant)")
    refresh.set_defaults(func=_refresh_code)
    return refresh


def add_push_parser(sub, name: str, help_text: str):
    push = sub.add_parser(name, help=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    push.add_argument("--model", required=True, help="saved model folder (with its tokenizer)")
    push.add_argument("--repo-id", required=True, help="Hub repo, e.g. user/transfo-xl-char")
    push.add_argument("--dataset", help="dataset name for the model card's metadata")
    push.add_argument("--card", help="a model_cards/*.md to use as the card's body")
    push.add_argument("--private", action="store_true", help="create the repo as private")
    push.add_argument("--token", help="Hub token (default: the one saved by `hf auth login` or HF_TOKEN)")
    push.add_argument("--revision", help="branch to push to (default: main)")
    push.add_argument("--commit-message", default="Upload hf-txvariants model", help="commit message")
    push.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    push.set_defaults(func=_push)
    return push


def build_parser():
    """Every subcommand of the table `hf_txvariants_commands.COMMANDS`, with all its flags."""
    parser = TxvParser(prog="txv", description=DESCRIPTION)
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_hf_parser_class())
    for name, (help_text, where) in COMMANDS.items():
        module_name, function_name = where.split(":")
        getattr(importlib.import_module(module_name), function_name)(sub, name, help_text)
    return parser


def given_train_fields(argv: list[str]) -> set[str]:
    """The TrainArgs fields that `argv` (a `txv train` command line) sets explicitly: it is parsed again by a parser
    whose defaults are all suppressed, so only what was given lands in the namespace."""
    import dataclasses

    from ..training.arguments import TrainArgs

    parser = build_parser()
    train = next(action for action in parser._subparsers._group_actions).choices["train"]
    for action in train._actions:
        action.default = argparse.SUPPRESS
    train.set_defaults(**{})
    given = vars(parser.parse_args(argv))
    return {f.name for f in dataclasses.fields(TrainArgs)} & set(given)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]

    def command():
        args = build_parser().parse_args(argv)
        if getattr(args, "command", None) == "train":
            args.given_flags = given_train_fields(argv)
        return args.func(args)

    return run_guarded(command, "txv: error: ", debug)


__all__ = ["build_parser", "given_train_fields", "main", "positive_int", "non_negative_int"]
