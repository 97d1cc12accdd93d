"""Perplexity: exp of the mean negative log-likelihood per token (nats). Shipped with hf_txvariants, works offline.

>>> metric = evaluate.load("hf_txvariants/metrics/perplexity/perplexity.py")
>>> metric.compute(nll=[0.5, 1.0], num_tokens=[10, 30])
"""

import math

from hf_txvariants.metrics import shipped_metric

Perplexity = shipped_metric.mean_nll_metric(
    "Perplexity", "perplexity", "Perplexity: exp of the mean negative log-likelihood per token (nats).", math.exp
)
