"""The checkpoints of a `txv train` run: `checkpoints/step-N` folders written whole or not at all (model, optimizer,
scheduler and RNG state through Accelerate, each rank's memory, the step, config and tokenizer), found newest first,
checked against the run that resumes them, and loaded (a torn one is skipped for the one before)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import torch

from ..txv_files import atomic_write_bytes, explained_write_errors, replace_directory
from .arguments import TrainArgs, resume_differences, resume_length_note
from .models import ModelError, memory_state, unwrapped

PARTIAL_SUFFIX = ".partial"  # checkpoints/.step-N.partial: a checkpoint being written (ignored by a resume)


def config_fingerprint(config) -> dict:
    skip = {"transformers_version", "architectures", "auto_map", "_name_or_path", "dtype", "torch_dtype"}
    # through JSON, so that a fingerprint read back from run_state.json compares equal (int keys become strings)
    return json.loads(json.dumps({k: v for k, v in config.to_dict().items() if k not in skip}, default=str))


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """The checkpoints/step-N folders of a run whose `run_state.json` (written last) exists, newest first."""
    folder = Path(output_dir) / "checkpoints"
    steps = [
        (int(p.name.split("-")[1]), p)
        for p in folder.glob("step-*")
        if p.name.split("-")[1].isdigit() and (p / "run_state.json").exists()
    ]
    return [p for _, p in sorted(steps, reverse=True)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    checkpoints = complete_checkpoints(output_dir)
    return checkpoints[0] if checkpoints else None


def _check_rng_state(checkpoint: Path, rank: int):
    """Accelerate's `load_state` swallows any error reading the RNG state and goes on with other random numbers (so a
    resumed run silently stops matching the interrupted one); read it first, with the same weights-only loader,
    and make a torn or unsafe file an error. Nothing in the file is run."""
    from accelerate.utils import load
    from accelerate.utils.constants import RNG_STATE_NAME

    path = checkpoint / f"{RNG_STATE_NAME}_{rank}.pkl"
    try:
        with warnings.catch_warnings():  # torch warns about a foreign pickle protocol before refusing it: one line
            warnings.simplefilter("ignore")
            states = load(path, map_location="cpu")
    except Exception as error:  # torch raises several types for a missing, torn or unsafe file
        raise ModelError(
            f"cannot resume from {checkpoint}: the RNG state {path.name} cannot be read safely "
            f"({type(error).__name__}: {_first_line(error)}); nothing in it was run"
        ) from None
    expected = {"random_state", "numpy_random_seed", "torch_manual_seed"}
    if not isinstance(states, dict) or not expected <= set(states):
        raise ModelError(f"cannot resume from {checkpoint}: {path.name} is not an RNG state saved by Accelerate")


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def drop_tied_weights(models, weights, output_dir):
    """Accelerate's `save_state` hook: remove the weights tied to another (the LM head tied to the embeddings, as the
    model's `all_tied_weights_keys` declares; `from_pretrained` and `load_state` tie them again). Accelerate's
    safetensors writer would drop them anyway, but warns "Removed shared tensor ..." at every checkpoint."""
    for model, state in zip(models, weights):
        tied = getattr(unwrapped(model), "all_tied_weights_keys", None) or {}
        for key in list(state):
            for target, source in tied.items():
                if not key.endswith(target):
                    continue
                source_key = key[: len(key) - len(target)] + source  # keeps a wrapper's prefix ("module.")
                if source_key in state and state[source_key].data_ptr() == state[key].data_ptr():
                    del state[key]


def load_checkpoint(accelerator, candidates: list[Path], args, config, memories) -> tuple[Path, dict]:
    """Loads the first of `candidates` (newest first) that loads completely: model, optimizer, scheduler, RNG state
    and memory (each entry of the list `memories`, a fresh cache of the model, is replaced by the one saved). A
    checkpoint whose files are torn is skipped with a warning naming it (the run resumes from the one before); a
    config or run mismatch, or a torn or unsafe RNG state, is an error."""
    import logging

    from .checkpoint_files import check_checkpoint_files
    from .models import restore_memory

    rank = accelerator.process_index
    for index, checkpoint in enumerate(candidates):
        state = check_resume(checkpoint, args, config, accelerator.num_processes)
        _check_rng_state(checkpoint, rank)
        failure = None
        try:
            # every file the checkpoint was saved with (older checkpoints: the files it holds) must be there and load:
            # the line then names the file, and no file is skipped quietly
            files = state.get("files") or sorted(p.name for p in checkpoint.iterdir() if p.is_file())
            check_checkpoint_files(checkpoint, [f for f in files if f != "run_state.json"] + [f"memory_rank{rank}.pt"])
            accelerator.load_state(str(checkpoint))
            memory_file = checkpoint / f"memory_rank{rank}.pt"
            for index, saved in zip(range(len(memories)), torch.load(memory_file, weights_only=True)):
                memories[index] = restore_memory(memories[index], saved, str(memory_file))
        except ModelError as error:  # a file named by check_checkpoint_files
            failure = str(error)
        except Exception as error:  # a torn file raises whatever its reader raises (miniz, unpickling, EOF ...)
            failure = f"{type(error).__name__}: {_first_line(error)}"
        # every rank must resume from the same checkpoint
        failed = accelerator.reduce(torch.tensor(float(failure is not None), device=accelerator.device), "sum")
        if float(failed) == 0:
            return checkpoint, state
        if index + 1 == len(candidates):
            raise ModelError(
                f"cannot resume from {checkpoint}: it does not load ({failure or 'on another process'})"
                + ("; no older complete checkpoint is left" if len(candidates) > 1 else "")
            )
        logging.getLogger(__name__).warning(
            f"skipping checkpoint {checkpoint}: it does not load ({failure or 'on another process'}); "
            f"resuming from {candidates[index + 1]} instead"
        )
    raise ModelError("no checkpoint to resume from")


def check_resume_args(checkpoint: Path, args: TrainArgs) -> dict:
    """Refuses to resume from `checkpoint` with a flag that changes the trajectory of the run (every flag but the
    output, logging and evaluation ones: `resume_differences`), naming each; and a checkpoint of the loop before the
    originals' data orders (its rows and epochs differ). Returns the checkpoint's run state."""
    state = json.loads((checkpoint / "run_state.json").read_text())
    if "data_order" not in state["args"]:
        raise ModelError(
            f"cannot resume from {checkpoint}: it was written by a txv train from before --data-order, whose rows "
            "and epochs differ from today's (the run would not go on as it began); start the run again"
        )
    diffs = resume_differences(state["args"], args)
    if diffs:
        raise ModelError(f"cannot resume from {checkpoint}: the run differs: " + "; ".join(diffs))
    return state


def resume_note(checkpoint: Path, args: TrainArgs) -> str | None:
    """`resume_length_note` for the run of `checkpoint`."""
    return resume_length_note(json.loads((checkpoint / "run_state.json").read_text())["args"], args)


def check_resume(checkpoint: Path, args: TrainArgs, config, world_size: int):
    """`check_resume_args`, then the model config and the number of processes against the checkpoint's."""
    state = check_resume_args(checkpoint, args)
    saved = state["config"]
    current = config_fingerprint(config)
    diffs = [
        f"{k}={saved.get(k)!r} in the checkpoint, {current.get(k)!r} now"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]
    if diffs:
        raise ModelError(f"cannot resume from {checkpoint}: the model config differs: " + "; ".join(diffs[:4]))
    if state.get("world_size", 1) != world_size:
        raise ModelError(
            f"cannot resume from {checkpoint}: the run differs: {state.get('world_size')} processes in the "
            f"checkpoint, {world_size} now"
        )
    return state


