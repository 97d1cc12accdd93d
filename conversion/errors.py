"""The converters' error type, in a module of its own so that every converter module can import it without importing
another converter module (no import cycle)."""

from __future__ import annotations


class ConversionError(ValueError):
    """A checkpoint that cannot be converted; the message names the offending tensor or field."""
