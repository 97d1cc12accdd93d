"""`txv convert NAME ...`: the converters of the repository's conversion/ folder, as installed in the wheel.

The wheel installs conversion/ as `hf_txvariants.converters` (pyproject.toml maps the package to that folder), so
`txv convert` works from an installed package without a generic top-level `conversion` module in site-packages;
from a checkout, `python -m conversion.<name>` runs the very same files."""

from __future__ import annotations

import argparse
import importlib

# txv convert NAME -> module of conversion/ (installed as hf_txvariants.converters)
CONVERTERS = {
    "kimiyoung-tf": "kimiyoung_tf",
    "kimiyoung-pytorch": "kimiyoung_pytorch",
    "evaluate": "evaluate",
    "adaptive-span": "adaptive_span",
    "evaluate-adaptive-span": "evaluate_adaptive_span",
}


def run(name: str, argv: list[str]) -> int:
    module = importlib.import_module(f"hf_txvariants.converters.{CONVERTERS[name]}")
    return module.main(list(argv), prog=f"txv convert {name}")


def add_parser(sub, name: str, help_text: str):
    """`txv convert NAME ...` (see hf_txvariants_commands.COMMANDS)."""
    convert = sub.add_parser(name, help=help_text, add_help=True)
    convert.add_argument("converter", choices=sorted(CONVERTERS), help="which converter")
    convert.add_argument("converter_args", nargs=argparse.REMAINDER, help="the converter's own flags")
    # the converter prints its own `error:` line
    convert.set_defaults(func=lambda args: run(args.converter, args.converter_args))
    return convert
