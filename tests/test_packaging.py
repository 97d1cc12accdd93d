"""The wheel: every subpackage of hf_txvariants is listed in pyproject.toml, and the converters ship inside the
package as `hf_txvariants.converters` (built from the repository's conversion/ folder), not as a generic top-level
`conversion` package in site-packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _setuptools():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed_and_the_converters_are_mapped():
    setuptools = _setuptools()
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hf_txvariants").rglob("__init__.py")}
    assert on_disk | {"hf_txvariants.converters"} == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"hf_txvariants.converters": "conversion"}
    assert "conversion" not in setuptools["packages"]


def test_txv_convert_imports_the_installed_converters():
    import hf_txvariants.converters.kimiyoung_tf as installed

    assert Path(installed.__file__).resolve().parent == ROOT / "conversion"


@pytest.mark.slow
def test_the_wheel_has_no_top_level_conversion_package(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("hf_txvariants-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("conversion/")]
    assert "hf_txvariants/converters/kimiyoung_tf.py" in names and "hf_txvariants/converters/safe_pickle.py" in names
    assert "hf_txvariants/cli/convert.py" in names
    # the `txv` script's launcher (answers --help / --version without importing the models) and its table of
    # subcommands are in the wheel
    assert "hf_txvariants_launcher.py" in names and "hf_txvariants_commands.py" in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "txv = hf_txvariants_launcher:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
