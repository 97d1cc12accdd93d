"""One model, one file: every registered class writes its own `forward` in its own modeling file and inherits from
at most two of this project's classes (its `<V>PreTrainedModel` and `TxvPreTrainedModel`), and a saved folder of the
XL family carries no code of the Sparse Transformer's patterns. The measurements are tools/model_layout.py's, which
docs/ARCHITECTURE.md's tables come from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOST_PROJECT_BASES = 2  # <V>PreTrainedModel and TxvPreTrainedModel


def _model_layout():
    spec = importlib.util.spec_from_file_location("model_layout", ROOT / "tools" / "model_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYOUT = _model_layout()
CLASSES = [(model_type, cls) for model_type, group in LAYOUT.public_classes().items() for cls in group]
XL_FAMILY = ("transfo-xl", "txv_gtrxl", "txv_adaptive_span")


@pytest.mark.parametrize("model_type, cls", CLASSES, ids=[cls.__name__ for _, cls in CLASSES])
def test_a_registered_class_inherits_from_at_most_two_project_classes(model_type, cls):
    bases = LAYOUT.class_layout(cls)["project_bases"]
    assert len(bases) <= MOST_PROJECT_BASES, f"{cls.__name__} inherits from {len(bases)} project classes: {bases}"


MODELS = [(model_type, cls) for model_type, cls in CLASSES if "PreTrainedModel" not in cls.__name__]


@pytest.mark.parametrize("model_type, cls", MODELS, ids=[cls.__name__ for _, cls in MODELS])
def test_a_registered_model_writes_its_own_forward_in_its_own_file(model_type, cls):
    layout = LAYOUT.class_layout(cls)
    assert layout["forward_owner"] == cls.__name__, f"{cls.__name__} runs {layout['forward_owner']}.forward"
    assert layout["forward_file"] == layout["own_file"], (
        f"{cls.__name__}.forward is written in {layout['forward_file']}, not in {layout['own_file']}"
    )


@pytest.mark.parametrize("model_type", XL_FAMILY)
def test_a_saved_xl_family_folder_carries_no_sparse_transformer_code(model_type):
    shipped = LAYOUT.shipped_files(model_type)
    assert not [name for name in shipped if name.startswith("txv_pattern")], sorted(shipped)
