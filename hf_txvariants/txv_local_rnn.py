"""LocalRNN (Wang et al. 2019, "R-Transformer: Recurrent Neural Network Enhanced Transformer").

Each position t is summarised by an RNN (GRU, LSTM or plain tanh RNN) run over the local window
x_{t-k+1} .. x_t (zeros left of the sequence start); the output at t is the RNN's last hidden state:
    h_t = RNN(x_{t-k+1}, ..., x_t)
Vectorised over windows: the input is left-padded with k - 1 zeros, every window is cut out at once with `unfold`
(`[batch * length, k, d]`, a view-based copy, no loop over positions) and all windows go through the RNN as one
batch, so the only sequential loop is the RNN's own over the k steps of a window.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

RNN_TYPES = {"GRU": nn.GRU, "LSTM": nn.LSTM, "RNN": nn.RNN}


def local_windows(hidden_states: torch.Tensor, window: int, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """`[batch, length, d]` -> `[batch, length, window, d]`: window t holds x_{t-window+1} .. x_t, left-padded with
    zeros, or with `prefix` (`[batch, window - 1, d]`, the inputs before this chunk) when continuing a sequence."""
    if prefix is None:
        padded = nn.functional.pad(hidden_states, (0, 0, window - 1, 0))
    else:
        padded = torch.cat([prefix.to(hidden_states.dtype), hidden_states], dim=1)
    return padded.unfold(1, window, 1).transpose(-1, -2)


def next_prefix(prefix: torch.Tensor | None, hidden_states: torch.Tensor, window: int) -> torch.Tensor:
    """The last `window - 1` inputs after `hidden_states` (what the next chunk's first windows need)."""
    if prefix is None:
        prefix = hidden_states.new_zeros(hidden_states.shape[0], window - 1, hidden_states.shape[-1])
    joined = torch.cat([prefix.to(hidden_states.dtype), hidden_states], dim=1)
    return joined[:, joined.shape[1] - (window - 1) :]


class LocalRNN(nn.Module):
    """`rnn`: a one-layer `nn.GRU` / `nn.LSTM` / `nn.RNN` (batch_first) of width `hidden_size`."""

    def __init__(self, hidden_size: int, rnn_type: str, window: int):
        super().__init__()
        if rnn_type not in RNN_TYPES:
            raise ValueError(f"rnn_type must be one of {sorted(RNN_TYPES)}, got {rnn_type!r}")
        if window < 1:
            raise ValueError(f"local window must be >= 1, got {window}")
        self.window = window
        self.rnn = RNN_TYPES[rnn_type](hidden_size, hidden_size, batch_first=True)

    def forward(self, hidden_states: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
        """`prefix`: the `window - 1` inputs before `hidden_states` (cached generation); None = sequence start."""
        batch, length, width = hidden_states.shape
        windows = local_windows(hidden_states, self.window, prefix).reshape(batch * length, self.window, width)
        with self._rnn_kernel_context():
            outputs = self.rnn(windows)[0]
        return outputs[:, -1].view(batch, length, width)

    def _rnn_kernel_context(self):
        """cuDNN runs an RNN in eval mode with its inference kernel, which has no backward ("cudnn RNN backward can
        only be called in training mode"): an eval-mode forward that needs gradients (attribution, RL, evaluation
        with a gradient penalty) runs the native kernel instead. Same maths; a no-op on CPU."""
        if cudnn_rnn_lacks_backward(self.rnn.training, torch.is_grad_enabled()) and not torch.compiler.is_compiling():
            return torch.backends.cudnn.flags(enabled=False)
        return contextlib.nullcontext()


def cudnn_rnn_lacks_backward(training: bool, grad_enabled: bool) -> bool:
    """True when cuDNN's RNN kernel would run without a backward although gradients may be needed."""
    return not training and grad_enabled
