"""Position encodings shared by the variants."""

from __future__ import annotations

import torch


def sinusoid_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al.'s sinusoids for (possibly fractional or relative) `positions`, laid out as
    `[sin(p * w_0) .. sin(p * w_{dim/2-1}) | cos(p * w_0) .. cos(p * w_{dim/2-1})]` with w_k = 10000^(-2k/dim)
    (the Transformer-XL layout). Computed in float32 on the fly: no buffer to initialise, move or lose precision."""
    inverse_frequencies = 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0, device=positions.device) / dim))
    angles = torch.outer(positions.to(torch.float32), inverse_frequencies)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
