"""Position encodings shared by the variants."""

from __future__ import annotations

import torch

from .txv_precision import at_least_float32


def sinusoid_table(positions: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Vaswani et al.'s sinusoids for (possibly fractional or relative) `positions`, laid out as
    `[sin(p * w_0) .. sin(p * w_{dim/2-1}) | cos(p * w_0) .. cos(p * w_{dim/2-1})]` with w_k = 10000^(-2k/dim)
    (the Transformer-XL layout). Computed on the fly (no buffer to initialise, move or lose precision): the
    frequencies in float32, as the originals' `inv_freq` buffers hold them, the angles and their sines in
    `at_least_float32(dtype)`."""
    compute_dtype = at_least_float32(dtype)
    inverse_frequencies = 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0, device=positions.device) / dim))
    angles = torch.outer(positions.to(compute_dtype), inverse_frequencies.to(compute_dtype))
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
