"""Bits per character (or per token): the mean negative log-likelihood in nats divided by ln 2. Shipped with
hf_txvariants, works offline.

    >>> metric = evaluate.load("hf_txvariants/metrics/bits_per_character/bits_per_character.py")
    >>> metric.compute(nll=[0.5, 1.0], num_tokens=[10, 30])
"""

import math

from hf_txvariants.metrics import shipped_metric


def nats_to_bits(mean_nll: float) -> float:
    return mean_nll / math.log(2)


BitsPerCharacter = shipped_metric.mean_nll_metric(
    "BitsPerCharacter",
    "bits_per_character",
    "Bits per character (or per token): the mean negative log-likelihood in nats divided by ln 2.",
    nats_to_bits,
)
