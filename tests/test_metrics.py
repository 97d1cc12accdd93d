"""The evaluate modules shipped with the plugin load offline and compute what their definitions say."""

from __future__ import annotations

import math

import evaluate
import pytest

from hf_txvariants import metrics


def test_bits_per_character_and_perplexity():
    nll = [0.5, 1.0, 2.0]
    bpc = metrics.load("bits_per_character").compute(nll=nll)
    assert bpc["bits_per_character"] == pytest.approx(sum(nll) / 3 / math.log(2))
    assert bpc["num_tokens"] == 3
    ppl = metrics.load("perplexity").compute(nll=nll)
    assert ppl["perplexity"] == pytest.approx(math.exp(sum(nll) / 3))
    # entries that are means over several tokens are weighted by their token counts
    weighted = metrics.load("perplexity").compute(nll=[1.0, 2.0], num_tokens=[3, 1])
    assert weighted["perplexity"] == pytest.approx(math.exp(5.0 / 4)) and weighted["num_tokens"] == 4


def test_add_batch_then_compute_and_loading_by_path():
    metric = evaluate.load(metrics.path("bits_per_character"))
    metric.add_batch(nll=[math.log(2)] * 4)
    metric.add_batch(nll=[2 * math.log(2)] * 4)
    assert metric.compute()["bits_per_character"] == pytest.approx(1.5)


def test_accuracy():
    accuracy = metrics.load("accuracy")
    assert accuracy.compute(predictions=[1, 0, 1, 1], references=[1, 1, 1, 0])["accuracy"] == pytest.approx(0.5)
    assert accuracy.compute(predictions=[1, 0], references=[1, 1], sample_weight=[3, 1])["accuracy"] == pytest.approx(
        0.75
    )


def test_bad_input():
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        metrics.load("bleu")
    with pytest.raises(ValueError, match="at least one"):
        metrics.load("perplexity").compute(nll=[])


@pytest.mark.parametrize("name", metrics.NAMES)
def test_each_script_runs_its_own_metric_not_the_shared_base(name):
    # `evaluate` runs the first Metric subclass in a script's namespace and names the metric after its class
    assert metrics.load(name).name == name
