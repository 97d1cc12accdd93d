"""Every model card (model_cards/*.md) and the generated card carry valid Hub metadata: loaded with
`huggingface_hub.ModelCard`, they name the library, the plugin's tag and the variant's model type, a pipeline tag the
Hub knows, the license, datasets and metrics where known, and no placeholder link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

import hf_txvariants

ROOT = Path(__file__).resolve().parents[1]
CARDS = sorted((ROOT / "model_cards").glob("*.md"))
# the Hub tasks our models do (a subset of the Hub's pipeline tags)
HUB_PIPELINE_TAGS = {
    "text-generation",
    "text-classification",
    "reinforcement-learning",
    "unconditional-image-generation",
}
PLUGIN_METRICS = {
    p.name for p in (ROOT / "hf_txvariants" / "metrics").iterdir() if p.is_dir() and not p.name.startswith("_")
}
PLACEHOLDER = re.compile(r"\]\(https?://github\.com/?\)")


def _check_metadata(card: ModelCard, where: str):
    data = card.data.to_dict()
    assert data.get("library_name") == "transformers", where
    tags = data.get("tags") or []
    assert "hf-txvariants" in tags and "custom_code" in tags, (where, tags)
    assert any(tag in hf_txvariants.VARIANTS for tag in tags), (where, "no model_type tag", tags)
    assert data.get("pipeline_tag") in HUB_PIPELINE_TAGS, (where, data.get("pipeline_tag"))
    assert data.get("license") == "apache-2.0", where
    assert set(data.get("metrics") or []) <= PLUGIN_METRICS, (where, data.get("metrics"))
    assert not PLACEHOLDER.search(card.content), (where, "placeholder link")


@pytest.mark.parametrize("path", CARDS, ids=[p.name for p in CARDS])
def test_model_card_metadata(path):
    card = ModelCard.load(path)
    _check_metadata(card, path.name)
    data = card.data.to_dict()
    if data.get("pipeline_tag") == "text-generation":
        assert data.get("metrics"), (path.name, "a language model card names its metrics")
    if card.data.eval_results:  # converted checkpoints: the paper's result, on a named dataset
        assert data.get("datasets"), path.name
        assert {r.dataset_type for r in card.data.eval_results} <= set(data["datasets"]), path.name


def test_generated_card_keeps_datasets_and_metrics():
    from hf_txvariants.hub import build_model_card
    from hf_txvariants.training import build_config, build_model

    torch.manual_seed(0)
    model = build_model(build_config("transfo-xl", 20, d_model=16, n_layer=1, n_head=2, mem_len=4))
    card = build_model_card(model, "me/tiny", {"valid_bpc": 1.5, "valid_perplexity": 2.8}, dataset="enwik8")
    card = ModelCard(str(card))  # as the Hub reads it back
    _check_metadata(card, "generated")
    assert card.data.datasets == ["enwik8"]
    assert card.data.metrics == ["bits_per_character", "perplexity"]
    based = build_model_card(
        model, "me/xl", {"test_bpc": 1.0}, dataset="enwik8", base_card=ROOT / "model_cards" / "transfo-xl-enwik8.md"
    )
    based = ModelCard(str(based))
    _check_metadata(based, "generated from a base card")
    assert based.data.datasets == ["enwik8"]


def test_template_has_no_placeholder_link():
    template = (ROOT / "hf_txvariants" / "hub" / "model_card_template.md").read_text()
    assert not PLACEHOLDER.search(template)
