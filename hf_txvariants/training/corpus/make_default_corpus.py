"""Builds `default_corpus.txt.gz`, the demo's embedded corpus: the docstrings (English prose with some code) of the
Python standard library's pure-Python modules, in sorted file order, deduplicated. Python's sources are under the PSF
license. Re-run with `python -m hf_txvariants.training.corpus.make_default_corpus` (the output depends on the Python
version, which is why the built file is shipped rather than rebuilt at run time)."""

from __future__ import annotations

import ast
import gzip
import sysconfig
from pathlib import Path

MAX_CHARS = 1_200_000


def stdlib_docstrings(max_chars: int = MAX_CHARS) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "lib2to3", "site-packages", "turtledemo", "tkinter", "ensurepip", "encodings")
    seen, parts, total = set(), [], 0
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if any(part in skip or part.startswith("test") for part in relative.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if not doc or len(doc) < 80 or doc in seen or not doc.isascii():
                    continue
                seen.add(doc)
                parts.append(doc.strip() + "\n\n")
                total += len(parts[-1])
                if total >= max_chars:
                    return "".join(parts)
    return "".join(parts)


if __name__ == "__main__":
    text = stdlib_docstrings()
    target = Path(__file__).with_name("default_corpus.txt.gz")
    with gzip.GzipFile(target, "wb", mtime=0) as f:
        f.write(text.encode("utf-8"))
    print(f"wrote {target} ({len(text)} characters, {len(set(text))} distinct)")
