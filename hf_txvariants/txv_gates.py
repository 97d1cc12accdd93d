"""Gating layers of the Gated Transformer-XL (Parisotto et al. 2019, "Stabilizing Transformers for Reinforcement
Learning", section 3.2), shared so that any variant can put a gate where it had a residual connection.

Every gate combines `x`, the stream entering the sub-module (the skip path), with `y`, the sub-module's output
(GTrXL passes ReLU(y)), and returns a tensor of the same shape. W and U are bias-free `[hidden, hidden]` matrices;
`b_g` (`gate_bias`) is a learned vector initialised to the config's `gate_bias` (the paper's b_g, default 2). In a
model, `_init_weights` draws W and U Xavier-normal (`txv_xl.init_mechanism_weights`, issue 30):

    residual      g(x, y) = x + y                                             (TrXL-I: identity map reordering)
    input         g(x, y) = sigma(W_g x) * x + y
    output        g(x, y) = x + sigma(W_g x - b_g) * y
    highway       g(x, y) = sigma(W_g x + b_g) * x + (1 - sigma(W_g x + b_g)) * y
    sigmoid_tanh  g(x, y) = x + sigma(W_g y - b_g) * tanh(U_g y)
    gru           r = sigma(W_r y + U_r x),  z = sigma(W_z y + U_z x - b_g),  h = tanh(W_g y + U_g (r * x))
                  g(x, y) = (1 - z) * x + z * h

With b_g > 0 the output, highway, sigmoid-tanh and GRU gates start close to the identity map g(x, y) ~ x.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class GatingLayer(nn.Module):
    """Base class: `forward(x, y)`; `initial_bias` is what `_init_weights` puts into `gate_bias` (if any).
    A subclass names its bias-free `[hidden, hidden]` matrices in `matrices` (created in that order)."""

    has_bias = False
    matrices: tuple[str, ...] = ()

    def __init__(self, hidden_size: int, gate_bias: float = 2.0):
        super().__init__()
        self.hidden_size = hidden_size
        self.initial_bias = float(gate_bias)
        if self.has_bias:
            self.gate_bias = nn.Parameter(torch.full((hidden_size,), self.initial_bias))
        for name in self.matrices:
            setattr(self, name, nn.Linear(hidden_size, hidden_size, bias=False))


class ResidualGate(GatingLayer):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class InputGate(GatingLayer):
    matrices = ("w_g",)

    def forward(self, x, y):
        return torch.sigmoid(self.w_g(x)) * x + y


class OutputGate(GatingLayer):
    has_bias = True

    matrices = ("w_g",)

    def forward(self, x, y):
        return x + torch.sigmoid(self.w_g(x) - self.gate_bias) * y


class HighwayGate(GatingLayer):
    has_bias = True

    matrices = ("w_g",)

    def forward(self, x, y):
        carry = torch.sigmoid(self.w_g(x) + self.gate_bias)
        return carry * x + (1 - carry) * y


class SigmoidTanhGate(GatingLayer):
    has_bias = True

    matrices = ("w_g", "u_g")

    def forward(self, x, y):
        return x + torch.sigmoid(self.w_g(y) - self.gate_bias) * torch.tanh(self.u_g(y))


class GRUGate(GatingLayer):
    has_bias = True

    matrices = ("w_r", "u_r", "w_z", "u_z", "w_g", "u_g")

    def forward(self, x, y):
        shape = x.shape
        out = self.fused(x.reshape(-1, shape[-1]), y.reshape(-1, shape[-1]), self.stacked_weights())
        return out.view(shape)

    def stacked_weights(self) -> tuple[torch.Tensor, ...]:
        """For `fused`, transposed for `torch.addmm`: `[W_r; W_z; W_g]^T`, the bias `[0; -b_g; 0]` of that product,
        `[U_r; U_z]^T` and `U_g^T`."""
        zeros = torch.zeros_like(self.gate_bias)
        return (
            torch.cat([self.w_r.weight, self.w_z.weight, self.w_g.weight]).t().contiguous(),
            torch.cat([zeros, -self.gate_bias, zeros]),
            torch.cat([self.u_r.weight, self.u_z.weight]).t().contiguous(),
            self.u_g.weight.t().contiguous(),
        )

    @staticmethod
    def fused(x: torch.Tensor, y: torch.Tensor, stacked: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The gate for `x`, `y` `[rows, hidden]` and weights `stacked_weights()` (made once per step when acting, see
        `txv_xl_step`): the six products as three, the bias inside the first, and four element-wise ops. The in-place
        activations are safe under autograd (each overwrites a product's output, which no backward reads)."""
        w_stack, bias, u_reset_update, u_g = stacked
        hidden = x.shape[-1]
        from_y = torch.addmm(bias, y, w_stack)  # [W_r y, W_z y - b_g, W_g y]
        reset_update = torch.addmm(from_y[:, : 2 * hidden], x, u_reset_update).sigmoid_()  # [r, z]
        reset, update = reset_update[:, :hidden], reset_update[:, hidden:]
        candidate = torch.addmm(from_y[:, 2 * hidden :], reset * x, u_g).tanh_()  # h
        if candidate.dtype != x.dtype:  # under autocast the products are in its dtype and x is not
            candidate, update = candidate.to(x.dtype), update.to(x.dtype)
        return torch.lerp(x, candidate, update)  # (1 - z) x + z h


GATES: dict[str, type[GatingLayer]] = {
    "residual": ResidualGate,
    "input": InputGate,
    "output": OutputGate,
    "highway": HighwayGate,
    "sigmoid_tanh": SigmoidTanhGate,
    "gru": GRUGate,
}


# The residual forms an XL-family config can ask for (`gate_type`): TrXL (plain residual, layer norm after it), TrXL-I
# (identity map reordering: layer norm on the sub-module input only, ReLU on its output, plain residual) and GTrXL
# with one of the gates above.
GATE_TYPES = ("trxl", "trxl_i", "input", "output", "highway", "sigmoid_tanh", "gru")


def check_gate_fields(config):
    """`gate_type` one of GATE_TYPES and `gate_bias` a finite number (config-time checks naming the field)."""
    if config.gate_type not in GATE_TYPES:
        raise ValueError(f"gate_type must be one of {list(GATE_TYPES)}, got {config.gate_type!r}")
    if (
        isinstance(config.gate_bias, bool)
        or not isinstance(config.gate_bias, (int, float))
        or not math.isfinite(config.gate_bias)
    ):
        raise ValueError(f"gate_bias must be a finite number, got {config.gate_bias!r}")


def build_gate(gate_type: str, hidden_size: int, gate_bias: float = 2.0) -> GatingLayer:
    if gate_type not in GATES:
        raise ValueError(f"gate_type must be one of {sorted(GATES)}, got {gate_type!r}")
    return GATES[gate_type](hidden_size, gate_bias)


__all__ = [
    "GATES",
    "GATE_TYPES",
    "check_gate_fields",
    "GRUGate",
    "GatingLayer",
    "HighwayGate",
    "InputGate",
    "OutputGate",
    "ResidualGate",
    "SigmoidTanhGate",
    "build_gate",
]
