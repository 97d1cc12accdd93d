"""Bits per character (or per token): the mean negative log-likelihood in nats divided by ln 2. Shipped with hf_txvariants, works offline."""

import math

import datasets
import evaluate

_DESCRIPTION = "Bits per character (or per token): the mean negative log-likelihood in nats divided by ln 2."
_KWARGS_DESCRIPTION = """
Args:
    nll: natural-log negative log-likelihoods, one per token (or one mean per entry with num_tokens).
    num_tokens: optional keyword of compute(), the number of tokens each nll entry is the mean of (default 1 each).
Returns:
    bits_per_character: a float; num_tokens: the number of tokens counted.
Example:
    >>> metric = evaluate.load("hf_txvariants/metrics/bits_per_character/bits_per_character.py")
    >>> metric.compute(nll=[0.5, 1.0], num_tokens=[10, 30])
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BitsPerCharacter(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"nll": datasets.Value("float64")}),
        )

    def _compute(self, nll, num_tokens=None):
        if len(nll) == 0:
            raise ValueError("bits_per_character needs at least one nll value")
        weights = [1] * len(nll) if num_tokens is None else list(num_tokens)
        if any(w <= 0 for w in weights):
            raise ValueError("num_tokens must be positive")
        total = sum(weights)
        mean = sum(float(v) * w for v, w in zip(nll, weights)) / total
        return {"bits_per_character": mean / math.log(2), "num_tokens": int(total)}
