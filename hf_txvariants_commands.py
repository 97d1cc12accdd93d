"""The table of `txv` subcommands and what `txv` says about itself (its description, `--version`). Read by the launcher
(`hf_txvariants_launcher`: `txv --help` without importing the package) and by `hf_txvariants.cli.build_parser` (every
subcommand with its flags); it imports neither. A top-level module on purpose: any module inside the `hf_txvariants`
package runs the package's `__init__` (torch, transformers, every model) first.

COMMANDS: name -> (one-line help, "module:function" that adds the subcommand's parser). The function is called as
`function(subparsers, name, help)` by `hf_txvariants.cli.build_parser`, adds the parser with
`subparsers.add_parser(name, help=help, ...)` and sets its `func`. Each command is one module of
`hf_txvariants/cli/` (its parser and its body); a new subcommand is that module and one line here."""

from __future__ import annotations

import argparse

COMMANDS = {
    "demo": ("Transformer-XL vs a same-size baseline without memory, on CPU", "hf_txvariants.cli.demo:add_parser"),
    "train": (
        "train a causal LM with Accelerate (works under `accelerate launch`) or Trainer (--trainer)",
        "hf_txvariants.cli.train:add_parser",
    ),
    "eval": ("bits per token / perplexity of a saved model on a text", "hf_txvariants.cli.eval:add_parser"),
    "refresh-code": (
        "replace the model code a saved model folder carries with this plugin's (weights untouched), "
        "e.g. a folder saved before transformers 5.24 support",
        "hf_txvariants.cli.refresh_code:add_parser",
    ),
    "push": ("upload a saved model with its code and model card to the Hub", "hf_txvariants.cli.push:add_parser"),
    "upgrade-legacy": (
        "rewrite a Transformer-XL folder saved by transformers 4.x without pickles (vocab.json, "
        "safetensors, remote code)",
        "hf_txvariants.cli.upgrade_legacy:add_parser",
    ),
    "convert": (
        "convert an original checkpoint (kimiyoung/transformer-xl, facebookresearch/adaptive-span), or "
        "evaluate a converted one; "
        "`txv convert NAME --help`",
        "hf_txvariants.cli.convert:add_parser",
    ),
    "serve": (
        "transformers' OpenAI-compatible server (`transformers serve`) for the plugin's causal LMs "
        "(needs the serve extra)",
        "hf_txvariants.cli.serve:add_parser",
    ),
}

DESCRIPTION = (
    "hf-txvariants: train, evaluate, share, convert, serve, demo. Add --debug anywhere to see a traceback on error."
)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("hf-txvariants")
    except PackageNotFoundError:  # a checkout that was not installed
        return "unknown (not installed)"


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"txv (hf-txvariants) {version()}")
