"""Position-wise feed-forward network (Vaswani et al. 2017, eq. 2): Linear, ReLU, dropout, Linear, dropout.

The submodule is called `CoreNet` (a Sequential, indices 0 and 3 hold the weights) as in the original
Transformer-XL code, so that its checkpoints load unchanged."""

from __future__ import annotations

from torch import nn

from .txv_dropout import Dropout


class PositionwiseFeedForward(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float):
        super().__init__()
        self.CoreNet = nn.Sequential(
            nn.Linear(hidden_size, intermediate_size),
            nn.ReLU(),
            Dropout(dropout),
            nn.Linear(intermediate_size, hidden_size),
            Dropout(dropout),
        )

    def forward(self, hidden_states):
        return self.CoreNet(hidden_states)
