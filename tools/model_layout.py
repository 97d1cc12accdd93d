"""How each registered model class is built and what its saved folder ships, measured from the code.

For every public class a variant registers with the Auto classes (its `auto_classes`, plus its `<V>PreTrainedModel`):
- `project_bases`: the classes of this project in its method resolution order besides itself (transformers'
  `PreTrainedModel`, `GenerationMixin` and everything outside `hf_txvariants` are not counted);
- `forward_owner`: the class whose `forward` it runs, and `forward_file`, the file that `forward` is written in.

For every variant (model_type): the Python files a saved folder ships (`txv_pretrained.write_code_payload`, plus the
tokenizer's files where the variant has one) and their lines.

    python tools/model_layout.py             # the table, as docs/ARCHITECTURE.md shows it
    python tools/model_layout.py --json F    # the measurements as JSON (the before/after tables are made from these)

tests/test_model_layout.py asserts the rules on the same measurements."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def is_project_class(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "hf_txvariants"


def public_classes() -> dict[str, list[type]]:
    """model_type -> the registered classes of the variant (its PreTrainedModel first, then its Auto classes)."""
    sys.path.insert(0, str(ROOT))  # the checkout's package, not another installed copy
    import hf_txvariants

    classes = {}
    for model_type, (_, pretrained_class) in hf_txvariants.VARIANTS.items():
        module = sys.modules[pretrained_class.__module__]
        registered = [getattr(module, name) for name in pretrained_class.auto_classes.values()]
        classes[model_type] = [pretrained_class] + [cls for cls in registered if cls is not pretrained_class]
    return classes


def class_layout(cls: type) -> dict:
    owner = next(klass for klass in cls.__mro__ if "forward" in vars(klass))
    forward = inspect.unwrap(vars(owner)["forward"])
    return {
        "class": cls.__name__,
        "project_bases": [klass.__name__ for klass in cls.__mro__[1:] if is_project_class(klass)],
        "forward_owner": owner.__name__,
        "forward_file": Path(inspect.getfile(forward)).name,
        "own_file": Path(inspect.getfile(cls)).name,
    }


def shipped_files(model_type: str) -> dict[str, int]:
    """file name -> lines, for the Python files a saved folder of the variant ships."""
    from transformers.dynamic_module_utils import get_relative_import_files

    import hf_txvariants
    from hf_txvariants.txv_pretrained import write_code_payload

    config_class, model_class = hf_txvariants.VARIANTS[model_type]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({"model_type": model_type}))
        names = set(write_code_payload(config_class, model_class, folder)) - {"config.json"}
        sources = {name: (Path(folder) / name).read_text() for name in names}
    modeling = Path(inspect.getfile(model_class))
    tokenization = modeling.with_name(modeling.name.replace("modeling_", "tokenization_", 1))
    if tokenization.exists():
        for path in [str(tokenization), *get_relative_import_files(str(tokenization))]:
            sources[Path(path).name] = Path(path).read_text()
    return {name: len(text.splitlines()) for name, text in sorted(sources.items())}


def measure() -> dict:
    classes = public_classes()
    return {
        "classes": {model_type: [class_layout(cls) for cls in group] for model_type, group in classes.items()},
        "folders": {model_type: shipped_files(model_type) for model_type in classes},
    }


def render(measured: dict) -> str:
    lines = [
        "| model_type | class | project classes in its MRO besides itself | its forward written in |",
        "|---|---|---|---|",
    ]
    for model_type, group in measured["classes"].items():
        for entry in group:
            bases = ", ".join(f"`{name}`" for name in entry["project_bases"]) or "none"
            lines.append(
                f"| `{model_type}` | `{entry['class']}` | {len(entry['project_bases'])}: {bases} | "
                f"`{entry['forward_owner']}.forward` in `{entry['forward_file']}` |"
            )
    lines += ["", "| model_type | files a saved folder ships | lines |", "|---|---|---|"]
    for model_type, files in measured["folders"].items():
        lines.append(f"| `{model_type}` | {len(files)} | {sum(files.values()):,} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the measurements to this file as JSON")
    args = parser.parse_args(argv)
    measured = measure()
    if args.json:
        Path(args.json).write_text(json.dumps(measured, indent=1) + "\n")
    print(render(measured))


if __name__ == "__main__":
    main()
