"""The Accelerate training loop for causal language models of every registered variant.

One process or many (`accelerate launch`, DDP or FSDP, GPUs or CPU processes with gloo): each rank trains on its own
contiguous rows of the corpus (see `data.segment_stream`), so a Transformer-XL memory is carried across steps the way
the paper trains. Gradient accumulation splits each rank's rows into `grad_accum` chunks, each with its own memory,
which gives the same gradient as the whole batch at once. Checkpoints (`accelerator.save_state`, plus the memory and
the step) resume to the same subsequent losses as a run that was never interrupted."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import distributed
from .data import DataError, build_char_tokenizer, encode, load_text, segment_stream, split_text
from .evaluation import evaluate_stream, summarize
from .models import ModelError, build_config, build_model, init_memory, lm_forward, load_model, uses_memory

# Fields of the run that must not change on resume (the data order and memory layout depend on them).
RESUME_FIELDS = ("batch_size", "seg_len", "grad_accum", "seed", "data", "valid_fraction")


@dataclass
class TrainArgs:
    output_dir: str = "txv-run"
    data: str | None = None  # text file, folder of text files or saved `datasets` folder; None: embedded corpus
    valid_data: str | None = None  # held-out text; None: the last `valid_fraction` of `data`
    valid_fraction: float = 0.05
    text_column: str = "text"
    max_chars: int | None = None  # use only the first max_chars characters of `data`
    variant: str = "transfo-xl"
    model: str | None = None  # start from this saved model (and its tokenizer) instead of a new config
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    d_inner: int | None = None
    mem_len: int = 64
    seg_len: int = 64
    dropout: float = 0.1
    batch_size: int = 16  # global: over all processes and accumulation chunks
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0
    clip_norm: float = 0.25
    max_steps: int = 200
    eval_every: int = 50
    eval_batch_size: int = 8
    eval_segments: int | None = None  # evaluate on the first N segments of each validation row (None: all)
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    resume: str | None = None  # "latest" or a checkpoint folder
    seed: int = 0
    mixed_precision: str | None = None  # "no", "bf16" (or "fp16" without FSDP); None: the Accelerate config's, else "no"
    cpu: bool = False  # train on CPU even with GPUs (CPU processes use gloo; so do more processes than GPUs)
    tensorboard: bool = True
    progress: bool = True
    save_model: bool = True
    extra_config: dict = field(default_factory=dict)


def _log_path(output_dir: Path) -> Path:
    return output_dir / "metrics.jsonl"


def read_metrics(output_dir: str | Path) -> list[dict]:
    path = _log_path(Path(output_dir))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _config_fingerprint(config) -> dict:
    skip = {"transformers_version", "architectures", "auto_map", "_name_or_path", "dtype", "torch_dtype"}
    # through JSON, so that a fingerprint read back from run_state.json compares equal (int keys become strings)
    return json.loads(json.dumps({k: v for k, v in config.to_dict().items() if k not in skip}, default=str))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    folder = Path(output_dir) / "checkpoints"
    steps = sorted((int(p.name.split("-")[1]), p) for p in folder.glob("step-*") if (p / "run_state.json").exists())
    return steps[-1][1] if steps else None


def _memory_state(memories):
    return [None if m is None or m.memories is None else (m.memories, m.memory_mask, m.seen_tokens) for m in memories]


def _restore_memory(memories, states):
    for memory, state in zip(memories, states):
        if memory is not None and state is not None:
            memory._set([t for t in state[0]], state[1])
            memory.seen_tokens = state[2]


def _check_resume(checkpoint: Path, args: TrainArgs, config, world_size: int):
    state = json.loads((checkpoint / "run_state.json").read_text())
    saved = state["config"]
    current = _config_fingerprint(config)
    diffs = [f"{k}={saved.get(k)!r} in the checkpoint, {current.get(k)!r} now" for k in sorted(set(saved) | set(current))
             if saved.get(k) != current.get(k)]
    if diffs:
        raise ModelError(f"cannot resume from {checkpoint}: the model config differs: " + "; ".join(diffs[:4]))
    run_diffs = [f"{k}={state['args'].get(k)!r} in the checkpoint, {getattr(args, k)!r} now" for k in RESUME_FIELDS
                 if state["args"].get(k) != getattr(args, k)]
    if state.get("world_size", 1) != world_size:
        run_diffs.append(f"{state.get('world_size')} processes in the checkpoint, {world_size} now")
    if run_diffs:
        raise ModelError(f"cannot resume from {checkpoint}: the run differs: " + "; ".join(run_diffs))
    return state


def train(args: TrainArgs, accelerator=None) -> dict:
    """Trains, evaluates and saves; returns {"history": [...], "eval": [...], "model_dir": ..., "config": ...}."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from transformers import AutoTokenizer, get_cosine_schedule_with_warmup

    output_dir = Path(args.output_dir)
    if args.batch_size < 1 or args.seg_len < 1 or args.max_steps < 1 or args.grad_accum < 1:
        raise DataError("batch_size, seg_len, max_steps and grad_accum must be positive")
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
    world, rank = accelerator.num_processes, accelerator.process_index
    local_rows = args.batch_size // world if args.batch_size % world == 0 else None
    if local_rows is None or local_rows % args.grad_accum:
        raise DataError(
            f"batch_size ({args.batch_size}) must be divisible by processes x grad_accum ({world} x {args.grad_accum})"
        )

    checkpoint = None
    if args.resume:
        checkpoint = latest_checkpoint(output_dir) if args.resume == "latest" else Path(args.resume)
        if checkpoint is None or not (checkpoint / "run_state.json").exists():
            raise DataError(f"no checkpoint to resume from at {args.resume if args.resume != 'latest' else output_dir}")

    # text and tokenizer (a resumed run and a run from a saved model reuse the saved tokenizer)
    text = load_text(args.data, args.text_column)
    if args.max_chars:
        text = text[: args.max_chars]
    if args.valid_data:
        train_text, valid_text = text, load_text(args.valid_data, args.text_column)
    else:
        train_text, valid_text = split_text(text, args.valid_fraction)
    tokenizer_source = checkpoint / "tokenizer" if checkpoint else args.model
    if tokenizer_source:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
        except (OSError, ValueError) as error:
            raise ModelError(f"could not load the tokenizer from {tokenizer_source}: {str(error).splitlines()[0]}") from None
    else:
        tokenizer = build_char_tokenizer(train_text)
    train_tokens, valid_tokens = encode(tokenizer, train_text), encode(tokenizer, valid_text)
    train_stream = segment_stream(train_tokens, args.batch_size, args.seg_len, rank, world, name="the training text")
    valid_stream = segment_stream(valid_tokens, args.eval_batch_size, args.seg_len, rank, world, name="the validation text")

    # model
    set_seed(args.seed)
    if args.model:
        model = load_model(args.model)
        config = model.config
        if config.vocab_size < len(tokenizer):
            raise ModelError(f"the tokenizer has {len(tokenizer)} tokens but {args.model} has vocab_size {config.vocab_size}")
    else:
        config = build_config(
            args.variant, len(tokenizer), d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
            d_inner=args.d_inner, mem_len=args.mem_len, seg_len=args.seg_len, dropout=args.dropout, **args.extra_config,
        )
        config.eos_token_id = tokenizer.eos_token_id
        model = build_model(config)
    state = _check_resume(checkpoint, args, config, world) if checkpoint else None
    sharded = None
    if fsdp is not None:  # shard before the optimizer is built: it must hold the sharded parameters
        sharded = distributed.ShardedModel(model, fsdp, accelerator.device, world, mixed_precision)
        model = sharded.module
        distributed.announce(sharded.describe(rank, world, accelerator.device))

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )
    scheduler = get_cosine_schedule_with_warmup(optimizer, args.warmup_steps, args.max_steps)
    if sharded is None:
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    else:  # no DDP wrapper; the model and optimizer shards are checkpointed by the hooks below
        scheduler = accelerator.prepare(scheduler)
    distributed.register_checkpoint_hooks(accelerator, sharded, optimizer)

    chunk_rows = local_rows // args.grad_accum
    memories = [init_memory(model, chunk_rows) for _ in range(args.grad_accum)]
    start_step = 0
    if checkpoint:
        accelerator.load_state(str(checkpoint))
        start_step = state["step"]
        _restore_memory(memories, torch.load(checkpoint / f"memory_rank{rank}.pt", weights_only=True))
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        history = [m for m in read_metrics(output_dir) if m["step"] <= start_step] if checkpoint else []
        _log_path(output_dir).write_text("".join(json.dumps(m) + "\n" for m in history))
    if accelerator.trackers == [] and accelerator.log_with:
        accelerator.init_trackers("txv", config={k: v for k, v in dataclasses.asdict(args).items()
                                                 if isinstance(v, (int, float, str, bool))})

    def log(record: dict):
        if accelerator.is_main_process:
            with _log_path(output_dir).open("a") as f:
                f.write(json.dumps(record) + "\n")
        accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def run_eval(step: int) -> dict:
        model.eval()
        nll, count = evaluate_stream(model, valid_stream, args.eval_segments)
        totals = accelerator.reduce(torch.tensor([nll, float(count)], device=accelerator.device), reduction="sum")
        result = summarize(float(totals[0]), int(totals[1]))
        model.train()
        log({"step": step, "split": "valid", "valid_loss": result["nats"], "valid_bpc": result["bpc"],
             "valid_perplexity": result["perplexity"]})
        return result

    kill_at = int(os.environ.get("TXV_TEST_KILL_AT_STEP", "0"))  # tests: simulates a crash (SIGKILL) mid-run
    progress = None
    if args.progress and accelerator.is_local_main_process:
        from tqdm.auto import tqdm

        progress = tqdm(total=args.max_steps, initial=start_step, desc=f"train {config.model_type}", dynamic_ncols=True)
    model.train()
    evals = []
    for step in range(start_step + 1, args.max_steps + 1):
        inputs, targets = train_stream.segment(step - 1)
        inputs, targets = inputs.to(accelerator.device), targets.to(accelerator.device)
        total = torch.zeros((), device=accelerator.device)
        for chunk in range(args.grad_accum):
            rows = slice(chunk * chunk_rows, (chunk + 1) * chunk_rows)
            sync = accelerator.no_sync(model) if chunk < args.grad_accum - 1 else _nullcontext()
            with sync, accelerator.autocast():
                loss, memories[chunk] = lm_forward(model, inputs[rows], targets[rows], memories[chunk])
                accelerator.backward(loss / args.grad_accum)
            total += loss.detach() / args.grad_accum
        grad_norm = None
        if args.clip_norm > 0:
            grad_norm = (sharded.clip_grad_norm_(args.clip_norm) if sharded
                         else accelerator.clip_grad_norm_(model.parameters(), args.clip_norm))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        mean_loss = float(accelerator.reduce(total, reduction="mean"))
        if not math.isfinite(mean_loss):
            raise RuntimeError(f"the training loss is {mean_loss} at step {step}: lower --lr or check the data")
        record = {"step": step, "split": "train", "loss": mean_loss, "bpc": mean_loss / math.log(2),
                  "lr": scheduler.get_last_lr()[0]}
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        log(record)
        if progress:
            progress.update(1)
            progress.set_postfix(loss=f"{mean_loss:.3f}", bpc=f"{mean_loss / math.log(2):.3f}")
        if kill_at and step == kill_at:
            os.kill(os.getpid(), 9)
        if args.eval_every and step % args.eval_every == 0 and step != args.max_steps:
            evals.append(run_eval(step))
        if args.save_every and step % args.save_every == 0 and step != args.max_steps:
            save_checkpoint(accelerator, output_dir, step, args, config, tokenizer, memories)
    if progress:
        progress.close()
    evals.append(run_eval(args.max_steps))
    save_checkpoint(accelerator, output_dir, args.max_steps, args, config, tokenizer, memories)

    model_dir = output_dir / "model"
    if args.save_model:
        state_dict = sharded.full_state_dict() if sharded else accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            (sharded or accelerator.unwrap_model(model)).save_pretrained(model_dir, state_dict=state_dict)
            tokenizer.save_pretrained(model_dir)
            (model_dir / "eval_results.json").write_text(json.dumps(
                {"valid_bpc": evals[-1]["bpc"], "valid_perplexity": evals[-1]["perplexity"],
                 "valid_tokens": evals[-1]["tokens"], "train_steps": args.max_steps, "seg_len": args.seg_len,
                 "batch_size": args.batch_size}, indent=2) + "\n")
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
    }


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def save_checkpoint(accelerator, output_dir: Path, step: int, args: TrainArgs, config, tokenizer, memories):
    """`accelerator.save_state` (model, optimizer, scheduler, RNG of every process) plus each rank's memory, the
    step, the config and the tokenizer, written to checkpoints/step-N."""
    folder = output_dir / "checkpoints" / f"step-{step}"
    accelerator.save_state(str(folder))
    torch.save(_memory_state(memories), folder / f"memory_rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        tokenizer.save_pretrained(folder / "tokenizer")
        state = {"step": step, "world_size": accelerator.num_processes, "config": _config_fingerprint(config),
                 "args": {k: v for k, v in dataclasses.asdict(args).items()}}
        (folder / "run_state.json").write_text(json.dumps(state, indent=2, default=str) + "\n")
    accelerator.wait_for_everyone()


def remove_checkpoints(output_dir: str | Path):
    shutil.rmtree(Path(output_dir) / "checkpoints", ignore_errors=True)
