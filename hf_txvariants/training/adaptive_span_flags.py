"""facebookresearch/adaptive-span's command-line flags (its config.py) and their one mapping onto
`AdaptiveSpanOriginalConfig`. Shared by the checkpoint converter (conversion/adaptive_span.py, which checks the
flags against a checkpoint's tensors) and the training recipes (training/recipes.py, which train from the flags)."""

from __future__ import annotations

import argparse

# The original's command-line flags (config.py): flag -> (destination, type, default). `bool` = store_true.
ORIGINAL_FLAGS = {
    "--distributed": ("distributed", bool, False),
    "--local_rank": ("local_rank", int, 0),
    "--data": ("data_path", str, "data/text8"),
    "--data-unit": ("data_unit", str, "bpc"),
    "--hid-sz": ("hidden_size", int, 256),
    "--inner-hid-sz": ("inner_hidden_size", int, 1024),
    "--nlayers": ("nb_layers", int, 8),
    "--block-sz": ("block_size", int, 64),
    "--nheads": ("nb_heads", int, 2),
    "--attn-span": ("attn_span", int, 32),
    "--dropout": ("dropout", float, 0.2),
    "--emb-dropout": ("emb_dropout", float, 0.0),
    "--lr": ("lr", float, 0.03),
    "--momentum": ("momentum", float, 0.9),
    "--optim": ("optim", str, "sgd"),
    "--lr-warmup": ("lr_warmup", int, 0),
    "--grad-clip": ("grad_clip", float, 0.0),
    "--batch-sz": ("batch_size", int, 64),
    "--batch-split": ("batch_split", int, 1),
    "--nbatches": ("nb_batches_per_iter", int, 1000),
    "--niter": ("nb_iter", int, 1000),
    "--checkpoint": ("checkpoint_path", str, ""),
    "--full-eval-mode": ("full_eval_mode", bool, False),
    "--adapt-io": ("adapt_io_enabled", bool, False),
    "--adapt-io-tied": ("adapt_io_tied", bool, False),
    "--adapt-io-divval": ("adapt_io_divval", int, 4),
    "--adapt-io-cutoffs": ("adapt_io_cutoffs", int, [20000, 40000, 200000]),
    "--adapt-span": ("adapt_span_enabled", bool, False),
    "--adapt-span-loss": ("adapt_span_loss", float, 0.0),
    "--adapt-span-ramp": ("adapt_span_ramp", int, 32),
    "--adapt-span-init": ("adapt_span_init", float, 0.0),
    "--adapt-span-cache": ("adapt_span_cache", bool, False),
    "--pers-mem-size": ("pers_mem_size", int, 0),
}

# The training flags of the authors' experiment scripts (experiments/<name>.sh: its `args`, less --data, --distributed
# and --checkpoint, which name the machine's files) and their published test scores (README).
_SHARED = (
    "--nheads 8 --attn-span 8192 --block-sz 512 --batch-sz 64 --lr 0.07 --momentum 0 --optim adagrad "
    "--lr-warmup 32000 --grad-clip 0.03 --nbatches 1000 --adapt-span --adapt-span-cache"
)
PRESETS = {
    "enwik8": dict(
        flags=f"--nlayers 12 --hid-sz 512 --inner-hid-sz 2048 --dropout 0.3 --niter 600 "
        f"--adapt-span-loss 0.0000005 {_SHARED}",
        data="enwik8",
        result="1.02 bpb test, 1.04 dev (38M parameters)",
    ),
    "text8": dict(
        flags=f"--nlayers 12 --hid-sz 512 --inner-hid-sz 2048 --dropout 0.3 --niter 900 "
        f"--adapt-span-loss 0.0000005 {_SHARED}",
        data="text8",
        result="1.11 bpc test, 1.05 dev (39M parameters)",
    ),
    "enwik8_large": dict(
        flags=f"--nlayers 24 --hid-sz 768 --inner-hid-sz 4096 --dropout 0.4 --niter 150 "
        f"--adapt-span-loss 0.0000005 --batch-split 2 {_SHARED}",
        data="enwik8",
        result="0.98 bpb test, 1.00 dev (209M parameters)",
        fine_tune="--lr 0.007 --niter 170",
    ),
    "text8_large": dict(
        flags=f"--nlayers 24 --hid-sz 768 --inner-hid-sz 4096 --dropout 0.4 --niter 250 "
        f"--adapt-span-loss 0.0000005 --batch-split 2 {_SHARED}",
        data="text8",
        result="1.07 bpc test, 1.01 dev (209M parameters)",
        fine_tune="--lr 0.007 --niter 270",
    ),
    "enwik8_pers": dict(
        flags=f"--nlayers 36 --hid-sz 512 --inner-hid-sz 1 --dropout 0.4 --niter 200 "
        f"--adapt-span-loss 0.0000001 --pers-mem-size 2048 --batch-split 2 {_SHARED}",
        data="enwik8",
        result="0.98 bpb test, 1.00 dev (114M parameters)",
        fine_tune="--lr 0.007 --niter 210",
    ),
    "enwik8_pers_small": dict(
        flags=f"--nlayers 18 --hid-sz 512 --inner-hid-sz 1 --dropout 0.3 --niter 450 "
        f"--adapt-span-loss 0.0000001 --pers-mem-size 1024 --batch-split 2 {_SHARED}",
        data="enwik8",
        result="1.01 bpb test, 1.03 dev (39M parameters)",
        fine_tune="--lr 0.007 --niter 480",
    ),
}


