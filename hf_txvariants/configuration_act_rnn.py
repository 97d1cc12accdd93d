"""ACT RNN configuration (Graves 2016, "Adaptive Computation Time for Recurrent Neural Networks"). model_type
`txv_act_rnn`."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .txv_config import TxvConfig
from .txv_config_checks import check_act_fields, check_choice, check_positive, check_probabilities, read_act_epsilon

RNN_TYPES = ("tanh", "gru", "lstm")


@strict
class ACTRNNConfig(TxvConfig):
    r"""
    A recurrent network that ponders: at every input step it runs its cell a variable number of times, as long as
    its halting unit says so, and emits the mean field of the states it went through.

    The paper (Graves 2016, section 2): "s_t^1 = S(s_{t-1}, x_t^1), s_t^n = S(s_t^{n-1}, x_t^n),
    y_t^n = W_y s_t^n + b_y ... x_t^n = x_t + delta_{n,1} is the input at time t augmented with a binary flag that
    indicates whether the input step has just been incremented"; "h_t^n = sigma(W_h s_t^n + b_h)";
    "N(t) = min{n' : sum_{n=1}^{n'} h_t^n >= 1 - epsilon}", "R(t) = 1 - sum_{n=1}^{N(t)-1} h_t^n",
    "p_t^n = R(t) if n = N(t), h_t^n otherwise", "s_t = sum_n p_t^n s_t^n, y_t = sum_n p_t^n y_t^n"; the ponder
    cost "rho_t = N(t) + R(t)" enters the loss as "L(x, y) + tau P(x)". An upper limit M on N(t) ("to prevent very long
    pondering") is `max_ponder_steps`.

    Standard names are stored; the paper's are accepted through `attribute_map` (`time_penalty` = tau,
    `max_steps` = M); `act_epsilon` is stored as `act_threshold` = 1 - epsilon.

    Args:
        vocab_size: token vocabulary (the input ids and, for the LM head, the outputs).
        embedding_size: size of the input vectors x_t (token embeddings, or the `inputs_embeds` given); default
            `hidden_size`.
        hidden_size: size of the RNN state s_t (for `rnn_type="lstm"` the state is the pair (h, c): the halting unit
            and the mean field read both, the output layer reads h).
        rnn_type: the cell S: "tanh" (the paper's parity network: a simple RNN of tanh units), "gru" or "lstm".
        max_ponder_steps (`max_steps`): M, the most cell updates per input step.
        act_threshold: 1 - epsilon (the paper: epsilon = 0.01). act_loss_weight (`time_penalty`): tau, the weight of
            the ponder cost in the loss. The ponder term added to the loss is tau times the mean of rho_t over the real
            input steps, because the language-model loss here is a mean over tokens (the paper sums both over the
            sequence; dividing both by the same count keeps their ratio).
        halting_bias_init: initial bias b_h of the halting unit.
        dropout: on the input vectors and on the output states. initializer_range: std of the embedding and output
            weights (the cells keep PyTorch's uniform(+-1/sqrt(hidden_size)) initialisation).
        use_cache: forward passes return an `ACTRNNCache` (the state) as `cache` (default False, which
            suits training; `generate()` turns it on).
    """

    model_type = "txv_act_rnn"
    attribute_map = {"time_penalty": "act_loss_weight", "max_steps": "max_ponder_steps"}

    embedding_size: int | None = None
    hidden_size: int = 128
    rnn_type: str = "tanh"
    max_ponder_steps: int = 100
    act_threshold: float = 0.99
    act_loss_weight: float = 0.001
    halting_bias_init: float = 1.0
    dropout: float | int = 0.0
    use_cache: bool = False
    tie_word_embeddings: bool = False

    def derive_defaults(self, kwargs: dict):
        super().derive_defaults(kwargs)
        read_act_epsilon(self, kwargs)
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size

    @property
    def num_hidden_layers(self) -> int:
        """One recurrent layer, pondered N(t) times per input step: `hidden_states` holds its input and its output."""
        return 1

    def validate_architecture(self):
        super().validate_architecture()
        check_positive(self, "embedding_size", "max_ponder_steps")
        check_choice(self, "rnn_type", RNN_TYPES)
        check_act_fields(self)
        check_probabilities(self, "dropout")

    @property
    def state_size(self) -> int:
        """Size of s_t: hidden_size, or 2 * hidden_size for an LSTM ((h, c))."""
        return 2 * self.hidden_size if self.rnn_type == "lstm" else self.hidden_size


__all__ = ["ACTRNNConfig"]
