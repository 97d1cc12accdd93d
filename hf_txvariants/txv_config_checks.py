"""Field checks shared by the configs' `validate_architecture`: each error names the field."""

from __future__ import annotations


def check_positive(config, *names: str):
    """Each named field must be a positive integer."""
    for name in names:
        value = getattr(config, name)
        if value is None or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}")


def check_probabilities(config, *names: str):
    """Each named field (a dropout rate) must be in [0, 1); None is allowed where a field is optional."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