def parse_original_flags(argv: list[str], error_class: type[Exception] = ValueError) -> tuple[dict, set]:
    """The original's parsed parameters (its defaults where not given) and the destinations that were given; a bad
    flag raises `error_class` naming it."""
    parser = argparse.ArgumentParser(prog="<the original's flags>", add_help=False, allow_abbrev=False)
    for flag, (dest, kind, default) in ORIGINAL_FLAGS.items():
        if kind is bool:
            parser.add_argument(flag, dest=dest, action="store_true", default=default)
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=default)

    def fail(message):
        raise error_class(f"the original's flags: {message}")

    parser.error = fail
    values = vars(parser.parse_args(argv))
    given = {ORIGINAL_FLAGS[a.split("=")[0]][0] for a in argv if a.split("=")[0] in ORIGINAL_FLAGS}
    return values, given


def architecture_from_flags(flags: dict, vocab_size: int) -> dict:
    """The architecture the original's models.py builds from its flags (what `infer_architecture` in the converter
    reads back from a checkpoint's tensors)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=flags["hidden_size"],
        num_attention_heads=flags["nb_heads"],
        head_dim=flags["hidden_size"] // flags["nb_heads"],
        num_hidden_layers=flags["nb_layers"],
        attn_span=flags["attn_span"],
        pers_mem_size=flags["pers_mem_size"],
        # the all-attention network (persistent memory) has no feed-forward sublayer
        inner_hidden_size=None if flags["pers_mem_size"] else flags["inner_hidden_size"],
        adapt_span_enabled=flags["adapt_span_enabled"],
    )


def config_kwargs(arch: dict, flags: dict) -> dict:
    """`AdaptiveSpanOriginalConfig` fields of an architecture and the original's flags (`--dropout` is both the
    feed-forward and the attention dropout in the original)."""
    kwargs = dict(
        vocab_size=arch["vocab_size"],
        hidden_size=arch["hidden_size"],
        num_attention_heads=arch["num_attention_heads"],
        num_hidden_layers=arch["num_hidden_layers"],
        attn_span=arch["attn_span"],
        block_size=flags["block_size"],
        persistent_memory_size=arch["pers_mem_size"],
        dropout=flags["dropout"],
        attention_dropout=flags["dropout"],
        emb_dropout=flags["emb_dropout"],
    )
    if arch["inner_hidden_size"] is not None:
        kwargs["intermediate_size"] = arch["inner_hidden_size"]
    if arch["adapt_span_enabled"]:
        kwargs.update(
            adapt_span_enabled=True,
            adapt_span_ramp=flags["adapt_span_ramp"],
            adapt_span_init=flags["adapt_span_init"],
            adapt_span_loss=flags["adapt_span_loss"],
            adapt_span_cache=flags["adapt_span_cache"],
        )
    return kwargs


def train_settings_from_flags(flags: dict) -> tuple[dict, dict]:
    """`txv train` settings of a run of the original's trainer with `flags` (`parse_original_flags`): TrainArgs
    fields (its Adagrad and warm-up, its data order, 1000-step iterations as the validation interval) and the config
    fields beyond them. The recipes and the trainer-parity benchmark use it; a flag `txv train` cannot honour is a
    ValueError naming it."""
    if flags["optim"] != "adagrad":  # the scripts all use adagrad; `txv train` offers no SGD with momentum
        raise ValueError(f"the original's --optim {flags['optim']} has no txv train equivalent (adagrad only)")
    if flags["adapt_io_enabled"]:  # no experiment script uses it
        raise ValueError(
            "the original's --adapt-io (its adaptive input and output) has no txv_adaptive_span_original field"
        )
    config = config_kwargs(architecture_from_flags(flags, vocab_size=0), flags)
    config.pop("vocab_size")
    train_args = dict(
        variant="txv_adaptive_span_original",
        n_layer=config.pop("num_hidden_layers"),
        d_model=config.pop("hidden_size"),
        n_head=config.pop("num_attention_heads"),
        d_inner=config.pop("intermediate_size", None),
        dropout=config.pop("dropout"),
        seg_len=flags["block_size"],
        mem_len=0,
        batch_size=flags["batch_size"],
        grad_accum=flags["batch_split"],
        lr=flags["lr"],
        warmup_steps=flags["lr_warmup"],
        max_steps=flags["nb_iter"] * flags["nb_batches_per_iter"],
        clip_norm=flags["grad_clip"],
        optimizer="adagrad",
        weight_decay=0.0,
        lr_schedule="adaptive-span",
        data_order="adaptive-span",
        eval_every=flags["nb_batches_per_iter"],
        eval_batch_size=flags["batch_size"],  # its validation data is cut into the training batch's rows
    )
    return train_args, config
