"""The GTrXL gating layers against examples computed by hand from the equations of Parisotto et al. 2019 (section 3.2),
element by element in plain Python, and the identity-at-init property of the gate bias b_g."""

import math

import pytest
import torch

from hf_txvariants.txv_gates import (
    GATES,
    GRUGate,
    HighwayGate,
    InputGate,
    OutputGate,
    ResidualGate,
    SigmoidTanhGate,
    build_gate,
)

X = [1.0, -2.0]  # the stream entering the sub-module (skip path)
Y = [0.5, 3.0]  # the sub-module's output
B_G = [2.0, 1.0]  # the gate bias, per unit
W = [[0.5, -1.0], [2.0, 0.25]]
U = [[-0.5, 1.5], [1.0, -2.0]]
W2 = [[1.0, 0.5], [-0.25, 0.75]]
U2 = [[0.3, -0.2], [0.1, 0.4]]
W3 = [[-1.0, 0.2], [0.6, 0.5]]
U3 = [[0.2, 0.7], [-0.9, 0.1]]


def sigmoid(a):
    return 1.0 / (1.0 + math.exp(-a))


def matvec(m, v):
    return [m[0][0] * v[0] + m[0][1] * v[1], m[1][0] * v[0] + m[1][1] * v[1]]


def load(linear, matrix):
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(matrix))


def apply(gate):
    with torch.no_grad():
        if gate.has_bias:
            gate.gate_bias.copy_(torch.tensor(B_G))
        return gate(torch.tensor([X]), torch.tensor([Y]))[0]


def assert_matches(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-6, rtol=0)


def test_residual():
    assert_matches(apply(ResidualGate(2)), [1.5, 1.0])


def test_input_gate():
    # g = sigma(W_g x) * x + y
    gate = InputGate(2)
    load(gate.w_g, W)
    wx = matvec(W, X)  # [2.5, 1.5]
    assert wx == [2.5, 1.5]
    expected = [sigmoid(wx[i]) * X[i] + Y[i] for i in range(2)]
    assert_matches(apply(gate), expected)
    assert_matches(apply(gate), [sigmoid(2.5) * 1.0 + 0.5, sigmoid(1.5) * -2.0 + 3.0])


def test_output_gate():
    # g = x + sigma(W_g x - b_g) * y
    gate = OutputGate(2)
    load(gate.w_g, W)
    assert_matches(apply(gate), [1.0 + sigmoid(2.5 - 2.0) * 0.5, -2.0 + sigmoid(1.5 - 1.0) * 3.0])


def test_highway_gate():
    # g = sigma(W_g x + b_g) * x + (1 - sigma(W_g x + b_g)) * y
    gate = HighwayGate(2)
    load(gate.w_g, W)
    c0, c1 = sigmoid(2.5 + 2.0), sigmoid(1.5 + 1.0)
    assert_matches(apply(gate), [c0 * 1.0 + (1 - c0) * 0.5, c1 * -2.0 + (1 - c1) * 3.0])


def test_sigmoid_tanh_gate():
    # g = x + sigma(W_g y - b_g) * tanh(U_g y)
    gate = SigmoidTanhGate(2)
    load(gate.w_g, W)
    load(gate.u_g, U)
    wy, uy = matvec(W, Y), matvec(U, Y)
    assert wy == [-2.75, 1.75] and uy == [4.25, -5.5]
    assert_matches(
        apply(gate), [1.0 + sigmoid(-2.75 - 2.0) * math.tanh(4.25), -2.0 + sigmoid(1.75 - 1.0) * math.tanh(-5.5)]
    )


def test_gru_gate():
    # r = sigma(W_r y + U_r x); z = sigma(W_z y + U_z x - b_g); h = tanh(W_g y + U_g (r * x)); g = (1 - z) x + z h
    gate = GRUGate(2)
    for linear, matrix in [
        (gate.w_r, W),
        (gate.u_r, U),
        (gate.w_z, W2),
        (gate.u_z, U2),
        (gate.w_g, W3),
        (gate.u_g, U3),
    ]:
        load(linear, matrix)
    r = [sigmoid(a + b) for a, b in zip(matvec(W, Y), matvec(U, X))]
    z = [sigmoid(a + b - bias) for a, b, bias in zip(matvec(W2, Y), matvec(U2, X), B_G)]
    reset_x = [r[i] * X[i] for i in range(2)]
    h = [math.tanh(a + b) for a, b in zip(matvec(W3, Y), matvec(U3, reset_x))]
    expected = [(1 - z[i]) * X[i] + z[i] * h[i] for i in range(2)]
    assert_matches(apply(gate), expected)


def test_gru_gate_is_not_symmetric_in_its_inputs():
    gate = GRUGate(2)
    x, y = torch.randn(3, 2), torch.randn(3, 2)
    assert not torch.allclose(gate(x, y), gate(y, x))


@pytest.mark.parametrize("gate_bias", [2.0, 10.0])
def test_gru_gate_starts_close_to_identity(gate_bias):
    """With b_g > 0 and small weights (N(0, 0.02); a model draws its gate matrices Xavier-normal, issue 30)
    z ~ sigma(-b_g): g(x, y) ~ x whatever y is."""
    torch.manual_seed(0)
    hidden = 32
    gate = GRUGate(hidden, gate_bias)
    for linear in (gate.w_r, gate.u_r, gate.w_z, gate.u_z, gate.w_g, gate.u_g):
        torch.nn.init.normal_(linear.weight, 0.0, 0.02)
    x, y = torch.randn(64, hidden), torch.randn(64, hidden)
    with torch.no_grad():
        update = torch.sigmoid(gate.w_z(y) + gate.u_z(x) - gate.gate_bias)
        output = gate(x, y)
    torch.testing.assert_close(update, torch.full_like(update, 1 / (1 + math.exp(gate_bias))), atol=0.1, rtol=0)
    # g - x = z * (h - x) with |h| <= 1
    bound = (1 / (1 + math.exp(gate_bias)) + 0.1) * (x.abs() + 1)
    assert ((output - x).abs() <= bound).all()
    if gate_bias >= 10:
        torch.testing.assert_close(output, x, atol=1e-3, rtol=0)


def test_gate_bias_zero_is_not_identity():
    torch.manual_seed(0)
    gate = GRUGate(32, 0.0)
    x, y = torch.randn(64, 32), torch.randn(64, 32) * 5
    with torch.no_grad():
        assert (gate(x, y) - x).abs().mean() > 0.3


def test_build_gate_names_and_errors():
    for name, gate_class in GATES.items():
        assert type(build_gate(name, 4)) is gate_class
    with pytest.raises(ValueError, match="gate_type"):
        build_gate("lstm", 4)
