"""The `txv` console script. It answers `txv`, `txv --help`, `txv --version` and an unknown command at once, without
importing torch, transformers or the models (`import hf_txvariants` registers every variant, which takes seconds);
a command runs through `hf_txvariants.cli.main`, which imports what that command needs.

A top-level module on purpose: any module inside the `hf_txvariants` package runs the package's `__init__` first.

COMMANDS is the one table of subcommands: name -> (one-line help, "module:function" that adds the subcommand's parser).
The function is called as `function(subparsers, name, help)` by `hf_txvariants.cli.build_parser`, adds the parser
with `subparsers.add_parser(name, help=help, ...)` and sets its `func`; a new subcommand is one line here."""

from __future__ import annotations

import argparse
import sys

COMMANDS = {
    "demo": ("Transformer-XL vs a same-size baseline without memory, on CPU", "hf_txvariants.cli.demo:add_parser"),
    "train": (
        "train a causal LM with Accelerate (works under `accelerate launch`) or Trainer (--trainer)",
        "hf_txvariants.cli:add_train_parser",
    ),
    "eval": ("bits per token / perplexity of a saved model on a text", "hf_txvariants.cli:add_eval_parser"),
    "refresh-code": (
        "replace the model code a saved model folder carries with this plugin's (weights untouched), "
        "e.g. a folder saved before transformers 5.24 support",
        "hf_txvariants.cli:add_refresh_code_parser",
    ),
    "push": ("upload a saved model with its code and model card to the Hub", "hf_txvariants.cli:add_push_parser"),
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


class OneLineErrorParser(argparse.ArgumentParser):
    """A bad command line is one line `txv: error: ...` and exit status 2, like every other `txv` error."""

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _top_level_parser() -> argparse.ArgumentParser:
    """The commands and their help only: each command's own flags are left to `hf_txvariants.cli`."""
    parser = OneLineErrorParser(prog="txv", description=DESCRIPTION)
    add_version_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (help_text, _) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, add_help=False)
        command.add_argument("arguments", nargs=argparse.REMAINDER)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plain = [a for a in argv if a != "--debug"]
    if plain and plain[0] in COMMANDS:
        from hf_txvariants.cli import main as run_command

        return run_command(argv)
    # no command, --help, --version or an unknown command: answered here (argparse exits: 0 for help and version,
    # 2 with a one-line `txv: error:` for a bad command line)
    _top_level_parser().parse_args(plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
