"""The settings of a `txv train` run: `TrainArgs`, whose every field is a command-line flag (read by
transformers' `HfArgumentParser`), validated on construction so that a bad value names its flag before any work."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Literal

from .data import DataError
from .optimizers import SCHEDULES_WITH_FLOOR


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
    data_order: Literal["transformer-xl", "adaptive-span"] = _arg(
        "transformer-xl",
        "how each row is read, as an original trainer does: transformer-xl (kimiyoung's ordered iterator: "
        "segments from the row's start, the last one shorter, then a new epoch from the start with the memory "
        "emptied) or adaptive-span (whole segments; then a new pass at a random offset below --seg-len, drawn "
        "from --seed, with the memory zeroed)",
    )
    lr: float = _arg(1e-3, "peak learning rate (after the warm-up)")
    warmup_steps: int = _arg(20, "linear warm-up steps")
    lr_schedule: Literal[
        "cosine", "constant", "transformer-xl", "transformer-xl-inv-sqrt", "transformer-xl-constant", "adaptive-span"
    ] = _arg(
        "cosine",
        "cosine: linear warm-up, then cosine decay from the end of the warm-up to --eta-min at --max-steps; "
        "constant: linear warm-up, then constant; the originals' schedules, each step at the rate the original "
        "gives it: transformer-xl (kimiyoung's train.py --scheduler cosine: cosine counted from step 0), "
        "transformer-xl-inv-sqrt, transformer-xl-constant (its inv_sqrt and constant), adaptive-span (warm-up to "
        "step W, then constant). The formulas: hf_txvariants.training.optimizers.LR_SCHEDULES",
    )
    eta_min: float = _arg(0.0, "the cosine schedules' final learning rate (train.py's --eta_min)")
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
    eval_seg_len: int | None = _arg(
        None,
        "tokens per validation segment (default: --seg-len); a memory model's memory is then lengthened by "
        "seg-len - eval-seg-len, as kimiyoung's train.py evaluates (its --eval_tgt_len)",
    )
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
    dtype: Literal["float32", "float64"] = _arg(
        "float32",
        "the dtype of the weights, the memory and the arithmetic (float64 for comparing a run with a reference "
        "step for step)",
    )
    cpu: bool = _arg(False, "train on CPU even with GPUs (so do all processes when there are more than GPUs: gloo)")
    compile: bool = _arg(
        False,
        "torch.compile the model (forward and backward of a training segment, the memory carried as an input): "
        "the same losses within float rounding without dropout (compiled dropout draws other masks, so a resumed "
        "run keeps the setting it began with); the first steps, and each new segment or memory length, compile",
    )
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
        optional_positive = ("d_inner", "max_chars", "eval_segments", "eval_seg_len", "vocab_max_size")
        non_negative = ("mem_len", "warmup_steps", "eval_every", "save_every", "seed", "vocab_min_freq")
        for name in positive + optional_positive + non_negative:
            value = getattr(self, name)
            if value is None and name in optional_positive:
                continue
            low = 0 if name in non_negative else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DataError(f"--{flag_name(name)} must be an integer >= {low}, got {value!r}")
        for name, low, high in (
            ("lr", 0.0, None),
            ("dropout", 0.0, 1.0),
            ("weight_decay", 0.0, None),
            ("clip_norm", 0.0, None),
            ("eta_min", 0.0, None),
            ("valid_fraction", 0.0, 1.0),
        ):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            ok = ok and value >= low and (high is None or value < high) and (name != "lr" or value > 0)
            ok = ok and (name != "valid_fraction" or value > 0)
            if not ok:
                bounds = f"in [{low}, {high})" if high is not None else ("> 0" if name == "lr" else f">= {low}")
                raise DataError(f"--{flag_name(name)} must be a finite number {bounds}, got {value!r}")
        for name in ("optimizer", "lr_schedule", "data_order", "dtype"):
            choices = typing.get_args(typing.get_type_hints(TrainArgs)[name])
            if getattr(self, name) not in choices:
                raise DataError(f"--{flag_name(name)} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.eta_min and self.lr_schedule not in SCHEDULES_WITH_FLOOR:
            raise DataError(
                f"--eta-min {self.eta_min} applies to --lr-schedule {' or '.join(SCHEDULES_WITH_FLOOR)}, "
                f"not {self.lr_schedule}"
            )
        if self.eta_min > self.lr:
            raise DataError(f"--eta-min {self.eta_min} is above --lr {self.lr}")
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


def size_fields(args: TrainArgs) -> dict:
    return dict(
        d_model=args.d_model,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_inner=args.d_inner,
        mem_len=args.mem_len,
        seg_len=args.seg_len,
        dropout=args.dropout,
    )


def flag_name(name: str) -> str:
    return name.replace("_", "-")


# --------------------------------------------------------------------------------------------------------------------
# What a flag does when the weights come from --model (or from a checkpoint, --resume): every TrainArgs field has one
# role (tests/test_train_flags.py walks them all), so that no flag is ever dropped without a word.
# * architecture: the model's shape; compared with the loaded config (its field named here) and refused when it
#   differs, before any work;
# * setting: a config field that changes how the model runs or trains, not what its weights are: the model is built
#   with the flag's value (`from_pretrained(..., field=value)`) and the change is said once;
# * run: read by the training loop itself, whatever made the model.
ARCHITECTURE_FLAGS = {
    "variant": "model_type",
    "d_model": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "d_inner": "intermediate_size",
}
SETTING_FLAGS = {"mem_len": "mem_len", "dropout": "dropout"}
# --extra-config fields that may differ between the run that made the weights and a run that starts from them,
# besides every dropout: memory, position and loss settings, the kernels chosen. Any other field is the model's
# architecture (or its initialisation, which a loaded model has done already): a new value is refused.
COMMON_SETTINGS = frozenset({"use_cache", "pad_token_id", "bos_token_id", "eos_token_id"})
VARIANT_SETTINGS = {
    "transfo-xl": {"mem_len", "clamp_len", "same_length", "same_length_extra_key", "memory_init", "adapt_span_loss"},
    "txv_gtrxl": {"mem_len", "clamp_len", "same_length", "same_length_extra_key", "memory_init", "adapt_span_loss"},
    "txv_adaptive_span": {"mem_len", "memory_init", "adapt_span_loss"},
    "txv_adaptive_span_original": {"block_size", "adapt_span_loss", "adapt_span_cache"},
    "txv_vanilla": {"intermediate_loss_weight", "future_target_loss_weight", "loss_on_all_positions"},
    "txv_universal": {"act_loss_weight"},
    "txv_act_rnn": {"act_loss_weight"},
    "txv_sparse_transformer": {"pattern_implementation", "gradient_checkpointing_min_layers"},
    "txv_image_transformer": {"pattern_implementation"},
    "txv_reformer": {"num_hashes", "hash_seed", "chunk_size_lm_head"},
}
# run fields that do not change the trajectory of the training losses (a resumed run may change them)
UNTRACKED_RUN_FLAGS = frozenset(
    {
        "output_dir",
        "resume",
        "model",
        "token_cache",
        "eval_every",
        "eval_batch_size",
        "eval_segments",
        "eval_seg_len",
        "valid_data",
        "save_every",
        "tensorboard",
        "progress",
        "save_model",
        "cpu",
    }
)


def config_setting_names(model_type: str) -> frozenset:
    """The config fields of `model_type` that a run may change on trained weights (see VARIANT_SETTINGS)."""
    return COMMON_SETTINGS | VARIANT_SETTINGS.get(model_type, frozenset())


def is_config_setting(model_type: str, name: str) -> bool:
    return name in config_setting_names(model_type) or "dropout" in name


def given_fields(args: TrainArgs) -> set[str]:
    """The fields the user set: those named on the command line (`mark_given`), else (the Python API) those that
    differ from their defaults."""
    marked = getattr(args, "_given", None)
    if marked is not None:
        return set(marked)
    defaults = TrainArgs()
    return {f.name for f in dataclasses.fields(TrainArgs) if getattr(args, f.name) != getattr(defaults, f.name)}


def mark_given(args: TrainArgs, names) -> TrainArgs:
    """Records which fields were set explicitly (the command line's flags, a recipe's settings)."""
    args._given = frozenset(names)
    return args


@dataclasses.dataclass
class LoadedModelPlan:
    """What a run from saved weights changes in their config: `overrides` for `from_pretrained`, and one line per
    change to say."""

    overrides: dict
    changes: list[str]


def plan_flags(
    args: TrainArgs, config, source: str, given: set[str] | None = None, loaded: bool = True
) -> LoadedModelPlan:
    """Checks every flag the user gave (`given`) against `config`, the config of the weights in `source` (--model,
    `loaded`), or the one built from the flags: an architecture flag that differs from the checkpoint's is refused,
    and so is, for loaded weights, a flag the variant has no field for (one ModelError naming each flag, its value and
    the checkpoint's; for a new model such a flag is said instead); a setting is planned as a `from_pretrained`
    override and said; a value equal to the checkpoint's is accepted silently."""
    from .models import ModelError

    given = given_fields(args) if given is None else given
    model_type = config.model_type
    # the fields the variant's config declares (a PretrainedConfig answers for some it does not have, e.g.
    # num_hidden_layers)
    declared = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set(vars(config))
    refusals, overrides, changes = [], {}, []

    def check(flag: str, name: str, value, setting: bool):
        if name == "model_type":
            current = model_type
        elif name not in declared:
            if name == "mem_len" and value == 0:  # "no memory" for a variant without one
                return
            if loaded:
                refusals.append(f"{flag} {value!r}: {model_type} has no {name}")
            else:  # a flag shared by a family of runs: said, not an error
                changes.append(f"{flag} {value!r} does not apply: {model_type} has no {name}")
            return
        else:
            current = getattr(config, name)
        if value == current:
            return
        if setting:
            overrides[name] = value
            changes.append(f"{name} {current!r} -> {value!r} from {flag}")
        else:
            kind = "changes the model" if name == "model_type" else "would change the weights"
            refusals.append(f"{flag} {value!r} contradicts {source}'s {name} {current!r} ({kind})")

    for field_name in sorted(given):
        flag = f"--{flag_name(field_name)}"
        if field_name in ARCHITECTURE_FLAGS:
            check(flag, ARCHITECTURE_FLAGS[field_name], getattr(args, field_name), setting=False)
        elif field_name in SETTING_FLAGS:
            check(flag, SETTING_FLAGS[field_name], getattr(args, field_name), setting=True)
        elif field_name == "seg_len":
            if model_type == "txv_adaptive_span_original":  # the block length it trains and evaluates with
                check(flag, "block_size", args.seg_len, setting=True)
            longest = getattr(config, "max_position_embeddings", None)
            if model_type != "txv_reformer" and longest is not None and args.seg_len > longest:
                refusals.append(f"--seg-len {args.seg_len} is longer than {source}'s max_position_embeddings {longest}")
    if "extra_config" in given:
        aliases = getattr(type(config), "attribute_map", {})
        for key, value in args.extra_config.items():
            name = aliases.get(key, key)
            check(f"--extra-config {key}", name, value, setting=is_config_setting(model_type, name))
    if refusals:
        hint = " (drop the flag, or train a new model without --model)" if loaded else ""
        raise ModelError("; ".join(refusals) + hint)
    return LoadedModelPlan(overrides, changes)


def resume_differences(saved_args: dict, args: TrainArgs) -> list[str]:
    """The trajectory flags (every field but UNTRACKED_RUN_FLAGS and --max-steps, which only lengthens or shortens the
    run: `resume_length_note`) whose value differs from the run being resumed (`saved_args`: its TrainArgs as saved
    in run_state.json); a field the saved run did not have yet is compared with its default."""
    defaults = TrainArgs()
    diffs = []
    for f in dataclasses.fields(TrainArgs):
        if f.name in UNTRACKED_RUN_FLAGS or f.name == "max_steps":
            continue
        saved = saved_args.get(f.name, getattr(defaults, f.name))
        now = getattr(args, f.name)
        if f.name == "extra_config":
            saved, now = dict(saved or {}), dict(now)
        if saved != now:
            diffs.append(f"--{flag_name(f.name)} {saved!r} in the checkpoint, {now!r} now")
    return diffs


def resume_length_note(saved_args: dict, args: TrainArgs) -> str | None:
    """What a resumed run with another --max-steps does to a schedule that depends on it (said once), or None."""
    saved = saved_args.get("max_steps", args.max_steps)
    if saved == args.max_steps or args.lr_schedule not in SCHEDULES_WITH_FLOOR:
        return None
    return (
        f"--max-steps {saved} -> {args.max_steps}: the {args.lr_schedule} schedule runs over {args.max_steps} steps "
        f"from the resumed step on (the steps before ran on a schedule of {saved})"
    )
