"""Train (or fine-tune) a causal language model of any registered hf_txvariants variant.

Default: the Accelerate loop (hf_txvariants.training.train), one process or many:

    python examples/train_lm.py --output-dir runs/xl --max-steps 2000              # one process
    accelerate launch --config_file examples/accelerate_configs/ddp.yaml examples/train_lm.py --output-dir runs/xl
    accelerate launch --config_file examples/accelerate_configs/fsdp.yaml examples/train_lm.py --output-dir runs/xl
    torchrun --nproc_per_node 2 examples/train_lm.py --output-dir runs/xl          # CPU processes (gloo)
    python examples/train_lm.py --output-dir runs/xl --resume latest               # continue after a crash

Under `accelerate launch` the config's mixed_precision applies unless --mixed-precision is given; an FSDP config
shards the model with FSDP2 on GPUs or CPU processes (see examples/accelerate_configs/fsdp.yaml).

With --trainer, the same data is fine-tuned with transformers' Trainer instead (MemoryTrainer: the XL memory is
carried across steps and reset at evaluation; one process, no FSDP). Every flag: --help."""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    """`txv train` under another name: the same flags (HfArgumentParser over TrainArgs, --trainer included) and the
    same one-line errors (hf_txvariants.cli)."""
    from hf_txvariants.cli import main as txv

    return txv(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
