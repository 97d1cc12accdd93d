"""The version is written once, `__version__` in hf_txvariants/__init__.py: pyproject.toml reads it through
`[tool.setuptools.dynamic]`, statically (building the package runs neither torch nor the models), and `txv --version`
answers from the installed metadata without importing the package (tests/test_cli.py checks the latter)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _written_version() -> str:
    tree = ast.parse((ROOT / "hf_txvariants" / "__init__.py").read_text())
    (value,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
    ]
    return value


def test_pyproject_reads_the_version_from_the_package():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hf_txvariants.__version__"}


def test_setuptools_reads_it_without_importing_the_package():
    probe = (
        "import sys\nfrom setuptools.config.expand import read_attr\n"
        "print(read_attr('hf_txvariants.__version__', root_dir=sys.argv[1]))\n"
        "print([m for m in ('torch', 'transformers', 'hf_txvariants') if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert result.stdout.split("\n")[:2] == [_written_version(), "[]"], result.stdout + result.stderr


def test_the_package_and_its_installed_metadata_agree():
    from importlib.metadata import version

    import hf_txvariants

    assert hf_txvariants.__version__ == _written_version() == version("hf-txvariants")
