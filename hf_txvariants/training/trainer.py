"""`Trainer` for memory models: transformers 5 removed `TrainingArguments.past_index`, the only way Trainer carried a
Transformer-XL memory between steps. `MemoryTrainer` keeps the memory itself: the training memory is passed to every
training step and replaced by the one the model returns; evaluation starts from an empty memory of its own (and leaves
the training memory untouched). Checkpoints carry the training memory (`txv_memory_rank<N>.pt` next to Trainer's RNG
state), so `train(resume_from_checkpoint=...)` continues with the same losses as a run never interrupted.
`OrderedSegmentSampler` reads the examples in order, so with a dataset made by
`segment_dataset` each batch continues the rows of the previous one. Models without memory train as with `Trainer`."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from pathlib import Path

import torch
from torch.utils.data import Sampler
from transformers import Trainer

from ..txv_compat import output_cache
from .callbacks import add_objective_callbacks
from .models import (
    ModelError,
    init_memory,
    memory_batch_size,
    memory_state,
    restore_memory,
    training_losses,
    uses_memory,
)

logger = logging.getLogger(__name__)
MEMORY_FILE = "txv_memory_rank{rank}.pt"
SEGMENT_COLUMNS = ("shift_labels", "fresh_memory")  # what a `segment_dataset` example holds besides input_ids


class OrderedSegmentSampler(Sampler):
    """Indices 0..n-1 in order, cut to a whole number of batches (a partial batch would break the rows' memory).
    Trainer's own samplers shuffle or deal round-robin; `SequentialSampler` keeps a last partial batch, and
    `drop_last` would drop it only at the DataLoader, after Trainer has sized the epoch, so this stays."""

    def __init__(self, data_source, batch_size: int = 1):
        self.length = (len(data_source) // batch_size) * batch_size

    def __iter__(self):
        return iter(range(self.length))

    def __len__(self):
        return self.length


class MemoryTrainer(Trainer):
    """A `Trainer` that carries a memory across steps (the XL family's `MemoryCache`, the original adaptive-span
    model's `SpanCache`) and resets it at evaluation, and optimises each variant's own objective.

    Give it a dataset from `segment_dataset(tokens, per_device_batch_size, seg_len)` (one process).
    - The training loss is the model's `outputs.loss`: the next-token loss plus the variant's auxiliary terms (span
      penalty, ponder cost, Al-Rfou's intermediate and future-target losses); Al-Rfou's schedule of intermediate
      losses is driven by a `TrainingProgressCallback` and adaptive spans are clamped after each optimiser step by a
      `SpanClampCallback` (each added unless present; a no-op for models without the schedule or spans). Each
      training log line adds `lm_loss` (the next-token part) and every auxiliary term by name, averaged since the
      last log.
    - Evaluation reports the next-token part as `<prefix>_loss`, with `<prefix>_bpc` (bits per token: per character
      for a character tokenizer) and `<prefix>_perplexity`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_memory = None
        self.eval_memory = None
        self._objective_sums: dict[str, float] = {}
        self._objective_count = 0
        add_objective_callbacks(self)
        if self.args.world_size > 1 and uses_memory(self.model):
            raise ValueError(
                "MemoryTrainer carries memory on one process only (Trainer deals batches to processes round-robin, "
                "which breaks the rows' order); use examples/train_lm.py (Accelerate) for multi-process training"
            )

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """Trainer's `train`; a resume first checks that every file the checkpoint's resume reads is there and loads
        (Trainer would go on without a missing optimizer.pt, scheduler.pt or RNG state, saying nothing)."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)  # None: Trainer's own error follows
        if isinstance(checkpoint, (str, os.PathLike)):
            self.check_checkpoint(Path(checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def check_checkpoint(self, checkpoint: Path) -> None:
        """The files Trainer and this class read on resume: weights, optimizer, scheduler, trainer state, this
        process's RNG state and (memory models) its training memory. training_args.bin is not among them: Trainer
        never reads it back (the arguments are the ones this Trainer was given)."""
        from .checkpoint_files import check_checkpoint_files

        rank = self.args.process_index
        required = [
            ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json"),
            "optimizer.pt",
            "scheduler.pt",
            "trainer_state.json",
            "rng_state.pth" if self.args.world_size == 1 else f"rng_state_{rank}.pth",
        ]
        if uses_memory(self.model):
            required.append(MEMORY_FILE.format(rank=rank))
        try:
            check_checkpoint_files(checkpoint, required)
        except ModelError as error:
            raise ModelError(f"cannot resume from {checkpoint}: {error}") from None

    def _set_signature_columns_if_needed(self):
        """Trainer keeps only the columns the model's forward names; a `segment_dataset` example's targets come as
        `shift_labels` (the forward's **kwargs) and its `fresh_memory` is this class's own: both are kept."""
        super()._set_signature_columns_if_needed()
        self._signature_columns += [name for name in SEGMENT_COLUMNS if name not in self._signature_columns]

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return OrderedSegmentSampler(dataset, self._train_batch_size)

    def _get_eval_sampler(self, eval_dataset):
        return OrderedSegmentSampler(eval_dataset, self.args.eval_batch_size)

    def _memory_for(self, model, batch_size: int, training: bool):
        memory = self.train_memory if training else self.eval_memory
        if memory is None or (memory.batch_size is not None and memory.batch_size != batch_size):
            memory = init_memory(model, batch_size)
        return memory

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        training = model.training
        inputs = dict(inputs)
        fresh = inputs.pop("fresh_memory", None)  # a new pass over the rows (`segment_dataset(..., steps=N)`)
        if uses_memory(model):
            if training and fresh is not None and bool(fresh.any()):
                self.train_memory = None  # it starts afresh, as in `txv train`
            memory = self._memory_for(model, inputs["input_ids"].shape[0], training)
            # only the loss is needed: without the logits an adaptive softmax evaluates only the targets' clusters
            head_options = getattr(self.accelerator.unwrap_model(model), "head_options", ())
            logits = {"return_logits": False} if not return_outputs and "return_logits" in head_options else {}
            outputs = model(**inputs, cache=memory, use_cache=True, **logits)
            if training:
                self.train_memory = output_cache(outputs)
            else:
                self.eval_memory = output_cache(outputs)
            loss = outputs.loss
        else:
            # evaluation: the mean over the predicted targets (Trainer's num_items_in_batch also counts each row's
            # last label, which the model never predicts)
            loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch if training else None)
        if outputs.get("loss") is not None:
            parts = training_losses(outputs)
            if training:
                self._objective_count += 1
                for name, value in parts.detached().items():
                    if name != "loss":
                        self._objective_sums[name] = self._objective_sums.get(name, 0.0) + float(value)
            else:
                loss = parts.lm_loss  # evaluation reports the next-token part
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """A training log (it has `loss`, the objective) also gets `lm_loss` and the auxiliary terms since the last."""
        if "loss" in logs and self._objective_count:
            logs = {**logs, **{name: total / self._objective_count for name, total in self._objective_sums.items()}}
            self._objective_sums, self._objective_count = {}, 0
        super().log(logs, *args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        if not uses_memory(model) and "shift_labels" not in inputs:  # Trainer finds only `labels`
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            loss = self.compute_loss(model, inputs).detach()
        return loss, None, None

    # Checkpoints: the memory is saved and restored with the RNG state (Trainer calls these two hooks exactly when a
    # checkpoint is written and when a resumed run reaches the step it was saved at).
    def _memory_file(self, checkpoint: str) -> str:
        return os.path.join(checkpoint, MEMORY_FILE.format(rank=self.args.process_index))

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if uses_memory(self.model):
            torch.save([memory_state(self.train_memory)], self._memory_file(output_dir))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is None or not uses_memory(self.model):
            return
        path = self._memory_file(checkpoint)
        if not os.path.isfile(path):  # (`train` checked it first; a caller of this hook alone meets it here)
            raise ModelError(f"cannot resume from {checkpoint}: it has no training memory {os.path.basename(path)}")
        try:
            (state,) = torch.load(path, weights_only=True)
        except Exception as error:  # torch raises several types for a torn or unsafe file
            raise ModelError(f"cannot read the training memory {path}: {str(error).splitlines()[0]}") from None
        self.train_memory = None
        if state is not None:  # (a saved memory without rows fits a fresh one of any batch size)
            fresh = init_memory(self.model, memory_batch_size(state) or 1)
            self.train_memory = restore_memory(fresh, state, path)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        self.eval_memory = None  # every evaluation starts from an empty memory
        try:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self.eval_memory = None
        loss = metrics.get(f"{metric_key_prefix}_loss")
        if loss is not None:
            extra = {
                f"{metric_key_prefix}_bpc": loss / math.log(2),
                f"{metric_key_prefix}_perplexity": math.exp(min(loss, 50)),
            }
            metrics.update(extra)
            self.log(extra)
        return metrics


def forget_compile_setting(accelerator):
    """After a `--trainer --compile` run: Accelerate keeps its compile setting in process-wide state, so the next
    Accelerator made in this process (another `txv train` run, the loop's included) would wrap its model in
    torch.compile (and save its weights under `_orig_mod.`): the setting goes back to what a fresh Accelerator reads
    from the environment."""
    from accelerate.utils import TorchDynamoPlugin

    accelerator.state.dynamo_plugin = TorchDynamoPlugin()


def train_with_trainer(args) -> dict:
    """`txv train --trainer`: the run of a `TrainArgs` with transformers' Trainer (MemoryTrainer, one process) instead
    of the Accelerate loop, on the same trajectory: the same model (seeded the same way, --dtype), rows, segments
    and passes (`segment_dataset(..., steps=max_steps)`), optimiser, schedule and clipping; the flags checked the
    same way against --model. The model and tokenizer are saved to OUTPUT_DIR/model. Returns the final metrics."""
    from transformers import TrainingArguments

    from .data import segment_dataset
    from .distributed import announce, fsdp_requested
    from .folder_lock import locked_atomic_directory
    from .loop import hold_output_dir
    from .plan import announce_changes, build_run_model, build_run_optimizer, plan_run_flags
    from .token_cache import plan_corpus

    refusals = {
        "--resume": (args.resume, "resume with Trainer's `train(resume_from_checkpoint=...)`"),
        "--grad-accum": (args.grad_accum > 1, "Trainer's accumulation would carry one memory over several rows"),
        "--eval-seg-len": (
            args.eval_seg_len not in (None, args.seg_len),
            "validation with a lengthened memory is the Accelerate loop's",
        ),
        f"--optimizer {args.optimizer}": (args.optimizer != "adamw", "Trainer clips the global gradient norm"),
    }
    for flag, (refused, why) in refusals.items():
        if refused:
            raise ModelError(f"{flag} is offered by the Accelerate loop only ({why}): drop --trainer")
    if fsdp_requested():  # Trainer would hand FSDP to Accelerate, which runs DDP on CPU: refuse rather than pretend
        raise ModelError(
            "--trainer runs one process without FSDP: use the Accelerate loop (drop --trainer) with an FSDP config"
        )
    flag_plan = plan_run_flags(args)  # as the Accelerate loop plans it
    announce_changes(args, flag_plan.changes)
    # the same token cache as the Accelerate loop
    corpus = plan_corpus(args, args.model).prepare(warn=announce, inform=announce if args.progress else None)
    tokenizer = corpus.tokenizer
    model, _ = build_run_model(args, flag_plan, tokenizer)  # seeded as the Accelerate loop's
    order = dict(order=args.data_order, seed=args.seed)
    train_set = segment_dataset(
        corpus.train_ids, args.batch_size, args.seg_len, "the training text", steps=args.max_steps, **order
    )
    valid_set = segment_dataset(
        corpus.valid_ids, args.eval_batch_size, args.seg_len, "the validation text", order=args.data_order
    )
    optimizer, schedule = build_run_optimizer(args, model)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size,
        learning_rate=args.lr,  # the optimiser and its schedule are `txv train`'s own (below)
        max_steps=args.max_steps,
        max_grad_norm=args.clip_norm,
        eval_strategy="steps" if args.eval_every else "no",
        eval_steps=args.eval_every or None,
        logging_steps=10,
        save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500,
        report_to=["tensorboard"] if args.tensorboard else [],
        seed=args.seed,
        bf16=args.mixed_precision == "bf16",
        fp16=args.mixed_precision == "fp16",
        use_cpu=args.cpu,
        disable_tqdm=not args.progress,
        dataloader_pin_memory=torch.cuda.is_available(),
        torch_compile=args.compile,  # Accelerate compiles the prepared model (the memory is an input of each call)
    )
    trainer = MemoryTrainer(
        model=model,
        args=training_args,
        train_dataset=train_set,
        eval_dataset=valid_set,
        optimizers=(optimizer, schedule),
    )
    with contextlib.ExitStack() as held:  # one run per output folder, as in the Accelerate loop
        hold_output_dir(Path(args.output_dir), held)
        if args.compile:
            held.callback(forget_compile_setting, trainer.accelerator)
        trainer.train()
        metrics = trainer.evaluate()
        if args.save_model:  # the whole folder or nothing: a full disk leaves the previous model/
            with locked_atomic_directory(Path(args.output_dir) / "model", keep_existing=False) as staging:
                trainer.save_model(str(staging))
                tokenizer.save_pretrained(staging)
    return metrics
