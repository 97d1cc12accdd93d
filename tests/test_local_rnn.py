"""txv_local_rnn: the vectorised LocalRNN equals the naive loop over positions of the paper's definition."""

from __future__ import annotations

import pytest
import torch

from hf_txvariants.txv_layer_norm import AnnotatedLayerNorm, make_layer_norm
from hf_txvariants.txv_local_rnn import LocalRNN, local_windows, next_prefix


def naive_local_rnn(module: LocalRNN, x: torch.Tensor) -> torch.Tensor:
    """h_t = last hidden state of the RNN run over x_{t-k+1} .. x_t, positions before 0 being zero vectors."""
    batch, length, width = x.shape
    k = module.window
    outputs = []
    for t in range(length):
        steps = [x[:, s] if s >= 0 else torch.zeros(batch, width) for s in range(t - k + 1, t + 1)]
        state = None
        for step in steps:  # one RNN step at a time, carrying the state by hand
            out, state = module.rnn(step[:, None], state)
        outputs.append(out[:, 0])
    return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("rnn_type", ["GRU", "LSTM", "RNN"])
@pytest.mark.parametrize("window", [1, 3, 12])
def test_vectorised_equals_naive_loop(rnn_type, window):
    torch.manual_seed(0)
    module = LocalRNN(6, rnn_type, window)
    x = torch.randn(2, 9, 6)
    torch.testing.assert_close(module(x), naive_local_rnn(module, x), atol=1e-6, rtol=0)


@pytest.mark.exact
def test_windows_are_left_zero_padded():
    x = torch.arange(1.0, 6.0)[None, :, None]  # [1, 5, 1]: tokens 1..5
    windows = local_windows(x, 3)[0, :, :, 0]
    expected = torch.tensor([[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]], dtype=torch.float)
    assert torch.equal(windows, expected)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="rnn_type"):
        LocalRNN(4, "TCN", 3)
    with pytest.raises(ValueError, match="window"):
        LocalRNN(4, "GRU", 0)


def test_annotated_layer_norm_formula():
    """y = w * (x - mean) / (unbiased std + eps) + b, computed here element by element."""
    norm = AnnotatedLayerNorm(4, eps=0.1)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
        norm.bias.copy_(torch.tensor([0.0, 1.0, 0.0, -1.0]))
    x = torch.tensor([[1.0, 2.0, 4.0, 7.0]])
    mean = (1 + 2 + 4 + 7) / 4
    std = (sum((v - mean) ** 2 for v in [1, 2, 4, 7]) / 3) ** 0.5
    expected = torch.tensor(
        [[w * (v - mean) / (std + 0.1) + b for v, w, b in zip([1, 2, 4, 7], [1, 2, -1, 0.5], [0, 1, 0, -1])]]
    )
    torch.testing.assert_close(norm(x), expected)
    assert isinstance(make_layer_norm("standard", 4, 1e-5), torch.nn.LayerNorm)
    with pytest.raises(ValueError, match="layer_norm_type"):
        make_layer_norm("rms", 4, 1e-5)


@pytest.mark.parametrize("window", [1, 4])
def test_chunks_with_prefix_equal_one_pass(window):
    """Running chunk by chunk, each with the previous `window - 1` inputs as prefix, equals one pass."""
    torch.manual_seed(0)
    module = LocalRNN(5, "GRU", window)
    x = torch.randn(2, 9, 5)
    prefix, outputs = None, []
    for chunk in (x[:, :2], x[:, 2:3], x[:, 3:]):
        outputs.append(module(chunk, prefix))
        prefix = next_prefix(prefix, chunk, window)
    torch.testing.assert_close(torch.cat(outputs, 1), module(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "training, grad_enabled, cudnn_disabled", [(True, True, False), (False, False, False), (False, True, True)]
)
def test_eval_mode_with_gradients_runs_the_rnn_without_cudnn(monkeypatch, training, grad_enabled, cudnn_disabled):
    """cuDNN's eval-mode RNN kernel has no backward ("cudnn RNN backward can only be called in training mode" on
    CUDA): the RNN must run with cuDNN off exactly when the module is in eval mode and gradients are enabled."""
    flag_calls = []
    original_flags = torch.backends.cudnn.flags

    def recording_flags(*args, **kwargs):
        flag_calls.append(kwargs)
        return original_flags(*args, **kwargs)

    monkeypatch.setattr(torch.backends.cudnn, "flags", recording_flags)
    module = LocalRNN(6, "GRU", 3).train(training)
    x = torch.randn(2, 5, 6, requires_grad=grad_enabled)
    with torch.set_grad_enabled(grad_enabled):
        output = module(x)
        if grad_enabled:
            output.sum().backward()
            assert x.grad is not None and torch.isfinite(x.grad).all()
    assert flag_calls == ([{"enabled": False}] if cudnn_disabled else [])
