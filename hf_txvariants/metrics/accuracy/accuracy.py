"""Accuracy: the fraction of predictions equal to the references. Shipped with hf_txvariants, works offline."""

import datasets
import evaluate

from hf_txvariants.metrics import shipped_metric

_DESCRIPTION = "Accuracy: the fraction of predictions equal to the references (optionally weighted)."
_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted labels (ints). references: true labels (ints). sample_weight: optional weights.
Returns:
    accuracy: a float in [0, 1].
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(shipped_metric.ShippedMetric):
    DESCRIPTION = _DESCRIPTION
    KWARGS_DESCRIPTION = _KWARGS_DESCRIPTION
    FEATURES = {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}

    def _compute(self, predictions, references, sample_weight=None):
        if len(predictions) == 0:
            raise ValueError("accuracy needs at least one prediction")
        weights = [1.0] * len(predictions) if sample_weight is None else [float(w) for w in sample_weight]
        correct = sum(w for p, r, w in zip(predictions, references, weights) if p == r)
        return {"accuracy": correct / sum(weights)}
