"""The README's commands are the ones CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    return re.findall(r"```bash\n(python3 -m venv .venv[^\n]*)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    demo, tests = readme_commands()[:2]
    assert "pytest" in tests and "txv demo" in demo
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_torch_is_installed_before_the_package():
    for command in readme_commands():
        assert command.index("torch==2.13.0") < command.index("pip install -e")
