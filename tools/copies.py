"""Generated copies: one hand-written source for code that several model files hold, as transformers' check_copies.

A model file reads top to bottom: its classes write their `forward` out instead of inheriting it from a chain of
mixins. Where two variants run the same code (the XL family's backbone, the task heads), one of them holds the
hand-written source and the others hold a copy that this tool writes, marked on the line above it:

    # Copied from hf_txvariants.modeling_transfo_xl.TransfoXLModel.forward with TransfoXL->GTrXL, word_emb->embed_tokens
    def forward(self, ...):
        ...

The marker names the source (`hf_txvariants.<module>.<Class>[.<method>]` or a module-level function) and, after
`with`, the replacements applied to its text in order (`old->new`, separated by ", "). A marker too long for one line
goes on in comment lines indented by four more spaces, each with more replacements:

    # Copied from hf_txvariants.modeling_act_rnn.ACTRNNForSequenceClassification.__init__ with
    #     ACTRNN->UniversalTransformer, ... The copy is the source's text
(its decorators, signature and body) with the replacements, re-indented to the marker's depth and formatted by ruff
(pyproject.toml's settings), so a reader tells a copy from hand-written code by its marker, and edits the source.
A copy may itself hold copies (a copied class whose methods carry markers): they are compared as text.

    python tools/copies.py          # lists every stale copy (exit status 1 if any)
    python tools/copies.py --fix    # rewrites them from their sources

tests/test_copies.py fails when a copy is stale. Nothing is imported or run: sources are read with `ast`."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hf_txvariants"
MARKER = re.compile(r"^(?P<indent>[ ]*)# Copied from (?P<source>[\w.]+)(?: with(?: (?P<replacements>.+))?)?$")
CONTINUATION = re.compile(r"^(?P<indent>[ ]*)#     (?P<replacements>\S.*)$")  # more replacements, four spaces in
INDENT_STEP = 4  # ruff's indentation (pyproject.toml)


class CopyError(ValueError):
    """A marker that cannot be followed (unknown source, no definition after it, a malformed replacement)."""


@dataclass
class Copy:
    path: Path
    marker_line: int  # 0-based index of the marker line
    start: int  # 0-based index of the copy's first line (its first decorator or its def / class line)
    end: int  # 0-based index one past the copy's last line
    indent: str
    source: str
    replacements: list[tuple[str, str]]

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.marker_line + 1}"


def parse_replacements(text: str | None, where: str) -> list[tuple[str, str]]:
    if not text:
        return []
    pairs = []
    for item in text.split(", "):
        old, arrow, new = item.partition("->")
        if not arrow or not old:
            raise CopyError(f"{where}: replacement {item!r} is not of the form old->new")
        pairs.append((old, new))
    return pairs


def definition_span(tree: ast.Module, qualified_name: str) -> ast.AST | None:
    """The function or class `A.b.c` of a parsed module (None if it has none)."""
    scope: list[ast.stmt] = tree.body
    node = None
    for name in qualified_name.split("."):
        node = next(
            (
                child
                for child in scope
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == name
            ),
            None,
        )
        if node is None:
            return None
        scope = node.body
    return node


def first_line(node: ast.AST) -> int:
    """1-based first line of a definition, its decorators included."""
    return min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])


def module_path(root: Path, dotted: str) -> tuple[Path, str]:
    """`hf_txvariants.modeling_x.A.b` -> (the module's file, "A.b"): the longest prefix that is a file."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        path = root.joinpath(*parts[:split]).with_suffix(".py")
        if path.is_file():
            return path, ".".join(parts[split:])
    raise CopyError(f"no module file for {dotted!r} under {root}")


def find_copies(path: Path, text: str) -> list[Copy]:
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    starts = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            starts[first_line(node) - 1] = node
    copies = []
    for index, line in enumerate(lines):
        match = MARKER.match(line)
        if match is None:
            continue
        where = f"{path}:{index + 1}"
        replacements = [match["replacements"]] if match["replacements"] else []
        last = index
        while last + 1 < len(lines):
            more = CONTINUATION.match(lines[last + 1])
            if more is None or more["indent"] != match["indent"]:
                break
            replacements.append(more["replacements"].rstrip(","))
            last += 1
        node = starts.get(last + 1)
        if node is None:
            raise CopyError(f"{where}: the line after '# Copied from' must start a def or class (or its decorators)")
        copies.append(
            Copy(
                path=path,
                marker_line=index,
                start=last + 1,
                end=node.end_lineno,
                indent=match["indent"],
                source=match["source"],
                replacements=parse_replacements(", ".join(replacements), where),
            )
        )
    return copies


def source_text(root: Path, dotted: str, where: str, texts: dict[Path, str]) -> str:
    """The source definition's lines, dedented (decorators included)."""
    if not dotted.startswith(PACKAGE + "."):
        raise CopyError(f"{where}: a source must be in {PACKAGE}, got {dotted!r}")
    path, qualified = module_path(root, dotted)
    text = texts.get(path) or path.read_text()
    node = definition_span(ast.parse(text), qualified)
    if node is None:
        raise CopyError(f"{where}: {path.name} defines no {qualified!r}")
    lines = text.splitlines(keepends=True)[first_line(node) - 1 : node.end_lineno]
    return textwrap.dedent("".join(lines))


def ruff_format(code: str, depth: int) -> str:
    """`code` (dedented) formatted by ruff as it would be `depth` indentation levels deep, then re-indented."""
    wrapper = "".join(" " * (INDENT_STEP * level) + "class _Wrapper:\n" for level in range(depth))
    snippet = wrapper + textwrap.indent(code, " " * (INDENT_STEP * depth))
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--quiet", "--stdin-filename", str(ROOT / "_copy.py"), "-"],
        input=snippet,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if result.returncode != 0:
        raise CopyError(f"ruff could not format a copy: {result.stderr.strip()}")
    formatted = result.stdout.splitlines(keepends=True)[depth:]
    return "".join(formatted)


def expected_copy(root: Path, copy: Copy, texts: dict[Path, str]) -> str:
    code = source_text(root, copy.source, copy.where(), texts)
    for old, new in copy.replacements:
        code = code.replace(old, new)
    if len(copy.indent) % INDENT_STEP:
        raise CopyError(f"{copy.where()}: a marker's indentation must be a multiple of {INDENT_STEP} spaces")
    return ruff_format(code, len(copy.indent) // INDENT_STEP)


def model_files(root: Path) -> list[Path]:
    return sorted((root / PACKAGE).glob("*.py"))


def check(root: Path = ROOT, fix: bool = False, files: list[Path] | None = None) -> list[str]:
    """The stale copies (`path:line: stale copy of source`); with `fix`, rewritten in place (repeated until a copy of
    a copy is settled too)."""
    files = files if files is not None else model_files(root)
    texts = {path: path.read_text() for path in files}
    rewritten = set()
    for _ in range(10 if fix else 1):
        stale = []
        for path in files:
            lines = texts[path].splitlines(keepends=True)
            changed = False
            for copy in reversed(find_copies(path, texts[path])):  # bottom up: earlier line numbers stay valid
                current = "".join(lines[copy.start : copy.end])
                expected = expected_copy(root, copy, texts)
                if current != expected:
                    stale.append(f"{copy.where()}: stale copy of {copy.source}")
                    if fix:
                        lines[copy.start : copy.end] = expected.splitlines(keepends=True)
                        changed = True
            if changed:
                texts[path] = "".join(lines)
                path.write_text(texts[path])
        rewritten.update(stale)
        if not stale or not fix:
            break
    return sorted(rewritten)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="rewrite every stale copy from its source")
    args = parser.parse_args(argv)
    try:
        stale = check(fix=args.fix)
    except CopyError as error:
        print(f"copies: error: {error}", file=sys.stderr)
        return 2
    for line in stale:
        print(line)
    if stale and not args.fix:
        print(f"{len(stale)} stale copies: run `python tools/copies.py --fix`", file=sys.stderr)
        return 1
    print(f"{'rewrote' if args.fix else 'stale'}: {len(stale)}" if stale else "every copy matches its source")
    return 0


if __name__ == "__main__":
    sys.exit(main())