def save_checkpoint(accelerator, output_dir: Path, step: int, args: TrainArgs, config, tokenizer, memories):
    """`accelerator.save_state` (model, optimizer, scheduler, RNG of every process) plus each rank's memory, the
    step, the config and the tokenizer, written to checkpoints/step-N. Every rank writes into
    checkpoints/.step-N.partial, which becomes step-N only when complete: a full disk or a killed run never leaves
    a torn step-N (the previous checkpoints stay, and the failure is an OSError naming the checkpoint and the
    cause)."""
    folder = output_dir / "checkpoints" / f"step-{step}"
    staging = folder.with_name(f".{folder.name}{PARTIAL_SUFFIX}")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with explained_write_errors(folder):
        try:
            accelerator.save_state(str(staging))
            torch.save([memory_state(m) for m in memories], staging / f"memory_rank{accelerator.process_index}.pt")
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                tokenizer.save_pretrained(staging / "tokenizer")
                state = {
                    "step": step,
                    "world_size": accelerator.num_processes,
                    "config": config_fingerprint(config),
                    "args": {k: v for k, v in dataclasses.asdict(args).items()},
                    # what a resume must find (every rank's files are written: the wait above)
                    "files": sorted(p.name for p in staging.iterdir() if p.is_file()),
                }
                atomic_write_bytes(
                    staging / "run_state.json", (json.dumps(state, indent=2, default=str) + "\n").encode()
                )
                replace_directory(staging, folder)
        except BaseException:
            if accelerator.is_main_process:
                shutil.rmtree(staging, ignore_errors=True)
            raise
    accelerator.wait_for_everyone()


def remove_checkpoints(output_dir: str | Path):
    shutil.rmtree(Path(output_dir) / "checkpoints", ignore_errors=True)
