"""`evaluate` metric modules shipped with the plugin, loadable offline (the Hub's `perplexity` and `accuracy` need the
network): `hf_txvariants.metrics.load("bits_per_character" | "perplexity" | "accuracy")`, or
`evaluate.load(hf_txvariants.metrics.path("perplexity"))`.

`bits_per_character` and `perplexity` take `nll` (a natural-log negative log-likelihood per token, e.g. a model's
per-token losses) and optionally `num_tokens` per entry (then each `nll` is a mean over that many tokens)."""

from __future__ import annotations

from pathlib import Path

NAMES = ("accuracy", "bits_per_character", "perplexity")


def path(name: str) -> str:
    if name not in NAMES:
        raise ValueError(f"unknown metric {name!r}; hf_txvariants ships {', '.join(NAMES)}")
    return str(Path(__file__).with_name(name) / f"{name}.py")


def load(name: str, **kwargs):
    import evaluate

    return evaluate.load(path(name), **kwargs)


__all__ = ["NAMES", "load", "path"]
