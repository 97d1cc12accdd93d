"""The generated copies in the model files (`# Copied from ...` markers, tools/copies.py) match their sources."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import copies  # noqa: E402

SOURCE = '''class SourceModel:
    @staticmethod
    def forward(hidden, source_scale):
        """Scales by the source's factor."""
        return hidden * source_scale
'''


def write_package(root: Path, copy_body: str) -> Path:
    package = root / "hf_txvariants"
    package.mkdir()
    (package / "modeling_source.py").write_text(SOURCE)
    target = package / "modeling_target.py"
    target.write_text(
        "class TargetModel:\n"
        "    # Copied from hf_txvariants.modeling_source.SourceModel.forward with source->target, Source->Target\n"
        + copy_body
    )
    return target


FRESH_COPY = '''    @staticmethod
    def forward(hidden, target_scale):
        """Scales by the target's factor."""
        return hidden * target_scale
'''


def test_every_copy_in_the_model_files_matches_its_source():
    assert copies.check() == [], "stale copies: run `python tools/copies.py --fix`"


def test_a_fresh_copy_with_replacements_is_not_stale(tmp_path):
    target = write_package(tmp_path, FRESH_COPY)
    assert copies.check(root=tmp_path, files=[target]) == []


def test_an_edited_copy_is_reported_and_fix_rewrites_it_from_its_source(tmp_path):
    target = write_package(tmp_path, FRESH_COPY.replace("hidden * target_scale", "hidden + target_scale"))
    assert copies.check(root=tmp_path, files=[target]) == [
        f"{target}:2: stale copy of hf_txvariants.modeling_source.SourceModel.forward"
    ]
    assert copies.check(root=tmp_path, files=[target], fix=True)
    assert target.read_text().endswith(FRESH_COPY)
    assert copies.check(root=tmp_path, files=[target]) == []


def test_a_marker_naming_an_unknown_source_is_an_error(tmp_path):
    target = write_package(tmp_path, FRESH_COPY)
    target.write_text(target.read_text().replace("SourceModel.forward", "SourceModel.backward"))
    with pytest.raises(copies.CopyError, match="defines no 'SourceModel.backward'"):
        copies.check(root=tmp_path, files=[target])


def test_a_marker_not_followed_by_a_definition_is_an_error(tmp_path):
    target = write_package(tmp_path, "    x = 1\n")
    with pytest.raises(copies.CopyError, match="must start a def or class"):
        copies.check(root=tmp_path, files=[target])


def test_a_marker_goes_on_in_indented_comment_lines(tmp_path):
    target = write_package(tmp_path, FRESH_COPY)
    text = target.read_text().replace(
        " with source->target, Source->Target\n", " with\n    #     source->target,\n    #     Source->Target\n"
    )
    target.write_text(text)
    assert copies.check(root=tmp_path, files=[target]) == []
    target.write_text(text.replace("hidden * target_scale", "hidden - target_scale"))
    assert copies.check(root=tmp_path, files=[target], fix=True)
    assert target.read_text() == text
