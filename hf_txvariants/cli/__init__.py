"""The `txv` command: `txv demo`, `txv train`, `txv eval`, `txv push`, `txv convert`, `txv refresh-code`,
`txv upgrade-legacy`, `txv serve`, one module each in this package (its `add_parser` and its body), listed in the table
`hf_txvariants_commands.COMMANDS`; this module builds the parser from that table and runs a command.

Every expected failure (a bad argument, a missing, corrupt or unsafe file, an offline Hub, a bad number) ends with one
line `txv: error: <what and where>` and exit status 2; `--debug` (anywhere on the line) shows the traceback instead."""

from __future__ import annotations

import argparse
import importlib
import sys

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


# argparse types of `txv eval` and of the converters (conversion/evaluate*.py)
positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


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


def build_parser():
    """Every subcommand of the table `hf_txvariants_commands.COMMANDS`, with all its flags."""
    parser = TxvParser(prog="txv", description=DESCRIPTION)
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_hf_parser_class())
    for name, (help_text, where) in COMMANDS.items():
        module_name, function_name = where.split(":")
        getattr(importlib.import_module(module_name), function_name)(sub, name, help_text)
    return parser


def main(argv=None) -> int:
    """Runs the command of `argv` (default: sys.argv) and returns its exit status. A command whose parser sets the
    default `read_given_flags` (`txv train`) gets `args.given_flags`: what that function reads from `argv`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]

    def command():
        args = build_parser().parse_args(argv)
        read_given_flags = getattr(args, "read_given_flags", None)
        if read_given_flags is not None:
            args.given_flags = read_given_flags(argv)
        return args.func(args)

    return run_guarded(command, "txv: error: ", debug)


__all__ = ["build_parser", "main", "non_negative_int", "positive_int"]
