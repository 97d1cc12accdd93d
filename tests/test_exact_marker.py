"""Every test that compares tensors exactly carries `@pytest.mark.exact`, and only those do.

CI (`.ci/run`) reruns `-m exact` under other CPU kernels (`ATEN_CPU_CAPABILITY=default`, `avx2`): an exact comparison
of two different float paths passes on one CPU and fails on another, so it must be selectable. Read statically (AST):
an exact comparison is a call of `torch.equal` / `tensor.equal(...)`, or `assert_close(..., atol=0, rtol=0)`, inside a
`test_*` function (nested helpers included). A helper function outside the test that compares exactly is not seen:
keep the comparison in the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# "file::test" -> why it is not marked yet. Each entry must still be needed (the check below fails on a stale one).
NOT_YET_MARKED: dict[str, str] = {}


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 0


def _exact_comparison_lines(function: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(function):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        keywords = {k.arg: k.value for k in node.keywords}
        if called == "equal" or (
            called == "assert_close" and _is_zero(keywords.get("atol")) and _is_zero(keywords.get("rtol"))
        ):
            lines.append(node.lineno)
    return lines


def _marks_exact(decorators: list[ast.expr]) -> bool:
    """`@pytest.mark.exact` (or `@mark.exact`), called or not."""
    for decorator in decorators:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (
            isinstance(target, ast.Attribute)
            and target.attr == "exact"
            and isinstance(target.value, ast.Attribute)
            and target.value.attr == "mark"
        ):
            return True
    return False


def audit(source: str) -> dict[str, tuple[list[int], bool]]:
    """test name (`Class.test` for methods) -> (lines of its exact comparisons, whether it carries the marker)."""
    found = {}

    def visit(body, prefix="", class_marked=False):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.", class_marked or _marks_exact(node.decorator_list))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                marked = class_marked or _marks_exact(node.decorator_list)
                found[prefix + node.name] = (_exact_comparison_lines(node), marked)

    visit(ast.parse(source).body)
    return found


def _test_files():
    return sorted(TESTS.glob("test_*.py")) + [TESTS / "txv_tester.py"]


def test_the_audit_sees_exact_comparisons_and_the_marker():
    source = """
import pytest, torch
def test_unmarked(): assert torch.equal(a, b)
@pytest.mark.exact
@pytest.mark.parametrize("x", [1])
def test_marked(x): torch.testing.assert_close(a, b, atol=0, rtol=0)
def test_tolerance(): torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
def test_nested():
    def check(): return x.equal(y)
class TestGroup:
    @pytest.mark.exact
    def test_method(self): assert torch.equal(a, b)
"""
    assert audit(source) == {
        "test_unmarked": ([3], False),
        "test_marked": ([6], True),
        "test_tolerance": ([], False),
        "test_nested": ([9], False),
        "TestGroup.test_method": ([12], True),
    }


def test_every_exact_comparison_is_marked_and_every_marked_test_compares_exactly():
    unmarked, needless, seen = [], [], set()
    for path in _test_files():
        for name, (lines, marked) in audit(path.read_text()).items():
            key = f"{path.name}::{name}"
            seen.add(key)
            if lines and not marked and key not in NOT_YET_MARKED:
                unmarked.append(f"{key} (lines {lines})")
            if marked and not lines:
                needless.append(key)
    assert not unmarked, f"compares exactly: add @pytest.mark.exact, or give it a tolerance: {unmarked}"
    assert not needless, f"marked exact without an exact comparison: remove the marker: {needless}"
    assert len(seen) > 100  # the audit read the suite


@pytest.mark.parametrize("key", sorted(NOT_YET_MARKED))
def test_every_exemption_is_still_needed(key):
    file_name, name = key.split("::")
    lines, marked = audit((TESTS / file_name).read_text())[name]
    assert lines and not marked, f"{key}: no longer an unmarked exact comparison; remove it from NOT_YET_MARKED"


def test_the_marker_is_registered(pytestconfig):
    assert any(line.startswith("exact:") for line in pytestconfig.getini("markers"))


def test_ci_reruns_the_exact_tests_under_other_cpu_kernels():
    ci = (TESTS.parent / ".ci" / "run").read_text()
    assert "-m exact" in ci
    assert "\nexact_as_on avx2 AVX2 AVX2\n" in ci and "\nexact_as_on default SSE41 SSE4_2\n" in ci
