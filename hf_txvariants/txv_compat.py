"""Every difference between the supported transformers releases, in one place (DESIGN: a model file never tests a
version itself).

transformers 5.24 renamed the cache from `past_key_values` (and `cache_params`) to `cache`: the forward keyword,
the `ModelOutput` field and what `generate()` passes to `prepare_inputs_for_generation` and `forward`. Our models
take the cache as `cache` on every release and, through `accepts_cache_names`, under the older names as well; their
outputs carry it under the installed release's own field name (`CACHE_NAME`), as transformers' own outputs do.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
import warnings

import transformers
from transformers.modeling_layers import GradientCheckpointingLayer as _TransformersCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils import is_torchdynamo_compiling

# The releases CI tests (`.ci/run`): keep in step with pyproject.toml and the README.
OLDEST_SUPPORTED_TRANSFORMERS = "5.23.0"
FIRST_UNSUPPORTED_TRANSFORMERS = "5.25.0"

# Every name a cache may arrive under, the current one first.
CACHE_NAMES = ("cache", "past_key_values", "cache_params")
# Output keys that are a cache, not a prediction (`config.keys_to_ignore_at_inference`, for Trainer.predict, and
# `_skip_keys_device_placement`).
CACHE_OUTPUT_KEYS = list(CACHE_NAMES[:2])


def _release_cache_name() -> str:
    """The name under which the installed transformers passes the cache to `forward` /
    `prepare_inputs_for_generation` and reads it from outputs, read from a public fact of the release: the field of
    its public `BaseModelOutputWithPast` (`past_key_values` before 5.24, `cache` from 5.24 on)."""
    fields = [field.name for field in dataclasses.fields(BaseModelOutputWithPast)]
    names = [name for name in CACHE_NAMES if name in fields]
    if len(names) != 1:
        raise ImportError(
            f"transformers {transformers.__version__}: BaseModelOutputWithPast has fields {fields}, not exactly one "
            f"of the cache names {list(CACHE_NAMES)}; hf_txvariants cannot tell which cache name this release uses"
        )
    return names[0]


CACHE_NAME = _release_cache_name()


def _release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as "5.24.0" or "5.25.0.dev0"."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise ValueError(f"not a transformers version: {version!r}")
    return tuple(int(part or 0) for part in match.groups())


def check_transformers_version(version: str | None = None) -> bool:
    """Warns once (a `UserWarning` naming the supported range) when the installed transformers is outside the
    releases this plugin is tested on; returns whether it is inside."""
    version = version or transformers.__version__
    inside = _release(OLDEST_SUPPORTED_TRANSFORMERS) <= _release(version) < _release(FIRST_UNSUPPORTED_TRANSFORMERS)
    if not inside:
        warnings.warn(
            f"hf_txvariants is tested with transformers >={OLDEST_SUPPORTED_TRANSFORMERS},"
            f"<{FIRST_UNSUPPORTED_TRANSFORMERS}; transformers {version} is installed, so models may fail or differ",
            UserWarning,
            stacklevel=3,
        )
    return inside


def pop_cache(kwargs: dict, default=None):
    """The cache given in `kwargs` under any of `CACHE_NAMES` (removed from `kwargs`), or `default`. Two different
    caches under two names are a `ValueError` naming both; a name given as None counts as absent."""
    given = {name: kwargs.pop(name) for name in CACHE_NAMES if name in kwargs}
    present = {name: value for name, value in given.items() if value is not None}
    if len({id(value) for value in present.values()}) > 1:
        raise ValueError(f"the cache was given twice, as {' and '.join(present)}: pass it once, as `cache`")
    return next(iter(present.values()), default)


# Modules whose frames only pass a call on (module calls, transformers' output decorators, this module's wrapper).
_FORWARDING_MODULES = ("torch.nn.modules.module", "transformers.utils.generic", __name__)


def _caller_stacklevel() -> int:
    """The `stacklevel` that attributes a warning raised by the caller of this function to the code that made the
    call, past the frames that only forward it (`nn.Module.__call__`, `@can_return_tuple`, ...): pyproject's
    filterwarnings then tells a deprecated name passed by plugin code (an error in the tests) from one passed by a
    user or a test."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_globals.get("__name__") in _FORWARDING_MODULES:
        frame, level = frame.f_back, level + 1
    return level


def accepts_cache_names(function):
    """For a `forward` or `prepare_inputs_for_generation` written with a `cache` parameter: the cache is accepted
    under every name a supported release (or a user of an older one) passes it, so it can never be swallowed by
    `**kwargs` and lost. The reported signature names the parameter as the installed release does (`CACHE_NAME`)."""
    signature = inspect.signature(function)
    if "cache" not in signature.parameters:
        raise TypeError(f"{function.__qualname__} has no `cache` parameter")

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        old_names = [name for name in CACHE_NAMES[1:] if name in kwargs]
        if old_names:
            # Every name ends here as the one keyword `cache`: past this line no code path knows which was given.
            kwargs["cache"] = pop_cache(kwargs)
            if CACHE_NAME == "cache" and not is_torchdynamo_compiling():  # as transformers' models do from 5.24
                warnings.warn(
                    f"`{old_names[0]}` is deprecated for `{function.__qualname__}`. Use `cache` instead.",
                    FutureWarning,
                    stacklevel=_caller_stacklevel(),
                )
        return function(*args, **kwargs)

    parameters = [p.replace(name=CACHE_NAME) if p.name == "cache" else p for p in signature.parameters.values()]
    wrapper.__signature__ = signature.replace(parameters=parameters)
    return wrapper


def model_output(cls):
    """`@dataclass` for a `ModelOutput` whose cache field is declared as `cache`: before transformers 5.24 the field
    is named `past_key_values` (what those releases' `generate()` reads) and `.cache` reads it, from 5.24 on it is
    `cache` (and transformers' own alias reads `.past_key_values`). So `output.cache` works on every release."""
    annotations = cls.__dict__.get("__annotations__", {})
    if CACHE_NAME != "cache" and "cache" in annotations:
        cls.__annotations__ = {(CACHE_NAME if name == "cache" else name): kind for name, kind in annotations.items()}
        setattr(cls, CACHE_NAME, cls.__dict__.get("cache"))
        delattr(cls, "cache")
        cls = dataclasses.dataclass(cls)
        cls.cache = property(lambda self: getattr(self, CACHE_NAME), doc="The cache (the release's field name).")
        return cls
    return dataclasses.dataclass(cls)


class GradientCheckpointingLayer(_TransformersCheckpointingLayer):
    """transformers' `GradientCheckpointingLayer`, which drops the cache a checkpointed layer is given (the backward
    replay would write its keys/values a second time). Before 5.24 it looked for the cache only under the name
    `past_key_values`; our layers take it as `cache`, so here it is dropped under that name on those releases too."""

    def __call__(self, *args, **kwargs):
        if (
            CACHE_NAME != "cache"
            and self.gradient_checkpointing
            and self.training
            and not self._can_checkpoint_with_cache
            and kwargs.get("cache") is not None
        ):
            kwargs["cache"] = None
        return super().__call__(*args, **kwargs)


def cache_field(cache) -> dict:
    """The keyword that puts `cache` into a transformers `ModelOutput` (ours or theirs) on the installed release."""
    return {CACHE_NAME: cache}


def output_cache(output):
    """The cache a model output carries (None if it has none), on any supported release and without the deprecation
    warning that reading the old name gives from 5.24 on."""
    if isinstance(output, dict):
        return output.get(CACHE_NAME)
    return getattr(output, CACHE_NAME, None)
