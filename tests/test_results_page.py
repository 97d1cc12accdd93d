"""benchmarks/RESULTS.md keeps the shape that makes it read in a minute (issue 44 item 4).

The page opens with its headline tables, one for the CPU and one for the GPU (at most a few lines of prose before the
first); together they hold at most 15 rows of claim, figure, peer's figure, ratio and met / not met, no cell longer than
80 characters; every link on the page resolves, and every area file under benchmarks/results/ is linked from it, so
each current figure is two clicks away. `page_problems` lists what is wrong; the unit tests feed it broken pages.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "benchmarks" / "RESULTS.md"

COLUMNS = ("claim", "figure", "peer's figure", "ratio", "met")
MAX_ROWS = 15
MAX_CELL = 80
MAX_LINES_BEFORE_FIRST_TABLE = 4  # prose lines, besides headings and blank lines
HEADLINE = "## Headline"
DEVICE_WORDS = {"CPU": re.compile(r"\bCPU\b"), "GPU": re.compile(r"\b(GPU|CUDA|H100|H200|A100)\b", re.IGNORECASE)}
MET = re.compile(r"^(met|not met)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
AREA_FOLDER = "results"


def cells(row: str) -> list[str]:
    """A table row's cells, stripped (a `\\|` inside a cell is not a separator)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def tables(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Each table of the page as (index of its first line, its lines)."""
    found, start = [], None
    for i, line in enumerate(lines + [""]):
        if line.lstrip().startswith("|"):
            start = i if start is None else start
        elif start is not None:
            found.append((start, lines[start:i]))
            start = None
    return found


def heading_of(lines: list[str], index: int) -> str:
    """The nearest `## ` heading above line `index` ('' if none)."""
    return next((line for line in reversed(lines[:index]) if line.startswith("## ")), "")


def link_problems(text: str, folder: Path, name: str) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (folder / target.split("#")[0]).exists():
            problems.append(f"{name} links to {target}, which does not exist")
    return problems


def page_problems(text: str, folder: Path) -> list[str]:
    """What keeps `text` (a RESULTS.md in `folder`) from the page's shape; empty when it has it."""
    lines = text.splitlines()
    found = tables(lines)
    if not found:
        return ["the page has no table"]
    problems = []
    first_start = found[0][0]
    prose = [line for line in lines[:first_start] if line.strip() and not line.startswith("#")]
    if len(prose) > MAX_LINES_BEFORE_FIRST_TABLE:
        problems.append(
            f"the first table is not first: {len(prose)} lines of prose before it (at most "
            f"{MAX_LINES_BEFORE_FIRST_TABLE})"
        )
    section_headings = [line for line in lines if line.startswith("## ")]
    headline_sections = [h for h in section_headings if h.startswith(HEADLINE)]
    if section_headings[: len(headline_sections)] != headline_sections:
        problems.append("the headline sections are not the first sections of the page")
    headline = [(start, rows) for start, rows in found if heading_of(lines, start).startswith(HEADLINE)]
    if not headline or headline[0][0] != first_start:
        problems.append(f"the first table is not a headline table (under a '{HEADLINE} ...' heading)")
    devices_seen: dict[str, str] = {}
    total_rows = 0
    for start, rows in headline:
        heading = heading_of(lines, start)
        devices = [device for device, words in DEVICE_WORDS.items() if words.search(heading)]
        if len(devices) != 1:
            problems.append(f"'{heading}' must name one device, CPU or GPU, not {devices or 'none'}: keep them apart")
            continue
        device = devices[0]
        if device in devices_seen:
            problems.append(f"two headline tables for the {device}: '{devices_seen[device]}' and '{heading}'")
        devices_seen[device] = heading
        header = tuple(cell.lower() for cell in cells(rows[0]))
        if header != COLUMNS:
            missing = [column for column in COLUMNS if column not in header]
            problems.append(f"'{heading}': columns {header}, expected {COLUMNS} (missing: {missing})")
        body = rows[2:] if len(rows) > 1 and set(rows[1].replace("|", "").strip()) <= set("-: ") else rows[1:]
        total_rows += len(body)
        other = "GPU" if device == "CPU" else "CPU"
        for row in body:
            row_cells = cells(row)
            if len(row_cells) != len(COLUMNS):
                problems.append(f"'{heading}': a row of {len(row_cells)} cells, not {len(COLUMNS)}: {row}")
                continue
            for cell in row_cells:
                if len(cell) > MAX_CELL:
                    problems.append(f"a cell of {len(cell)} characters (at most {MAX_CELL}): {cell}")
            if not MET.match(row_cells[-1]):
                problems.append(f"a met cell that says neither 'met' nor 'not met': {row_cells[-1]!r}")
            if DEVICE_WORDS[other].search(row):
                problems.append(f"CPU and GPU rows mixed: a {other} row in the {device} table: {row}")
    if total_rows > MAX_ROWS:
        problems.append(f"{total_rows} headline rows, at most {MAX_ROWS}")
    problems += link_problems(text, folder, "RESULTS.md")
    linked = {(folder / target.split("#")[0]).resolve() for target in LINK.findall(text)}
    for area in sorted((folder / AREA_FOLDER).glob("*.md")):
        if area.resolve() not in linked:
            problems.append(f"{AREA_FOLDER}/{area.name} is not linked from RESULTS.md")
        problems += link_problems(area.read_text(), area.parent, f"{AREA_FOLDER}/{area.name}")
    return problems


