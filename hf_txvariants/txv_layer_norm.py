"""The layer norm of the Annotated Transformer (Rush 2018), used by code built on it (e.g. the R-Transformer):

    y = weight * (x - mean(x)) / (std(x) + eps) + bias

with the *unbiased* standard deviation and eps added to the std (not inside the square root). It differs from
`nn.LayerNorm` (biased variance, eps inside the root) by far more than rounding for small widths, so checkpoints
trained with it need it. Parameters are called `weight` and `bias` like `nn.LayerNorm`'s."""

from __future__ import annotations

import torch
from torch import nn


class AnnotatedLayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mean = hidden_states.mean(-1, keepdim=True)
        std = hidden_states.std(-1, keepdim=True)
        return self.weight * (hidden_states - mean) / (std + self.eps) + self.bias


def make_layer_norm(layer_norm_type: str, hidden_size: int, eps: float) -> nn.Module:
    """ "standard" -> nn.LayerNorm, "annotated" -> AnnotatedLayerNorm."""
    if layer_norm_type == "standard":
        return nn.LayerNorm(hidden_size, eps=eps)
    if layer_norm_type == "annotated":
        return AnnotatedLayerNorm(hidden_size, eps=eps)
    raise ValueError(f"layer_norm_type must be 'standard' or 'annotated', got {layer_norm_type!r}")
