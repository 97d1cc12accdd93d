"""The import rules of docs/ARCHITECTURE.md ("Import rules"), checked statically (no import is run):

* the shared blocks `txv_*.py` never import a variant's file (configuration_* / modeling_*);
* configuration_* / modeling_* / tokenization_* files (and the txv_* blocks: all of them ship in a Hub repo's
  remote-code payload) import only `.txv_*` blocks, their own configuration, transformers (and its huggingface_hub),
  torch and the
  standard library (a tokenizer also its tokenization library, sacremoses): never `..`, never `hf_txvariants`,
  never the training / hub / cli / metrics subpackages;
* nothing in the package imports the repository's `conversion` folder (the wheel installs it as
  `hf_txvariants.converters`, reached only by `txv convert`);
* only `hf_txvariants.rl.rllib` imports Ray, and nothing in the package imports it (it needs the `rllib` extra)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_txvariants"
PAYLOAD = sorted(
    p for p in PACKAGE.glob("*.py") if p.name.startswith(("txv_", "configuration_", "modeling_", "tokenization_"))
)
# huggingface_hub: transformers 5 configs use its `strict` dataclasses (a dependency of transformers itself)
THIRD_PARTY_ALLOWED = {"transformers", "torch", "huggingface_hub"}
# a tokenizer may also use its tokenization library (Transformer-XL's: the Moses tokenizer)
TOKENIZER_LIBRARIES = {"sacremoses"}


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import: level 0 for absolute, 1 for `from .x`, 2 for `from ..x`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def payload_violations(path: Path) -> list[str]:
    own_configuration = path.stem.replace("modeling_", "configuration_", 1)
    bad = []
    for level, module in imports(path):
        top = module.split(".")[0]
        if level == 0:
            allowed = THIRD_PARTY_ALLOWED | (TOKENIZER_LIBRARIES if path.name.startswith("tokenization_") else set())
            if top not in allowed and top not in sys.stdlib_module_names:
                bad.append(f"import {module}")
        elif level > 1:
            bad.append(f"from {'.' * level}{module} import ...")
        elif path.name.startswith("txv_"):
            if not module.startswith("txv_"):
                bad.append(f"from .{module} import ... (a shared block imports a variant or a subpackage)")
        elif not (module.startswith("txv_") or module == own_configuration):
            bad.append(f"from .{module} import ...")
    return bad


@pytest.mark.parametrize("path", PAYLOAD, ids=[p.name for p in PAYLOAD])
def test_payload_files_import_only_blocks_their_configuration_and_libraries(path):
    assert payload_violations(path) == [], path.name


def test_the_checker_catches_each_forbidden_import(tmp_path):
    cases = {
        "txv_block.py": "from .modeling_vanilla import VanillaModel\n",
        "modeling_x.py": "from ..training import train\n",
        "modeling_y.py": "import hf_txvariants\n",
        "modeling_z.py": "from .hub import push_to_hub\n",
        "configuration_w.py": "import numpy\n",
    }
    for name, source in cases.items():
        (tmp_path / name).write_text(source)
        assert payload_violations(tmp_path / name), name
    (tmp_path / "modeling_ok.py").write_text(
        "import math\nimport torch\nfrom transformers import PreTrainedModel\n"
        "from .configuration_ok import OkConfig\nfrom .txv_mha import x\n"
    )
    assert payload_violations(tmp_path / "modeling_ok.py") == []


def test_nothing_in_the_package_imports_conversion():
    offenders = [
        f"{path.relative_to(PACKAGE)}: {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for level, module in imports(path)
        if level == 0 and module.split(".")[0] == "conversion"
    ]
    assert offenders == []


def test_only_rl_rllib_imports_ray_and_nothing_imports_it():
    rllib = PACKAGE / "rl" / "rllib.py"
    offenders = [
        f"{path.relative_to(PACKAGE)}: {'.' * level}{module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != rllib
        for level, module in imports(path)
        if (level == 0 and module.split(".")[0] == "ray") or module.split(".")[-1] == "rllib"
    ]
    assert offenders == []
    assert any(level == 0 and module.startswith("ray.rllib") for level, module in imports(rllib))  # the check sees it
