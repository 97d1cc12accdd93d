"""The one error boundary of `txv` and the converters: an expected failure is one line on stderr and exit status 2.

Expected failures are the exceptions that bad input raises: a ValueError (the plugin's own errors, `DataError`,
`ModelError`, `ConversionError`, a config field, a Hub repo id), an OSError (a missing, unreadable or read-only file,
an offline or unreachable Hub), an unpickling error (a file refused by a weights-only or restricted loader) and
safetensors' error for a torn file. Anything else is a bug and keeps its traceback."""

from __future__ import annotations

import pickle
import sys


class UsageError(Exception):
    """A bad command line (argparse's errors are raised as this, so they print as one line too)."""


def _expected_errors() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError

    return (UsageError, ValueError, OSError, EOFError, pickle.UnpicklingError, SafetensorError)


def one_line(error: BaseException) -> str:
    """The first non-empty line of an error's message (library messages often add hints on later lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def run_guarded(command, prefix: str, debug: bool = False) -> int:
    """Runs `command()`; returns its exit status (0 unless it returns an int), or prints `<prefix><message>` and
    returns 2 on an expected failure (re-raised with its traceback when `debug`). SystemExit (--help, --version) passes
    through; Ctrl-C exits with 130."""
    try:
        result = command()
    except _expected_errors() as error:
        if debug:
            raise
        print(f"{prefix}{one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prefix}interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0
