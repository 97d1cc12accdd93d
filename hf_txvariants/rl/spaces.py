"""The gymnasium spaces a `MemoryPolicy` supports, written to and read from plain JSON (no pickle, ever).

    space_to_dict(gym.spaces.Box(-1.0, 1.0, shape=(2,)))
    # {"type": "Box", "shape": [2], "dtype": "float32", "low": [-1.0, -1.0], "high": [1.0, 1.0]}

Supported: `Discrete` (n, start), `MultiDiscrete` (nvec, start, dtype) and `Box` (shape, dtype, low and high
flattened; infinite bounds are written as the strings "inf" / "-inf", which JSON has no number for). Anything else
is a `ValueError` naming the space and what would work; reading checks every field before building the space.
"""

from __future__ import annotations

import math

import numpy as np

SUPPORTED_SPACES = ("Discrete", "MultiDiscrete", "Box")
# dtypes a Box / MultiDiscrete may have in a saved policy (looked up by name from this list only)
NUMERIC_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf}


def _encode_numbers(array: np.ndarray) -> list:
    values = []
    for value in np.asarray(array).reshape(-1).tolist():
        if isinstance(value, float) and not math.isfinite(value):
            if math.isnan(value):
                raise ValueError("a Box bound is NaN, which no space can hold")
            value = "inf" if value > 0 else "-inf"
        values.append(value)
    return values


def _decode_numbers(values, shape, dtype, field: str) -> np.ndarray:
    if not isinstance(values, list):
        raise ValueError(f"space field {field!r} must be a list of numbers, got {type(values).__name__}")
    numbers = []
    for value in values:
        if isinstance(value, str):
            if value not in _NON_FINITE:
                raise ValueError(f"space field {field!r} holds {value!r}; only numbers, 'inf' and '-inf' are allowed")
            value = _NON_FINITE[value]
        elif not isinstance(value, (int, float)):
            raise ValueError(f"space field {field!r} holds {value!r} of type {type(value).__name__}, not a number")
        numbers.append(value)
    if len(numbers) != int(np.prod(shape)):
        raise ValueError(
            f"space field {field!r} holds {len(numbers)} values, expected {int(np.prod(shape))} for "
            f"shape {tuple(shape)}"
        )
    return np.array(numbers, dtype=np.float64 if np.dtype(dtype).kind == "f" else None).reshape(shape).astype(dtype)


def _dtype(name) -> np.dtype:
    if name not in NUMERIC_DTYPES:
        raise ValueError(f"space dtype {name!r} is not supported; known: {', '.join(NUMERIC_DTYPES)}")
    return np.dtype(name)


def space_to_dict(space) -> dict:
    """A JSON-ready description of `space` (see the module docstring)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _encode_numbers(space.low),
            "high": _encode_numbers(space.high),
        }
    raise ValueError(f"cannot save a {type(space).__name__} space ({space}); supported: {', '.join(SUPPORTED_SPACES)}")


def space_from_dict(data: dict):
    """The space `space_to_dict` described; a malformed description is a `ValueError` naming the field."""
    import gymnasium as gym

    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"a saved space must be a JSON object with a 'type', got {data!r}")

    def field(name, kind):
        if name not in data:
            raise ValueError(f"the saved {data['type']} space has no {name!r} field: {data}")
        if not isinstance(data[name], kind) or isinstance(data[name], bool):
            raise ValueError(f"the saved {data['type']} space's {name!r} must be {kind.__name__}, got {data[name]!r}")
        return data[name]

    kind = data["type"]
    if kind == "Discrete":
        return gym.spaces.Discrete(field("n", int), start=field("start", int))
    if kind == "MultiDiscrete":
        dtype = _dtype(field("dtype", str))
        nvec, start = field("nvec", list), field("start", list)
        shape = np.shape(nvec)
        return gym.spaces.MultiDiscrete(
            _decode_numbers(np.ravel(nvec).tolist(), shape, dtype, "nvec"),
            dtype=dtype,
            start=_decode_numbers(np.ravel(start).tolist(), shape, dtype, "start"),
        )
    if kind == "Box":
        dtype = _dtype(field("dtype", str))
        shape = tuple(field("shape", list))
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError(f"the saved Box space's 'shape' must hold non-negative integers, got {list(shape)}")
        low = _decode_numbers(field("low", list), shape, dtype, "low")
        high = _decode_numbers(field("high", list), shape, dtype, "high")
        return gym.spaces.Box(low, high, shape=shape, dtype=dtype)
    raise ValueError(f"cannot read a saved {kind!r} space; supported: {', '.join(SUPPORTED_SPACES)}")


__all__ = ["SUPPORTED_SPACES", "space_from_dict", "space_to_dict"]
