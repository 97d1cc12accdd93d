"""docs/ARCHITECTURE.md's house map (each variant's files and the `txv_*` blocks its Hub folder carries) is the one
tools/house_map.py generates from the code: a change to the imports that the docs do not show fails here, naming the
command that refreshes the section."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _house_map():
    spec = importlib.util.spec_from_file_location("house_map", ROOT / "tools" / "house_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_house_map_in_the_architecture_page_is_the_generated_one():
    house_map = _house_map()
    written = house_map.current_section(house_map.ARCHITECTURE.read_text())
    assert written is not None, (
        f"docs/ARCHITECTURE.md lost its house-map markers; restore them, then run: {house_map.REFRESH}"
    )
    assert written == house_map.render(house_map.variant_files()), (
        f"docs/ARCHITECTURE.md's house map is stale: run `{house_map.REFRESH}` and commit the result"
    )


def test_the_map_lists_every_file_a_saved_folder_carries(tmp_path):
    """The map's files for a variant are exactly the code files `save_pretrained` writes (GTrXL, tiny)."""
    from hf_txvariants import GTrXLForCausalLM
    from tiny_configs import tiny_config

    model = GTrXLForCausalLM(tiny_config("txv_gtrxl"))
    model.save_pretrained(tmp_path)
    entry = _house_map().variant_files()["txv_gtrxl"]
    assert {p.name for p in tmp_path.glob("*.py")} == set(entry["blocks"]) | set(entry["other"])
