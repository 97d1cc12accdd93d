"""The Accelerate training loop for causal language models of every registered variant.

One process or many (`accelerate launch`, DDP or FSDP, GPUs or CPU processes with gloo): each rank trains on its own
contiguous rows of the corpus (see `data.segment_stream`), so a Transformer-XL memory is carried across steps the way
the paper trains. Gradient accumulation splits each rank's rows into `grad_accum` chunks, each with its own memory,
which gives the same gradient as the whole batch at once. Checkpoints (`accelerator.save_state`, plus the memory and
the step) resume to the same subsequent losses as a run that was never interrupted."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ..txv_files import atomic_directory, atomic_write_bytes, explained_write_errors, folder_lock, replace_directory
from . import distributed
from .data import DataError, segment_stream
from .evaluation import evaluate_stream, summarize
from .models import (
    AUXILIARY_TERMS,
    ModelError,
    after_optimizer_step,
    build_config,
    build_model,
    check_model_source,
    check_text_variant,
    init_memory,
    load_model,
    memory_state,
    objective_forward,
    set_training_progress,
    unwrapped,
    uses_memory,
)
from .optimizers import build_optimizer, build_schedule
from .token_cache import plan_corpus

RUN_LOCK_NAME = ".txv.lock"  # in --output-dir, held by the main process for the whole run
PARTIAL_SUFFIX = ".partial"  # checkpoints/.step-N.partial: a checkpoint being written (ignored by a resume)

# Fields of the run that must not change on resume (the data order and memory layout depend on them).
RESUME_FIELDS = (
    "batch_size",
    "seg_len",
    "grad_accum",
    "seed",
    "data",
    "valid_fraction",
    "data_config",
    "train_split",
    "valid_split",
)


class JsonError(argparse.ArgumentTypeError, ValueError):
    """Bad JSON for `--extra-config` (argparse prints an ArgumentTypeError's own message; callers of the Python API
    catch it as a ValueError)."""


class JsonDict(dict):
    """A dict that parses itself from a JSON string (the type of `--extra-config` on the command line)."""

    def __init__(self, value=None):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise JsonError(f"not valid JSON ({error}): {value!r}") from None
            if not isinstance(value, dict):
                raise JsonError(f"expected a JSON object such as '{{\"clamp_len\": 400}}', got {value!r}")
        super().__init__(value or {})


def _arg(default=None, help: str = "", **metadata):
    """A TrainArgs field with its `--help` text (read by transformers.HfArgumentParser)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: JsonDict(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class TrainArgs:
    """Every setting of a training run; each field is a `txv train` flag (`--d-model`, `--resume latest`, ...)."""

    output_dir: str = _arg("txv-run", "folder for metrics.jsonl, TensorBoard logs, checkpoints/ and model/")
    data: str | None = _arg(
        None,
        "training text: a text file, a folder of text files, a saved `datasets` folder, a "
        "parquet/JSON/CSV file or folder, or a Hub dataset name (default: the embedded "
        "corpus)",
    )
    data_config: str | None = _arg(None, "the config of a --data dataset, e.g. wikitext-103-raw-v1")
    train_split: str | None = _arg(None, "the split of a --data dataset to train on (default: train)")
    valid_split: str | None = _arg(
        None,
        "the split of the dataset (--valid-data, else --data) to validate on, e.g. "
        "validation (default: --valid-data's train split, else the last "
        "--valid-fraction of --data)",
    )
    valid_data: str | None = _arg(
        None, "held-out text, any kind --data takes (default: the last --valid-fraction of --data)"
    )
    valid_fraction: float = _arg(
        0.05, "fraction of the characters held out for validation when neither --valid-data nor --valid-split is given"
    )
    text_column: str = _arg("text", "column of a dataset that holds the text (each row one line)")
    max_chars: int | None = _arg(None, "use only the first N characters of --data")
    tokenizer: str | None = _arg(
        None,
        "char (a character vocabulary of the training text), byte (the 256 byte "
        "values, as for enwik8), word (Transformer-XL's word vocabulary of the "
        "training text, <eos> at line ends), or a tokenizer folder / Hub name "
        "(AutoTokenizer). Default: --model's tokenizer with --model, else char",
    )
    vocab_min_freq: int = _arg(0, "--tokenizer word: drop words seen fewer times (they become <unk>)")
    vocab_max_size: int | None = _arg(None, "--tokenizer word: keep at most the N most frequent words")
    token_cache: str | None = _arg(
        None,
        "folder of the token cache (memory-mapped token ids, one tokenisation per "
        "data and tokenizer; default: $TXV_TOKEN_CACHE, else "
        "$HF_HOME/txv-token-cache)",
    )
    variant: str = _arg("transfo-xl", "model variant (a registered text variant, see `txv train --help`)")
    model: str | None = _arg(
        None, "start from this saved model folder or Hub repo id (and its tokenizer) instead of a new config"
    )
    d_model: int = _arg(128, "hidden size")
    n_layer: int = _arg(4, "number of layers")
    n_head: int = _arg(4, "attention heads per layer")
    d_inner: int | None = _arg(None, "feed-forward inner size (default: 4 x d-model)")
    mem_len: int = _arg(64, "memory length of the memory variants (0: no memory)")
    seg_len: int = _arg(64, "tokens per training segment")
    dropout: float = _arg(0.1, "dropout rate in [0, 1)")
    batch_size: int = _arg(16, "global batch: rows over all processes and accumulation chunks")
    grad_accum: int = _arg(1, "gradient accumulation chunks per step (each with its own memory)")
    lr: float = _arg(1e-3, "peak learning rate (after the warm-up)")
    warmup_steps: int = _arg(20, "linear warm-up steps")
    lr_schedule: Literal["cosine", "constant"] = _arg(
        "cosine", "after the warm-up: cosine decay to 0 at --max-steps, or constant (adaptive-span's schedule)"
    )
    optimizer: Literal["adamw", "adagrad"] = _arg(
        "adamw",
        "adamw (Adam with --weight-decay 0), or adagrad: adaptive-span's Adagrad, which clips each "
        "parameter tensor's gradient at --clip-norm instead of the global norm",
    )
    weight_decay: float = _arg(0.0, "AdamW weight decay of the matrices")
    clip_norm: float = _arg(
        0.25,
        "gradient-norm clipping (0: none): of all gradients together, or of each parameter "
        "tensor with --optimizer adagrad",
    )
    max_steps: int = _arg(200, "optimizer steps")
    eval_every: int = _arg(50, "validate every N steps (0: only at the end)")
    eval_batch_size: int = _arg(8, "validation rows")
    eval_segments: int | None = _arg(None, "validate on the first N segments of each row (default: all)")
    save_every: int = _arg(0, "write a checkpoint every N steps (0: only at the end)")
    resume: str | None = _arg(
        None, "'latest' (the newest complete, loadable checkpoint of --output-dir) or a checkpoint folder"
    )
    seed: int = _arg(0, "random seed")
    mixed_precision: Literal["no", "bf16", "fp16"] | None = _arg(
        None,
        "autocast precision (default: the Accelerate config's mixed_precision under `accelerate launch`, else "
        "no); under FSDP, no or bf16",
    )
    cpu: bool = _arg(False, "train on CPU even with GPUs (so do all processes when there are more than GPUs: gloo)")
    tensorboard: bool = _arg(True, "log to TensorBoard in OUTPUT_DIR/logs")
    progress: bool = _arg(True, "show a progress bar")
    save_model: bool = _arg(True, "save the final model and tokenizer to OUTPUT_DIR/model")
    extra_config: JsonDict = _arg({}, "JSON object of extra config fields, e.g. '{\"clamp_len\": 400}'")

    def __post_init__(self):
        """Every bad setting is a ValueError naming the flag, before anything is loaded or trained."""
        self.extra_config = JsonDict(self.extra_config)
        positive = (
            "d_model",
            "n_layer",
            "n_head",
            "seg_len",
            "batch_size",
            "grad_accum",
            "max_steps",
            "eval_batch_size",
        )
        optional_positive = ("d_inner", "max_chars", "eval_segments", "vocab_max_size")
        non_negative = ("mem_len", "warmup_steps", "eval_every", "save_every", "seed", "vocab_min_freq")
        for name in positive + optional_positive + non_negative:
            value = getattr(self, name)
            if value is None and name in optional_positive:
                continue
            low = 0 if name in non_negative else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DataError(f"--{_flag(name)} must be an integer >= {low}, got {value!r}")
        for name, low, high in (
            ("lr", 0.0, None),
            ("dropout", 0.0, 1.0),
            ("weight_decay", 0.0, None),
            ("clip_norm", 0.0, None),
            ("valid_fraction", 0.0, 1.0),
        ):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and value >= low and (high is None or value < high) and (name != "lr" or value > 0)
            ok = ok and (name != "valid_fraction" or value > 0)
            if not ok:
                bounds = f"in [{low}, {high})" if high is not None else ("> 0" if name == "lr" else f">= {low}")
                raise DataError(f"--{_flag(name)} must be a finite number {bounds}, got {value!r}")
        for name, choices in (("optimizer", ("adamw", "adagrad")), ("lr_schedule", ("cosine", "constant"))):
            if getattr(self, name) not in choices:
                raise DataError(f"--{_flag(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.optimizer == "adagrad" and self.weight_decay:
            raise DataError(f"--weight-decay {self.weight_decay} needs --optimizer adamw (adagrad has none)")
        if self.mixed_precision is not None and self.mixed_precision not in ("no", "bf16", "fp16"):
            raise DataError(f"--mixed-precision must be one of no, bf16, fp16, got {self.mixed_precision!r}")
        if self.tokenizer is not None and not self.tokenizer:
            raise DataError("--tokenizer must be char, byte, word or a tokenizer folder / Hub name, got ''")
        if self.tokenizer != "word" and (self.vocab_min_freq or self.vocab_max_size is not None):
            raise DataError(
                f"--vocab-min-freq / --vocab-max-size apply to --tokenizer word, not "
                f"--tokenizer {self.tokenizer or 'char (the default)'}"
            )
        if self.resume is not None and not self.resume:
            raise DataError("--resume must be 'latest' or a checkpoint folder, got an empty string")


def training_record(parts: dict[str, float]) -> dict[str, float]:
    """The logged training losses: `loss` (the objective optimised), `lm_loss` (its next-token part) with `bpc` (bits
    per token: per character with a character tokenizer) and `perplexity`, then each auxiliary term by name."""
    lm_loss = parts["lm_loss"]
    record = {
        "loss": parts["loss"],
        "lm_loss": lm_loss,
        "bpc": lm_loss / math.log(2),
        "perplexity": math.exp(min(lm_loss, 50.0)),
    }
    record.update({name: value for name, value in parts.items() if name not in ("loss", "lm_loss")})
    return record


def describe_training(record: dict) -> str:
    """One console line of a training record: the objective, its next-token part and the auxiliary terms by name."""
    terms = "".join(f", {name} {record[name]:.4g}" for name in AUXILIARY_TERMS if name in record)
    return (
        f"objective {record['loss']:.4f} (lm_loss {record['lm_loss']:.4f}: {record['bpc']:.4f} bits per token, "
        f"perplexity {record['perplexity']:.3f}{terms})"
    )


def _size_fields(args: TrainArgs) -> dict:
    return dict(
        d_model=args.d_model,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_inner=args.d_inner,
        mem_len=args.mem_len,
        seg_len=args.seg_len,
        dropout=args.dropout,
    )


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _log_path(output_dir: Path) -> Path:
    return output_dir / "metrics.jsonl"


def read_metrics(output_dir: str | Path) -> list[dict]:
    path = _log_path(Path(output_dir))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _config_fingerprint(config) -> dict:
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


def _drop_tied_weights(models, weights, output_dir):
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


def _load_checkpoint(accelerator, candidates: list[Path], args, config, memories) -> tuple[Path, dict]:
    """Loads the first of `candidates` (newest first) that loads completely: model, optimizer, scheduler, RNG state
    and memory. A checkpoint whose files are torn is skipped with a warning naming it (the run resumes from the one
    before); a config or run mismatch, or a torn or unsafe RNG state, is an error."""
    import logging

    from .checkpoint_files import check_checkpoint_files
    from .models import restore_memory

    rank = accelerator.process_index
    for index, checkpoint in enumerate(candidates):
        state = _check_resume(checkpoint, args, config, accelerator.num_processes)
        _check_rng_state(checkpoint, rank)
        failure = None
        try:
            # every file the checkpoint was saved with (older checkpoints: the files it holds) must be there and load:
            # the line then names the file, and no file is skipped quietly
            files = state.get("files") or sorted(p.name for p in checkpoint.iterdir() if p.is_file())
            check_checkpoint_files(checkpoint, [f for f in files if f != "run_state.json"] + [f"memory_rank{rank}.pt"])
            accelerator.load_state(str(checkpoint))
            memory_file = checkpoint / f"memory_rank{rank}.pt"
            for memory, saved in zip(memories, torch.load(memory_file, weights_only=True)):
                restore_memory(memory, saved, str(memory_file))
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


def _check_resume(checkpoint: Path, args: TrainArgs, config, world_size: int):
    state = json.loads((checkpoint / "run_state.json").read_text())
    saved = state["config"]
    current = _config_fingerprint(config)
    diffs = [
        f"{k}={saved.get(k)!r} in the checkpoint, {current.get(k)!r} now"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]
    if diffs:
        raise ModelError(f"cannot resume from {checkpoint}: the model config differs: " + "; ".join(diffs[:4]))
    run_diffs = [
        f"{k}={state['args'].get(k)!r} in the checkpoint, {getattr(args, k)!r} now"
        for k in RESUME_FIELDS
        if state["args"].get(k) != getattr(args, k)
    ]
    if state.get("world_size", 1) != world_size:
        run_diffs.append(f"{state.get('world_size')} processes in the checkpoint, {world_size} now")
    if run_diffs:
        raise ModelError(f"cannot resume from {checkpoint}: the run differs: " + "; ".join(run_diffs))
    return state


def _silent(message: str):
    pass


def train(args: TrainArgs, accelerator=None, on_step=None) -> dict:
    """Trains, evaluates and saves; returns {"history": [...], "eval": [...], "model_dir": ..., "config": ...}.
    `on_step(step)`, if given, is called after each optimizer step (tests use it to interrupt a run).
    The main process holds --output-dir's lock for the whole run (`hold_output_dir`)."""
    with contextlib.ExitStack() as held:
        return _train(args, accelerator, on_step, held)


def hold_output_dir(output_dir: Path, held: contextlib.ExitStack):
    """Takes the lock of `output_dir` for the run (a second run into it is refused with a line naming the first; a
    lock left by a killed run is taken over, and stderr says so), then removes the partial checkpoints a killed run
    left there."""
    output_dir.mkdir(parents=True, exist_ok=True)
    held.enter_context(folder_lock(output_dir / RUN_LOCK_NAME, "txv train", on_stale=distributed.announce))
    for partial in sorted((output_dir / "checkpoints").glob(f".step-*{PARTIAL_SUFFIX}")):
        shutil.rmtree(partial, ignore_errors=True)
        distributed.announce(f"removed the partial checkpoint {partial} (its run stopped while writing it)")


def _train(args: TrainArgs, accelerator, on_step, held: contextlib.ExitStack) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    output_dir = Path(args.output_dir)
    fsdp = distributed.fsdp_settings_from_environment()  # set by `accelerate launch` with an FSDP config
    mixed_precision = distributed.resolve_mixed_precision(args.mixed_precision, fsdp is not None)
    if accelerator is None:
        device_choice = distributed.device_choice_from_environment(args.cpu)
        log_with = None
        if args.tensorboard:
            try:
                import tensorboard  # noqa: F401

                log_with = "tensorboard"
            except ImportError:
                pass
        with distributed.hidden_from_accelerate():  # the loop shards the model itself (FSDP2), see distributed.py
            accelerator = Accelerator(
                cpu=device_choice.cpu,
                mixed_precision=mixed_precision,
                # one scheduler step per optimizer step, however many processes (the batch is global, not per process)
                step_scheduler_with_optimizer=False,
                log_with=log_with,
                project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
            )
        if device_choice.note and accelerator.is_main_process:
            distributed.announce(device_choice.note)
    if accelerator.is_main_process:  # one lock per run: the other ranks of the same run write into it too
        hold_output_dir(output_dir, held)
    world, rank = accelerator.num_processes, accelerator.process_index
    local_rows = args.batch_size // world if args.batch_size % world == 0 else None
    if local_rows is None or local_rows % args.grad_accum:
        raise DataError(
            f"batch_size ({args.batch_size}) must be divisible by processes x grad_accum ({world} x {args.grad_accum})"
        )

    candidates = []  # checkpoints to resume from, newest first
    if args.resume:
        candidates = complete_checkpoints(output_dir) if args.resume == "latest" else [Path(args.resume)]
        if not candidates or not (candidates[0] / "run_state.json").exists():
            raise DataError(f"no checkpoint to resume from at {args.resume if args.resume != 'latest' else output_dir}")
    checkpoint = candidates[0] if candidates else None
    if args.model:
        check_model_source(args.model)
    else:
        check_text_variant(args.variant)
        build_config(
            args.variant, 1 << 30, **{**_size_fields(args), **args.extra_config}
        )  # bad fields fail before any work

    # text and tokenizer (a resumed run and a run from a saved model reuse the saved tokenizer), tokenised once into
    # the token cache: rank 0 first, then the other ranks map the same files
    tokenizer_source = checkpoint / "tokenizer" if checkpoint else args.model
    # every rank: bad data fails everywhere before anyone waits
    plan = plan_corpus(args, tokenizer_source, resumed=checkpoint is not None)
    with accelerator.main_process_first():
        main = accelerator.is_main_process
        corpus = plan.prepare(
            warn=distributed.announce if main else _silent,
            inform=distributed.announce if main and args.progress else None,
        )
    tokenizer = corpus.tokenizer
    train_stream = segment_stream(
        corpus.train_ids, args.batch_size, args.seg_len, rank, world, name="the training text"
    )
    valid_stream = segment_stream(
        corpus.valid_ids, args.eval_batch_size, args.seg_len, rank, world, name="the validation text"
    )

    # model
    set_seed(args.seed)
    if args.model:
        model = load_model(args.model)
        config = model.config
        if config.vocab_size < len(tokenizer):
            raise ModelError(
                f"the tokenizer has {len(tokenizer)} tokens but {args.model} has vocab_size {config.vocab_size}"
            )
    else:
        config = build_config(args.variant, len(tokenizer), **{**_size_fields(args), **args.extra_config})
        config.eos_token_id = tokenizer.eos_token_id
        model = build_model(config)
    if checkpoint:
        _check_resume(checkpoint, args, config, world)  # a mismatch is refused before anything is built
    sharded = None
    if fsdp is not None:  # shard before the optimizer is built: it must hold the sharded parameters
        sharded = distributed.ShardedModel(model, fsdp, accelerator.device, world, mixed_precision)
        model = sharded.module
        distributed.announce(sharded.describe(rank, world, accelerator.device))

    optimizer = build_optimizer(args.optimizer, model, args.lr, args.weight_decay, args.clip_norm)
    scheduler = build_schedule(args.lr_schedule, optimizer, args.warmup_steps, args.max_steps)
    if sharded is None:
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:  # no DDP wrapper; the model and optimizer shards are checkpointed by the hooks below
        scheduler = accelerator.prepare(scheduler)
    accelerator.register_save_state_pre_hook(_drop_tied_weights)
    distributed.register_checkpoint_hooks(accelerator, sharded, optimizer)

    chunk_rows = local_rows // args.grad_accum
    memories = [init_memory(model, chunk_rows) for _ in range(args.grad_accum)]
    progress = None
    start_step = 0
    if checkpoint:
        checkpoint, state = _load_checkpoint(accelerator, candidates, args, config, memories)
        start_step = state["step"]
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        history = [m for m in read_metrics(output_dir) if m["step"] <= start_step] if checkpoint else []
        _log_path(output_dir).write_text("".join(json.dumps(m) + "\n" for m in history))
    if accelerator.trackers == [] and accelerator.log_with:
        accelerator.init_trackers(
            "txv", config={k: v for k, v in dataclasses.asdict(args).items() if isinstance(v, (int, float, str, bool))}
        )

    def log(record: dict):
        if accelerator.is_main_process:
            with _log_path(output_dir).open("a") as f:
                f.write(json.dumps(record) + "\n")
        accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def run_eval(step: int, train_record: dict | None = None) -> dict:
        model.eval()
        nll, count = evaluate_stream(model, valid_stream, args.eval_segments)
        totals = accelerator.reduce(torch.tensor([nll, float(count)], device=accelerator.device), reduction="sum")
        result = summarize(float(totals[0]), int(totals[1]))
        model.train()
        log(
            {
                "step": step,
                "split": "valid",
                "valid_loss": result["nats"],
                "valid_bpc": result["bpc"],
                "valid_perplexity": result["perplexity"],
            }
        )
        if accelerator.is_main_process and step != args.max_steps:  # the final one is printed by the caller
            line = f"step {step}: validation {result['bpc']:.4f} bits per token, perplexity {result['perplexity']:.3f}"
            if train_record is not None:
                line += f"; training {describe_training(train_record)}"
            (progress.write if progress else print)(line)  # tqdm.write keeps the progress bar intact
        return result

    if args.progress and accelerator.is_local_main_process:
        from tqdm.auto import tqdm

        progress = tqdm(total=args.max_steps, initial=start_step, desc=f"train {config.model_type}", dynamic_ncols=True)
    model.train()
    evals = []
    record = None  # the last training record (None when a resumed run has no step left)
    for step in range(start_step + 1, args.max_steps + 1):
        step_started = time.perf_counter()
        inputs, targets = train_stream.segment(step - 1)
        inputs, targets = inputs.to(accelerator.device), targets.to(accelerator.device)
        set_training_progress(model, (step - 1) / args.max_steps)  # a schedule of the objective (Al-Rfou's)
        totals = {}  # the objective, its next-token part and each auxiliary term, averaged over the chunks
        for chunk in range(args.grad_accum):
            rows = slice(chunk * chunk_rows, (chunk + 1) * chunk_rows)
            sync = accelerator.no_sync(model) if chunk < args.grad_accum - 1 else contextlib.nullcontext()
            with sync, accelerator.autocast():
                losses, memories[chunk] = objective_forward(model, inputs[rows], targets[rows], memories[chunk])
                accelerator.backward(losses.loss / args.grad_accum)
            for name, value in losses.detached().items():
                totals[name] = totals.get(name, 0.0) + value.float() / args.grad_accum
        grad_norm = None
        if args.clip_norm > 0 and args.optimizer != "adagrad":  # adagrad clips each parameter in its step
            grad_norm = (
                sharded.clip_grad_norm_(args.clip_norm)
                if sharded
                else accelerator.clip_grad_norm_(model.parameters(), args.clip_norm)
            )
        optimizer.step()
        after_optimizer_step(model)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        names = list(totals)  # the same on every rank: the same model and step
        means = accelerator.reduce(torch.stack([totals[name] for name in names]), reduction="mean")
        parts = {name: float(value) for name, value in zip(names, means)}
        if not math.isfinite(parts["loss"]):
            raise RuntimeError(f"the training loss is {parts['loss']} at step {step}: lower --lr or check the data")
        record = {"step": step, "split": "train", **training_record(parts), "lr": scheduler.get_last_lr()[0]}
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        # the global batch's tokens over the step's wall time (data, forward, backward, optimiser, the loss's sync)
        record["tokens_per_second"] = args.batch_size * args.seg_len / (time.perf_counter() - step_started)
        log(record)
        if progress:
            progress.update(1)
            progress.set_postfix(
                {
                    name: f"{value:.3g}"
                    for name, value in record.items()
                    if name in ("loss", "lm_loss", "bpc", *AUXILIARY_TERMS)
                }
            )
        if on_step is not None:
            on_step(step)
        if args.eval_every and step % args.eval_every == 0 and step != args.max_steps:
            evals.append(run_eval(step, record))
        if args.save_every and step % args.save_every == 0 and step != args.max_steps:
            save_checkpoint(accelerator, output_dir, step, args, config, tokenizer, memories)
    if progress:
        progress.close()
    evals.append(run_eval(args.max_steps))
    save_checkpoint(accelerator, output_dir, args.max_steps, args, config, tokenizer, memories)

    model_dir = output_dir / "model"
    if args.save_model:
        state_dict = sharded.full_state_dict() if sharded else accelerator.get_state_dict(model)
        if accelerator.is_main_process:  # the whole folder or nothing: a full disk leaves the previous model/
            with atomic_directory(model_dir, keep_existing=False) as staging:
                (sharded or accelerator.unwrap_model(model)).save_pretrained(staging, state_dict=state_dict)
                tokenizer.save_pretrained(staging)
                (staging / "eval_results.json").write_text(
                    json.dumps(
                        {
                            "valid_bpc": evals[-1]["bpc"],
                            "valid_perplexity": evals[-1]["perplexity"],
                            "valid_tokens": evals[-1]["tokens"],
                            "train_steps": args.max_steps,
                            "seg_len": args.seg_len,
                            "batch_size": args.batch_size,
                        },
                        indent=2,
                    )
                    + "\n"
                )
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return {
        "history": read_metrics(output_dir) if accelerator.is_main_process else [],
        "eval": evals,
        "model_dir": str(model_dir),
        "config": config,
        "model": accelerator.unwrap_model(model),
        "tokenizer": tokenizer,
        "uses_memory": uses_memory(model),
        "last_training": record,
    }


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
                    "config": _config_fingerprint(config),
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
