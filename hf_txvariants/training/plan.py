"""The one plan of what `txv train` does with its flags, followed by both of its paths: the Accelerate loop
(`loop.train`) and the Trainer path (`trainer.train_with_trainer`).

Before any work every flag given is applied, refused or equal to the model's (`plan_run_flags`: --model's config, or
the one the flags build; the rules are `arguments.plan_flags`) and the changes are said (`announce_changes`). Once the
tokenizer is known the model is made, seeded, from --model with the planned overrides or new from the flags
(`build_run_model`), then its optimiser and learning-rate schedule (`build_run_optimizer`)."""

from __future__ import annotations

import torch

from .arguments import LoadedModelPlan, TrainArgs, given_fields, plan_flags, size_fields
from .distributed import announce
from .models import (
    ModelError,
    build_config,
    build_model,
    check_model_source,
    check_text_variant,
    load_config,
    load_model,
)
from .optimizers import build_optimizer, build_schedule


def new_model_config(args: TrainArgs, vocab_size: int):
    """The config of a new model: --variant with the size flags, then --extra-config's fields."""
    return build_config(args.variant, vocab_size, **{**size_fields(args), **args.extra_config})


def plan_run_flags(args: TrainArgs) -> LoadedModelPlan:
    """Every flag given checked against the config of --model, or of the new model the flags describe (a bad field
    fails here, before any data is read); a refusal is one ModelError naming each flag."""
    given = given_fields(args)
    if args.model:
        check_model_source(args.model)
        return plan_flags(args, load_config(args.model), args.model, given)
    check_text_variant(args.variant)
    config = new_model_config(args, 1 << 30)  # any vocabulary: the tokenizer is not known yet
    return plan_flags(args, config, f"a new {args.variant} model", given, loaded=False)


def announce_changes(args: TrainArgs, lines) -> None:
    """Says each line (a planned change, a resume note; None is skipped) once on stderr, naming what is trained."""
    for line in lines:
        if line:
            announce(f"{args.model or 'txv train'}: {line}")


def build_run_model(args: TrainArgs, flag_plan: LoadedModelPlan, tokenizer):
    """The model of the run and its config, after the seed is set (both paths make the same weights): --model loaded
    in --dtype with the plan's overrides (refused if its vocabulary is smaller than the tokenizer's), or a new model
    of the flags sized to the tokenizer."""
    from accelerate.utils import set_seed

    set_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    if args.model:
        model = load_model(args.model, dtype=dtype, **flag_plan.overrides)
        if model.config.vocab_size < len(tokenizer):
            raise ModelError(
                f"the tokenizer has {len(tokenizer)} tokens but {args.model} has vocab_size {model.config.vocab_size}"
            )
        return model, model.config
    config = new_model_config(args, len(tokenizer))
    config.eos_token_id = tokenizer.eos_token_id
    return build_model(config).to(dtype), config


def build_run_optimizer(args: TrainArgs, model):
    """--optimizer over the model's parameters and its --lr-schedule: (optimizer, schedule)."""
    optimizer = build_optimizer(args.optimizer, model, args.lr, args.weight_decay, args.clip_norm)
    return optimizer, build_schedule(args.lr_schedule, optimizer, args.warmup_steps, args.max_steps, args.eta_min)
