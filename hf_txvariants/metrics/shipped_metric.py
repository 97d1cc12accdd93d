"""The base classes of the metrics shipped in this folder: the `evaluate.MetricInfo` every one of them builds, and the
token-weighted mean negative log-likelihood that bits per character and perplexity are both functions of.

The metric scripts import this module as `hf_txvariants.metrics.shipped_metric` (an installed package): `evaluate`
copies a metric script into its own cache before running it, so a relative import would not resolve there. They import
the module, not its classes: `evaluate` runs the first `Metric` subclass it finds in a script's namespace."""

from __future__ import annotations

from collections.abc import Callable

import datasets
import evaluate


class ShippedMetric(evaluate.Metric):
    """An `evaluate.Metric` described by three class attributes: `DESCRIPTION`, `KWARGS_DESCRIPTION` and `FEATURES`
    (the column name -> `datasets.Value` of its inputs)."""

    DESCRIPTION: str = ""
    KWARGS_DESCRIPTION: str = ""
    FEATURES: dict = {}

    def _info(self):
        return evaluate.MetricInfo(
            description=self.DESCRIPTION,
            citation="",
            inputs_description=self.KWARGS_DESCRIPTION,
            features=datasets.Features(self.FEATURES),
        )


def nll_kwargs_description(name: str) -> str:
    """The inputs description of a metric computed from the mean negative log-likelihood (`MeanNLLMetric`)."""
    return f"""
Args:
    nll: natural-log negative log-likelihoods, one per token (or one mean per entry with num_tokens).
    num_tokens: optional keyword of compute(), the number of tokens each nll entry is the mean of (default 1 each).
Returns:
    {name}: a float; num_tokens: the number of tokens counted.
Example:
    >>> metric = evaluate.load("hf_txvariants/metrics/{name}/{name}.py")
    >>> metric.compute(nll=[0.5, 1.0], num_tokens=[10, 30])
"""


class MeanNLLMetric(ShippedMetric):
    """A metric that is a function (`from_mean_nll`) of the token-weighted mean of natural-log negative
    log-likelihoods; it returns `{NAME: value, "num_tokens": total tokens}`."""

    NAME: str = ""  # the key of the result, also the metric's name
    FEATURES = {"nll": datasets.Value("float64")}

    def from_mean_nll(self, mean_nll: float) -> float:
        raise NotImplementedError

    def _compute(self, nll, num_tokens=None):
        if len(nll) == 0:
            raise ValueError(f"{self.NAME} needs at least one nll value")
        weights = [1] * len(nll) if num_tokens is None else list(num_tokens)
        if any(w <= 0 for w in weights):
            raise ValueError("num_tokens must be positive")
        total = sum(weights)
        mean = sum(float(v) * w for v, w in zip(nll, weights)) / total
        return {self.NAME: self.from_mean_nll(mean), "num_tokens": int(total)}


def mean_nll_metric(class_name: str, name: str, description: str, from_mean_nll: Callable[[float], float]) -> type:
    """The `MeanNLLMetric` subclass `class_name` (`evaluate` names the metric after it) returning
    `{name: from_mean_nll(token-weighted mean nll), "num_tokens": ...}`, documented by `description`."""
    kwargs_description = nll_kwargs_description(name)
    return type(
        class_name,
        (MeanNLLMetric,),
        {
            "__doc__": description + kwargs_description,
            "NAME": name,
            "DESCRIPTION": description,
            "KWARGS_DESCRIPTION": kwargs_description,
            "from_mean_nll": staticmethod(from_mean_nll),
        },
    )
