"""kimiyoung/transformer-xl `pytorch/train.py`'s options onto `txv train`: the one mapping the recipes
(`--recipe transfo-xl-*`) and the trainer-parity benchmark use (the adaptive-span authors' flags have theirs,
adaptive_span_flags.py).

Every option of train.py has one entry in `TRAIN_PY_OPTIONS`: the `TrainArgs` field or config field it sets, or why
`txv train` refuses a value other than train.py's default, or why it does not concern `txv train` (the machine,
logging, options train.py parses and never reads). `train_py_settings` turns train.py's parsed options into
`TrainArgs` fields and config fields, refusing by name (with the reason) every option whose value `txv train`
cannot honour."""

from __future__ import annotations

from dataclasses import dataclass

from .data import DataError

# train.py `--adaptive`: the cutoffs it sets for --dataset wt103 (tie_projs: [False] + [True] * len(cutoffs)), and
# its `eval_batch_size = 10`
ADAPTIVE_CUTOFFS = {"wt103": [20000, 40000, 200000]}
EVAL_BATCH_SIZE = 10
# what each corpus is made of in the original, as a `--tokenizer` (see recipes.TOKENIZERS)
DATASET_TOKENIZERS = {"wt103": "word", "enwik8": "byte", "text8": "char"}


@dataclass(frozen=True)
class Option:
    """How `txv train` takes one train.py option: `kind` is "train" (a TrainArgs field), "config" (a model config
    field), "derived" (read by `train_py_settings` with other options), "refused" (any value but `default` is refused
    with `reason`) or "outside" (not a setting of the training: the machine, logging, files; `reason` says where it
    went)."""

    kind: str
    target: str | None = None
    reason: str = ""
    default: object = None


def _train(field: str) -> Option:
    return Option("train", field)


def _config(field: str) -> Option:
    return Option("config", field)


def _refused(default, reason: str) -> Option:
    return Option("refused", None, reason, default)


def _outside(reason: str) -> Option:
    return Option("outside", None, reason)


TRAIN_PY_OPTIONS: dict[str, Option] = {
    # the model
    "n_layer": _train("n_layer"),
    "n_head": _train("n_head"),
    "d_head": _config("head_dim"),
    "d_embed": Option("derived", reason="the adaptive input's width (-1: d_model)"),
    "d_model": _train("d_model"),
    "d_inner": _train("d_inner"),
    "dropout": _train("dropout"),
    "dropatt": _config("attention_dropout"),
    "init": _config("init"),
    "init_range": _config("init_range"),
    "init_std": _config("initializer_range"),
    "proj_init_std": _config("proj_init_std"),
    "emb_init": _outside("parsed by train.py and never read (its embeddings take --init)"),
    "emb_init_range": _outside("parsed by train.py and never read (its embeddings take --init_range)"),
    "not_tied": Option("derived", reason="tie_word_embeddings = not not_tied"),
    "adaptive": Option("derived", reason="the adaptive input and softmax: train.py's cutoffs and tie_projs"),
    "div_val": _config("div_val"),
    "pre_lnorm": _config("pre_lnorm"),
    "same_length": _config("same_length"),
    "clamp_len": _config("clamp_len"),
    "attn_type": _refused(0, "only the paper's relative attention (attn_type 0) is a Transformer-XL here"),
    "sample_softmax": _refused(-1, "the sampled softmax is not offered (no run script uses it)"),
    "mem_len": _train("mem_len"),
    "ext_len": _refused(
        0,
        "the extended context (earlier tokens fed again without a loss) is not offered; every run script passes 0",
    ),
    # the optimisation
    "optim": Option("derived", reason="adam: --optimizer adamw --weight-decay 0 (the same update)"),
    "lr": _train("lr"),
    "mom": _refused(0.0, "SGD with momentum is not offered (txv train's optimisers: adamw, adagrad)"),
    "scheduler": Option(
        "derived", reason="cosine, inv_sqrt, constant: --lr-schedule transformer-xl(-inv-sqrt, -constant)"
    ),
    "warmup_step": _train("warmup_steps"),
    "eta_min": _train("eta_min"),
    "decay_rate": Option("derived", reason="read by --scheduler dev_perf only, which is refused"),
    "lr_min": Option("derived", reason="read by --scheduler dev_perf only, which is refused"),
    "patience": Option("derived", reason="read by --scheduler dev_perf only, which is refused"),
    "clip": _train("clip_norm"),
    "clip_nonemb": _refused(False, "clipping the non-embedding gradients only is not offered"),
    "max_step": _train("max_steps"),
    "batch_size": _train("batch_size"),
    "batch_chunk": _train("grad_accum"),
    "tgt_len": _train("seg_len"),
    "eval_tgt_len": _train("eval_seg_len"),
    "varlen": _refused(
        False, "variable segment lengths (drawn from numpy each step) are not offered; no run script passes it"
    ),
    "seed": _train("seed"),
    "fp16": _refused(
        False,
        "apex's FP16_Optimizer (half-precision weights, float32 master copies) is not offered; txv train has "
        "autocast: --mixed-precision fp16 or bf16",
    ),
    "static_loss_scale": _refused(1, "read by --fp16 only, which is refused"),
    "dynamic_loss_scale": _refused(False, "read by --fp16 only, which is refused"),
    "restart": _refused(False, "train.py's restart from a pickled model: --resume (a txv checkpoint) or --model"),
    "restart_dir": _refused("", "read by --restart only, which is refused"),
    "finetune_v2": _outside("parsed by train.py and never read"),
    "finetune_v3": _outside("parsed by train.py and never read"),
    # evaluation
    "eval_interval": _train("eval_every"),
    "max_eval_steps": Option("derived", reason="validate on the first N segments: --eval-segments N (-1: all)"),
    # the data
    "data": _outside("the corpus folder: give txv train its text with --data and --valid-data"),
    "dataset": Option("derived", reason="the tokenizer (wt103: word, enwik8: byte, text8: char) and the cutoffs"),
    # the machine and the logs
    "cuda": _outside("txv train takes the GPUs it finds (--cpu: none)"),
    "multi_gpu": _outside("data parallelism: `accelerate launch -m hf_txvariants.cli train`"),
    "gpu0_bsz": _outside("DataParallel's share of GPU 0: `accelerate launch` gives each process its rows"),
    "log_interval": _outside("txv train logs every step (metrics.jsonl)"),
    "work_dir": _outside("--output-dir"),
    "debug": _outside("--output-dir is always written"),
}

