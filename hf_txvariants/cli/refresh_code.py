"""`txv refresh-code`: the model code a saved model folder carries (its remote-code payload) replaced with this
plugin's, the weights untouched."""

from __future__ import annotations

from .errors import UsageError


def add_parser(sub, name: str, help_text: str):
    """`txv refresh-code` (see hf_txvariants_commands.COMMANDS)."""
    refresh = sub.add_parser(name, help=help_text)
    refresh.add_argument("folder", help="the saved model folder (its config.json names the variant)")
    refresh.set_defaults(func=run)
    return refresh


def run(args):
    from ..hub import refresh_code

    try:
        written = refresh_code(args.folder)
    except (OSError, ValueError) as error:
        raise UsageError(str(error)) from None
    print(f"{args.folder}: model code refreshed ({', '.join(written)}); weights untouched")
