"""Config helpers shared by every variant's `__post_init__` and `validate_architecture`: each error names the field."""

from __future__ import annotations

import dataclasses
import math
import numbers
import sys
import types
import typing


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


def _matches(value, annotation) -> bool:
    """Whether `value` has the declared type: int (not bool), float (int or float, not NaN), bool, str, None,
    Literal, unions, list[X] / tuple[X, ...]; anything else (dict, Any, classes) is not checked."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        item = args[0] if args else typing.Any
        return all(_matches(v, item) for v in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
    if annotation is str:
        return isinstance(value, str)
    return True


def _own_field_types(config_class) -> dict:
    """Declared types of the fields a variant's config adds (not transformers' base fields)."""
    cached = config_class.__dict__.get("_txv_field_types")
    if cached is not None:
        return cached
    own = {}
    for klass in reversed(config_class.__mro__):
        # transformers' own classes, not a remote-code module (`transformers_modules.<repo>...`)
        if klass.__module__.split(".")[0] == "transformers" or klass is object:
            continue
        namespace = vars(sys.modules[klass.__module__]) if klass.__module__ in sys.modules else {}
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if isinstance(annotation, str):  # `from __future__ import annotations`
                try:
                    annotation = eval(annotation, dict(namespace))  # noqa: S307 - the class's own annotation text
                except Exception:  # an annotation this check cannot resolve is not checked
                    continue
            if not name.startswith("_") and typing.get_origin(annotation) is not typing.ClassVar:
                own[name] = annotation
    config_class._txv_field_types = own
    return own


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def check_field_types(config):
    """Every field the variant declares holds a value of its declared type (`n_layer="2"`, `mem_len="8"`,
    `same_length="yes"`, `layer_norm_eps=nan` are refused, naming the field)."""
    for name, annotation in _own_field_types(type(config)).items():
        if not hasattr(config, name):
            continue
        value = getattr(config, name)
        if not _matches(value, annotation):
            raise ValueError(f"{name} must be of type {_type_name(annotation)}, got {value!r} ({type(value).__name__})")


def check_positive(config, *names: str):
    """Each named field must be a positive integer (a bool or a string is refused, naming the field). Every call
    first checks the types of all the config's declared fields (`check_field_types`): the configs call this at the
    start of their validation, so a wrongly typed field is named before any comparison could fail on it."""
    check_field_types(config)
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


def check_non_negative(config, *names: str):
    """Each named field (a count, a length or a loss weight) must be >= 0."""
    for name in names:
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)}")


def check_choice(config, name: str, choices: tuple):
    """The field `name` must be one of `choices`."""
    if getattr(config, name) not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {getattr(config, name)!r}")


def check_even(config, name: str, reason: str):
    """The field `name` must be even (`reason` says which part needs it)."""
    if getattr(config, name) % 2:
        raise ValueError(f"{name} must be even ({reason}), got {getattr(config, name)}")


def check_left_at_default(config, names, reason: str):
    """Each named field must keep its declared default, because the config does not use it (`reason`): a value set
    there would be accepted and silently ignored. Saved configs hold the defaults, so they still load."""
    defaults = {field.name: field.default for field in dataclasses.fields(config)}
    for name in names:
        value = getattr(config, name)
        if value != defaults[name]:
            raise ValueError(
                f"{name}={value!r} would be ignored: {reason}; leave {name} at its default ({defaults[name]!r})"
            )


def read_act_epsilon(config, kwargs: dict):
    """The papers' epsilon (`act_epsilon`, halting when the cumulated probability reaches 1 - epsilon) is stored as
    `act_threshold` = 1 - epsilon."""
    if "act_epsilon" in kwargs:
        config.act_threshold = 1.0 - float(kwargs.pop("act_epsilon"))


def check_act_fields(config):
    """`act_threshold` (1 - epsilon) in (0, 1] and the ponder-cost weight `act_loss_weight` >= 0."""
    if not 0.0 < config.act_threshold <= 1.0:
        raise ValueError(f"act_threshold (1 - act_epsilon) must be in (0, 1], got {config.act_threshold}")
    check_non_negative(config, "act_loss_weight")


def integer_list(config, name: str) -> list[int] | None:
    """The list field `name` as a list of ints (JSON may give floats such as 8.0); anything else is a ValueError
    naming the field. None stays None."""
    value = getattr(config, name)
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a list of integers, got {value!r}")
    items = list(value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Real) or int(item) != item:
            raise ValueError(f"{name} must be a list of integers, got {value!r}")
    return [int(item) for item in items]
