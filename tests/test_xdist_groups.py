"""The README's test command (`-n 2 --dist loadgroup`) keeps the tests of one `xdist_group` on one worker: the
two-process training launches (`xdist_group("distributed")`) must never overlap on the 2 cores. pytest-xdist 3.8
marks a group through a node attribute that pytest 9.2 no longer reads (pyproject.toml pins pytest < 9); this runs a
grouped session and fails the day a group is spread again."""

from __future__ import annotations

import os
import subprocess
import sys

GROUPED = """
import os, time, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("index", range(6))
def test_grouped(index):
    time.sleep(0.2)
    with open(os.path.join(os.environ["GROUPED_OUT"], f"worker-{index}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])
"""


def test_one_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"]
    result = subprocess.run(
        [*command, "test_grouped.py"],
        cwd=tmp_path,
        env={**os.environ, "GROUPED_OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    written = sorted(tmp_path.glob("worker-*"))
    assert len(written) == 6 and len({path.read_text() for path in written}) == 1
