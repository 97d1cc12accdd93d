"""`txv upgrade-legacy`: a Transformer-XL folder saved by transformers <= 4.x, rewritten without any pickle.

The tokenizer's `vocab.pkl` / `vocab.bin` (read by the restricted unpickler, nothing executed) becomes `vocab.json`
plus tokenizer_config.json with the Moses settings; `pytorch_model.bin` (read weights-only) becomes
`model.safetensors`; the code of the model and of the tokenizer is written next to them with `auto_map`, so the folder
loads with `trust_remote_code=True` where hf_txvariants is not installed. Other files (README.md, ...) are copied.
The result is checked (same vocabulary and tokens, same weights) before it replaces anything."""

from __future__ import annotations

import shutil
from pathlib import Path

# Files of a legacy folder that are rewritten (or dropped: the pickles) rather than copied.
REWRITTEN = {
    "vocab.pkl",
    "vocab.bin",
    "vocab.txt",
    "vocab.json",
    "added_tokens.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "model.safetensors",
    "model.safetensors.index.json",
}
CHECK_TEXT = 'The 2nd state-of-the-art model, 23,000 words long (1.80 m tall), wasn\'t "unknown" to zyxwv.'


def add_parser(sub, name: str, help_text: str):
    """`txv upgrade-legacy` (see hf_txvariants_commands.COMMANDS)."""
    upgrade = sub.add_parser(name, help=help_text)
    add_arguments(upgrade)
    upgrade.set_defaults(func=run)
    return upgrade


def add_arguments(parser):
    parser.add_argument("folder", help="the legacy folder (config.json with model_type transfo-xl, vocab.pkl, weights)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--output", help="write the safe copy here (the legacy folder is left as it is)")
    where.add_argument("--in-place", action="store_true", help="replace the legacy folder (its pickles are removed)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")


def upgrade_legacy(folder, output=None, overwrite=False) -> dict:
    """Writes the pickle-free version of the legacy folder `folder` to `output` (None: in place); returns what was
    written and what was dropped. Raises ValueError / OSError naming the problem; nothing is replaced on failure."""
    import torch
    from transformers import AutoModelForCausalLM

    import hf_txvariants  # noqa: F401 - registers the Auto classes
    from hf_txvariants import TransfoXLTokenizer
    from hf_txvariants.training.folder_lock import locked_atomic_directory

    source = Path(folder)
    if not source.is_dir():
        raise ValueError(f"{source} is not a folder")
    target = source if output is None else Path(output)
    if output is not None and target.exists() and not overwrite:
        raise ValueError(f"{target} already exists (use --overwrite to replace it)")
    if output is not None and target.resolve() == source.resolve():
        raise ValueError("--output is the legacy folder itself: use --in-place")
    names = {path.name for path in source.iterdir()}
    has_vocabulary = names & {"vocab.pkl", "vocab.bin", "vocab.txt", "vocab.json"}
    has_weights = names & {
        "pytorch_model.bin",
        "model.safetensors",
        "pytorch_model.bin.index.json",
        "model.safetensors.index.json",
    }
    if not has_vocabulary and not has_weights:
        raise ValueError(
            f"{source} holds neither a Transformer-XL vocabulary (vocab.pkl, vocab.bin, vocab.txt) nor "
            "weights (pytorch_model.bin, model.safetensors)"
        )
    tokenizer = TransfoXLTokenizer.from_pretrained(source) if has_vocabulary else None
    model = AutoModelForCausalLM.from_pretrained(source).eval() if has_weights else None

    with locked_atomic_directory(target, keep_existing=False) as staging:
        staging = Path(staging)
        for name in sorted(names - REWRITTEN):
            path = source / name
            if name.startswith("."):
                continue
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, staging / name)
        if model is not None:
            model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        # the check: what the new folder loads is what the legacy one held
        if tokenizer is not None:
            again = TransfoXLTokenizer.from_pretrained(staging)
            if again.idx2sym != tokenizer.idx2sym or again.encode(CHECK_TEXT) != tokenizer.encode(CHECK_TEXT):
                raise ValueError(f"the rewritten tokenizer of {source} does not reproduce the legacy one")
        if model is not None:
            reloaded = AutoModelForCausalLM.from_pretrained(staging)
            before, after = model.state_dict(), reloaded.state_dict()
            different = [key for key in before if key not in after or not torch.equal(before[key], after[key])]
            if different:
                raise ValueError(f"the rewritten weights of {source} differ from the legacy ones: {different[:5]}")
        written = sorted(path.name for path in staging.iterdir())
    dropped = sorted(names - set(written))
    return {"folder": str(target), "written": written, "dropped": dropped}


def run(args) -> dict:
    result = upgrade_legacy(args.folder, None if args.in_place else args.output, overwrite=args.overwrite)
    print(f"wrote {result['folder']}: {', '.join(result['written'])}")
    if result["dropped"]:
        print(f"not carried over (pickles and files rewritten under another name): {', '.join(result['dropped'])}")
    return result
