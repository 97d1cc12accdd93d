"""The Accelerate training loop for causal language models of every registered variant.

One process or many (`accelerate launch`, DDP or FSDP, GPUs or CPU processes with gloo): each rank trains on its own
contiguous rows of the corpus (see `data.segment_stream`), so a Transformer-XL memory is carried across steps the way
the paper trains. Gradient accumulation splits each rank's rows into `grad_accum` chunks, each with its own memory,
which gives the same gradient as the whole batch at once. Checkpoints (`accelerator.save_state`, plus the memory and
the step) resume to the same subsequent losses as a run that was never interrupted."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import torch

from . import distributed
from .arguments import TrainArgs
from .checkpoints import (
    PARTIAL_SUFFIX,
    check_resume,
    check_resume_args,
    complete_checkpoints,
    drop_tied_weights,
    load_checkpoint,
    resume_note,
    save_checkpoint,
)
from .data import DataError, segment_stream
from .evaluation import evaluate_stream, summarize
from .folder_lock import folder_lock, locked_atomic_directory
from .models import (
    AUXILIARY_TERMS,
    ModelError,
    after_optimizer_step,
    evaluation_memory,
    init_memory,
    leaves_parameters_unused,
    lengthened_memory,
    objective_forward,
    set_training_progress,
    uses_memory,
)
from .plan import announce_changes, build_run_model, build_run_optimizer, plan_run_flags
from .token_cache import plan_corpus

RUN_LOCK_NAME = ".txv.lock"  # in --output-dir, held by the main process for the whole run


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


def _log_path(output_dir: Path) -> Path:
    return output_dir / "metrics.jsonl"


def read_metrics(output_dir: str | Path) -> list[dict]:
    path = _log_path(Path(output_dir))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


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


# torch.compile keeps this many graphs per function before running it eagerly: a training segment, its memory
# filling up (one graph per memory length until mem_len), evaluation (another mode, segment and memory length), the
# shorter last segment of a row: more than its default 8
COMPILE_RECOMPILE_LIMIT = 32


def compile_model(model):
    """`--compile`: compiles the model's call in place (`nn.Module.compile`: the same module, parameters and state
    dict), so each training segment is one graph, forward and backward, the memory an input. Returns the context
    the run is held in: the recompile limit raised to `COMPILE_RECOMPILE_LIMIT`. (Not with FSDP: refused before.)"""
    model.compile()
    return torch._dynamo.config.patch(
        recompile_limit=max(torch._dynamo.config.recompile_limit, COMPILE_RECOMPILE_LIMIT)
    )


def _train(args: TrainArgs, accelerator, on_step, held: contextlib.ExitStack) -> dict:
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    output_dir = Path(args.output_dir)
    fsdp = distributed.fsdp_settings_from_environment()  # set by `accelerate launch` with an FSDP config
    mixed_precision = distributed.resolve_mixed_precision(args.mixed_precision, fsdp is not None)
    if args.compile and fsdp is not None:
        raise ModelError("--compile is not tested with FSDP: drop --compile or the FSDP config")
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
    # every flag is applied, refused or equal to the model's: checked on the config before any work
    flag_plan = plan_run_flags(args)
    if checkpoint:
        check_resume_args(checkpoint, args)
    if accelerator.is_main_process:
        announce_changes(args, flag_plan.changes + ([resume_note(checkpoint, args)] if checkpoint else []))

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
        corpus.train_ids,
        args.batch_size,
        args.seg_len,
        rank,
        world,
        name="the training text",
        order=args.data_order,
        seed=args.seed,
    )
    eval_seg_len = args.eval_seg_len or args.seg_len
    valid_stream = segment_stream(
        corpus.valid_ids, args.eval_batch_size, eval_seg_len, rank, world, "the validation text", args.data_order
    )

    model, config = build_run_model(args, flag_plan, tokenizer)
    extra_eval_memory = evaluation_memory(model, args.seg_len, eval_seg_len)
    if checkpoint:
        check_resume(checkpoint, args, config, world)  # a mismatch is refused before anything is built
    sharded = None
    if fsdp is not None:  # shard before the optimizer is built: it must hold the sharded parameters
        sharded = distributed.ShardedModel(model, fsdp, accelerator.device, world, mixed_precision)
        model = sharded.module
        distributed.announce(sharded.describe(rank, world, accelerator.device))

    if args.compile:
        held.enter_context(compile_model(model))
    optimizer, scheduler = build_run_optimizer(args, model)
    if sharded is None:
        if leaves_parameters_unused(model) and accelerator.ddp_handler is None:
            # a tail cluster absent from a rank's rows leaves its parameters out of that rank's graph; DDP must then
            # look for them (and leaves a parameter unused on every rank without a gradient, as one process would)
            from accelerate.utils import DistributedDataParallelKwargs

            accelerator.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=True)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:  # no DDP wrapper; the model and optimizer shards are checkpointed by the hooks below
        scheduler = accelerator.prepare(scheduler)
    accelerator.register_save_state_pre_hook(drop_tied_weights)
    distributed.register_checkpoint_hooks(accelerator, sharded, optimizer)

    chunk_rows = local_rows // args.grad_accum
    memories = [init_memory(model, chunk_rows) for _ in range(args.grad_accum)]
    progress = None
    start_step = 0
    if checkpoint:
        checkpoint, state = load_checkpoint(accelerator, candidates, args, config, memories)
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
        with lengthened_memory(model, extra_eval_memory):
            nll, count = evaluate_stream(model, valid_stream, args.eval_segments)
        # in float64: the sum of a whole text's nats keeps its digits
        sums = torch.tensor([nll, float(count)], dtype=torch.float64, device=accelerator.device)
        totals = accelerator.reduce(sums, reduction="sum")
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
        segment = train_stream.plan(step - 1)
        if segment.fresh_memory:  # a new pass over the rows (an epoch): the memory starts afresh, as the original's
            memories = [init_memory(model, chunk_rows) for _ in range(args.grad_accum)]
        inputs, targets = train_stream.read(segment)
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
                totals[name] = totals.get(name, 0.0) + value.double() / args.grad_accum  # all digits of float64
        grad_norm = None
        if args.clip_norm > 0 and args.optimizer != "adagrad":  # adagrad clips each parameter in its step
            grad_norm = (
                sharded.clip_grad_norm_(args.clip_norm)
                if sharded
                else accelerator.clip_grad_norm_(model.parameters(), args.clip_norm)
            )
        step_lr = optimizer.param_groups[0]["lr"]  # the rate this step runs at
        optimizer.step()
        after_optimizer_step(model)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        names = list(totals)  # the same on every rank: the same model and step
        means = accelerator.reduce(torch.stack([totals[name] for name in names]), reduction="mean")
        parts = {name: float(value) for name, value in zip(names, means)}
        if not math.isfinite(parts["loss"]):
            raise RuntimeError(f"the training loss is {parts['loss']} at step {step}: lower --lr or check the data")
        record = {"step": step, "split": "train", **training_record(parts), "lr": step_lr}
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        # the global batch's tokens over the step's wall time (data, forward, backward, optimiser, the loss's sync)
        record["tokens_per_second"] = args.batch_size * segment.length / (time.perf_counter() - step_started)
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
            with locked_atomic_directory(model_dir, keep_existing=False) as staging:
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
