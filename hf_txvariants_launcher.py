"""The `txv` console script. It answers `txv`, `txv --help`, `txv --version` and an unknown command at once, without
importing torch, transformers or the models (`import hf_txvariants` registers every variant, which takes seconds);
a command runs through `hf_txvariants.cli.main`, which imports what that command needs. The subcommands are the table
`hf_txvariants_commands.COMMANDS`.

A top-level module on purpose: any module inside the `hf_txvariants` package runs the package's `__init__` first."""

from __future__ import annotations

import argparse
import sys

from hf_txvariants_commands import COMMANDS, DESCRIPTION, add_version_argument


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
