"""The dtype the variants compute softmaxes, losses, masks and position tables in: float32 for half-precision
activations (bf16 / fp16, autocast), which lose too much there, and the activations' own dtype when it is wider
(float64: a run compared step for step with a reference, in float64 on both sides, must not round to float32
anywhere)."""

from __future__ import annotations

import torch


def at_least_float32(dtype: torch.dtype) -> torch.dtype:
    """float32, or `dtype` when it is a wider float (float64)."""
    return torch.promote_types(dtype, torch.float32)


__all__ = ["at_least_float32"]
