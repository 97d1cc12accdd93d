"""Config helpers shared by every variant's `__post_init__` and `validate_architecture`: each error names the field."""

from __future__ import annotations

import numbers


def apply_paper_names(config, kwargs: dict) -> dict:
    """Moves the papers' names (`d_model`, `n_head`, ... from `config.attribute_map`) out of `kwargs` onto the
    standard fields, before the derived defaults that read them. Returns the remaining kwargs."""
    for alias in [name for name in kwargs if name in config.attribute_map]:
        setattr(config, alias, kwargs.pop(alias))
    return kwargs


def default_head_dim(config):
    """`head_dim = hidden_size // num_attention_heads` when not given; the division must be exact."""
    check_positive(config, "hidden_size", "num_attention_heads")
    if config.head_dim is None:
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({config.hidden_size}) is not divisible by num_attention_heads "
                f"({config.num_attention_heads}); set head_dim (d_head) explicitly"
            )
        config.head_dim = config.hidden_size // config.num_attention_heads


def check_positive(config, *names: str):
    """Each named field must be a positive integer (a bool or a string is refused, naming the field)."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_probabilities(config, *names: str):
    """Each named field (a dropout rate) must be a number in [0, 1); None is allowed where a field is optional."""
    for name in names:
        value = getattr(config, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