def test_the_results_page_keeps_its_shape():
    assert page_problems(PAGE.read_text(), PAGE.parent) == []


GOOD_PAGE = """# Benchmark results

One line of introduction.

## Headline: CPU (a 2-core CPU)

| claim | figure | peer's figure | ratio | met |
|---|---|---|---|---|
| [Faster than the peer](results/area.md) | 10 tokens/s | 5 | 2.00x | met |
| [Smaller than the peer](results/area.md) | 1 MiB | 2 MiB | 0.50x | not met (goal 0.4x) |

## Headline: GPU (one H100)

| claim | figure | peer's figure | ratio | met |
|---|---|---|---|---|
| [Faster on the card](results/area.md) | 100 tokens/s | 50 | 2.00x | met |

## Areas

- [area.md](results/area.md): the area.
"""

ROW = "| [Faster than the peer](results/area.md) | 10 tokens/s | 5 | 2.00x | met |"


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "area.md").write_text("# Area\n\nFigures, [notes](../notes.md).\n")
    (tmp_path / "notes.md").write_text("# Notes\n")
    return tmp_path


def test_the_good_page_of_these_tests_passes(folder):
    assert page_problems(GOOD_PAGE, folder) == []


BROKEN_PAGES = {
    "prose_first": (
        GOOD_PAGE.replace("One line of introduction.", "A paragraph\nof five\nlines\nbefore\nthe table."),
        "the first table is not first",
    ),
    "another_table_first": (
        GOOD_PAGE.replace("One line of introduction.", "| run | figure |\n|---|---|\n| 1 | 2 |"),
        "the first table is not a headline table",
    ),
    "too_many_rows": (GOOD_PAGE.replace(ROW, "\n".join([ROW] * 15)), "17 headline rows, at most 15"),
    "a_long_cell": (
        GOOD_PAGE.replace("| 10 tokens/s |", "| " + "9" * 81 + " |"),
        "a cell of 81 characters (at most 80)",
    ),
    "a_gpu_row_among_the_cpu_rows": (
        GOOD_PAGE.replace("| 10 tokens/s | 5 |", "| 10 tokens/s on the H100 | 5 |"),
        "CPU and GPU rows mixed",
    ),
    "one_table_for_both": (
        GOOD_PAGE.replace("## Headline: CPU (a 2-core CPU)", "## Headline: CPU and GPU"),
        "must name one device",
    ),
    "no_met_column": (re.sub(r"(?m) [^|]*\|$", "", GOOD_PAGE), "missing: ['met']"),
    "a_met_cell_that_says_neither": (GOOD_PAGE.replace("| 2.00x | met |", "| 2.00x | yes |", 1), "says neither"),
    "a_link_to_a_missing_results_file": (
        GOOD_PAGE.replace("(results/area.md): the area", "(results/gone.md): the area"),
        "links to results/gone.md, which does not exist",
    ),
    "an_area_file_not_linked": (GOOD_PAGE.replace("results/area.md", "#area"), "results/area.md is not linked"),
    "headlines_after_another_section": (
        GOOD_PAGE.replace("One line of introduction.", "## About\n\nOne line of introduction."),
        "the headline sections are not the first sections",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_PAGES))
def test_a_broken_page_is_refused(folder, case):
    page, expected = BROKEN_PAGES[case]
    problems = page_problems(page, folder)
    assert any(expected in problem for problem in problems), problems


def test_a_cell_of_80_characters_passes(folder):
    assert page_problems(GOOD_PAGE.replace("| 10 tokens/s |", "| " + "9" * 80 + " |"), folder) == []


def test_a_broken_link_in_an_area_file_is_refused(folder):
    (folder / "notes.md").unlink()
    assert page_problems(GOOD_PAGE, folder) == ["results/area.md links to ../notes.md, which does not exist"]