# train.py's argparse defaults of the options the mapping reads together
TRAIN_PY_DEFAULTS = {"d_embed": -1, "not_tied": False, "adaptive": False, "optim": "adam", "scheduler": "cosine"}


@dataclass
class TransfoXLSettings:
    """What `txv train` runs for one set of train.py options: `train_args` (TrainArgs fields) and `extra_config`."""

    train_args: dict
    extra_config: dict


def train_py_settings(options: dict, eval_batch_size: int = EVAL_BATCH_SIZE) -> TransfoXLSettings:
    """`options`: train.py's parsed options (`dest -> value`; those not given take train.py's defaults where the
    mapping needs them). Returns the `txv train` settings; any option `txv train` cannot honour is refused with a
    DataError naming it, its value and why."""
    unknown = sorted(set(options) - set(TRAIN_PY_OPTIONS))
    if unknown:
        raise DataError(f"train.py has no option(s) {', '.join('--' + name for name in unknown)}")
    refused = []
    for name, value in options.items():
        option = TRAIN_PY_OPTIONS[name]
        if option.kind == "refused" and value != option.default:
            refused.append(f"--{name} {value!r}: {option.reason}")
    values = {**TRAIN_PY_DEFAULTS, **options}
    dataset = values.get("dataset", "wt103")
    optim, scheduler = values["optim"], values["scheduler"]
    if optim != "adam":
        refused.append(
            f"--optim {optim!r}: train.py's plain {optim} is not offered (txv train's adagrad is adaptive-span's, "
            "with per-parameter clipping)"
        )
    schedules = {
        "cosine": "transformer-xl",
        "inv_sqrt": "transformer-xl-inv-sqrt",
        "constant": "transformer-xl-constant",
    }
    if scheduler not in schedules:
        refused.append(f"--scheduler {scheduler!r}: the learning rate halved on a validation plateau is not offered")
    if dataset not in DATASET_TOKENIZERS:
        refused.append(
            f"--dataset {dataset!r}: "
            + (
                "the one-billion-word shuffled sentence iterator is not offered"
                if dataset == "lm1b"
                else f"not one of {', '.join(DATASET_TOKENIZERS)}"
            )
        )
    if values["adaptive"] and dataset not in ADAPTIVE_CUTOFFS:
        refused.append(f"--adaptive: train.py sets cutoffs for wt103 and lm1b only, not {dataset!r}")
    if refused:
        raise DataError("train.py option(s) txv train cannot honour: " + "; ".join(refused))

    train_args = dict(
        variant="transfo-xl",
        tokenizer=DATASET_TOKENIZERS[dataset],
        optimizer="adamw",
        weight_decay=0.0,
        lr_schedule=schedules[scheduler],
        data_order="transformer-xl",
        eval_batch_size=eval_batch_size,
    )
    extra = dict(memory_init="empty")  # train.py's first segment starts with an empty memory
    for name, value in options.items():
        option = TRAIN_PY_OPTIONS[name]
        if option.kind == "train":
            train_args[option.target] = value
        elif option.kind == "config":
            extra[option.target] = value
    if "max_eval_steps" in options and options["max_eval_steps"] > 0:
        train_args["eval_segments"] = options["max_eval_steps"]
    d_model = values.get("d_model", 500)
    if values["d_embed"] not in (-1, d_model):
        extra["d_embed"] = values["d_embed"]
    extra["tie_word_embeddings"] = not values["not_tied"]
    if values["adaptive"]:
        cutoffs = list(ADAPTIVE_CUTOFFS[dataset])
        extra.update(cutoffs=cutoffs, tie_projs=[False] + [True] * len(cutoffs))
    else:
        extra.update(cutoffs=[], tie_projs=[False])
    return TransfoXLSettings(train_args, extra)


__all__ = ["ADAPTIVE_CUTOFFS", "TRAIN_PY_OPTIONS", "TransfoXLSettings", "train_py_settings"]
