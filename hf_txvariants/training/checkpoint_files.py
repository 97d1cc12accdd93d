"""A resume uses every file of its checkpoint or stops: each file it will read is checked first, present and readable
by the loader that reads it (issue 24). Accelerate's `load_state` and Trainer otherwise skip some missing files with
at most a log line (Trainer: no optimizer.pt or scheduler.pt, no RNG state) and go on from other weights, optimizer
state or random numbers than the checkpoint's. The check names the file; nothing in a file is run (torch files are
read weights-only, memory-mapped, so a large optimizer state is not read twice)."""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path

import torch

from .models import ModelError

# files whose reader is not a weights-only torch.load of tensors: their own loaders check them (the RNG states hold
# numpy arrays that Accelerate's and Trainer's loaders allow explicitly; Trainer never reads training_args.bin back)
NOT_TORCH_TENSOR_FILES = ("random_states_", "rng_state", "training_args.bin")


def check_readable(path: Path, shown: str | None = None) -> None:
    """Raises ModelError naming `path` (as `shown`, default the whole path) when its loader would refuse it: a
    safetensors file whose header or size is wrong, a torch file that is torn or holds more than tensors (a pickle
    that would run code)."""
    shown = shown or str(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as weights:
                weights.keys()
        elif path.suffix in (".bin", ".pt", ".pth") and not path.name.startswith(NOT_TORCH_TENSOR_FILES):
            with warnings.catch_warnings():  # torch warns about a foreign pickle protocol before refusing it
                warnings.simplefilter("ignore")
                # memory-mapped where torch can (its zip format); an older or foreign file is read whole
                torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError:
        raise ModelError(
            f"{shown} is refused by the weights-only loader (it holds more than tensors; nothing in it was run)"
        ) from None
    except Exception as error:  # torn or not a torch file: zip, mmap, EOF or safetensors errors
        reason = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise ModelError(f"{shown} cannot be read ({type(error).__name__}: {reason})") from None


def check_checkpoint_files(checkpoint: Path, required: list) -> None:
    """Every entry of `required` (a file name, or a tuple of alternatives such as the model's safetensors or .bin
    weights) is present in `checkpoint` and readable (`check_readable`); raises ModelError naming the first that
    is not (by its name in the checkpoint: callers say which checkpoint)."""
    for entry in required:
        alternatives = (entry,) if isinstance(entry, str) else tuple(entry)
        present = [checkpoint / name for name in alternatives if (checkpoint / name).is_file()]
        if not present:
            raise ModelError(f"{' or '.join(alternatives)} is missing")
        check_readable(present[0], present[0].name)
