"""Train (or fine-tune) a causal language model of any registered hf_txvariants variant.

Default: the Accelerate loop (hf_txvariants.training.train), one process or many:

    python examples/train_lm.py --output-dir runs/xl --max-steps 2000              # one process
    accelerate launch --config_file examples/accelerate_configs/ddp.yaml examples/train_lm.py --output-dir runs/xl
    accelerate launch --config_file examples/accelerate_configs/fsdp.yaml examples/train_lm.py --output-dir runs/xl
    torchrun --nproc_per_node 2 examples/train_lm.py --output-dir runs/xl          # CPU processes (gloo)

Under `accelerate launch` the config's mixed_precision applies unless --mixed-precision is given; an FSDP config
shards the model with FSDP2 on GPUs or CPU processes (see examples/accelerate_configs/fsdp.yaml).
    python examples/train_lm.py --output-dir runs/xl --resume latest               # continue after a crash

With --trainer, the same data is fine-tuned with transformers' Trainer instead (MemoryTrainer: the XL memory is
carried across steps and reset at evaluation; one process, no FSDP). Every flag: --help."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys


def run_trainer(args):
    from transformers import AutoTokenizer, TrainingArguments

    from hf_txvariants.training.distributed import fsdp_requested
    from hf_txvariants.training.models import ModelError

    if fsdp_requested():  # Trainer would hand FSDP to Accelerate, which runs DDP on CPU: refuse rather than pretend
        raise ModelError("--trainer runs one process without FSDP: use the Accelerate loop (drop --trainer) with an "
                         "FSDP config")
    from hf_txvariants.training import (build_char_tokenizer, build_config, build_model, encode, load_model,
                                        load_text, segment_dataset, split_text)
    from hf_txvariants.training.trainer import MemoryTrainer

    text = load_text(args.data, args.text_column)[: args.max_chars or None]
    train_text, valid_text = split_text(text, args.valid_fraction)
    if args.model:
        tokenizer, model = AutoTokenizer.from_pretrained(args.model), load_model(args.model)
    else:
        tokenizer = build_char_tokenizer(train_text)
        model = build_model(build_config(args.variant, len(tokenizer), d_model=args.d_model, n_layer=args.n_layer,
                                         n_head=args.n_head, d_inner=args.d_inner, mem_len=args.mem_len,
                                         seg_len=args.seg_len, dropout=args.dropout, **args.extra_config))
    train_set = segment_dataset(encode(tokenizer, train_text), args.batch_size, args.seg_len, name="the training text")
    valid_set = segment_dataset(encode(tokenizer, valid_text), args.eval_batch_size, args.seg_len,
                                name="the validation text")
    training_args = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size, learning_rate=args.lr, max_steps=args.max_steps,
        warmup_steps=args.warmup_steps, lr_scheduler_type="cosine", max_grad_norm=args.clip_norm,
        eval_strategy="steps" if args.eval_every else "no", eval_steps=args.eval_every or None,
        logging_steps=10, save_strategy="no", report_to=["tensorboard"] if args.tensorboard else [],
        seed=args.seed, bf16=args.mixed_precision == "bf16", disable_tqdm=not args.progress,
    )
    trainer = MemoryTrainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=valid_set)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model(f"{args.output_dir}/model")
    tokenizer.save_pretrained(f"{args.output_dir}/model")
    print(f"validation: {metrics['eval_bpc']:.4f} bits per token, perplexity {metrics['eval_perplexity']:.3f}; "
          f"model saved to {args.output_dir}/model")


def main(argv=None) -> int:
    from hf_txvariants.cli import add_train_arguments
    from hf_txvariants.training import DataError, ModelError, TrainArgs, train

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_arguments(parser)
    parser.add_argument("--trainer", action="store_true", help="fine-tune with transformers' Trainer (MemoryTrainer)")
    args = parser.parse_args(argv)
    try:
        if args.trainer:
            run_trainer(args)
        else:
            fields = {f.name for f in dataclasses.fields(TrainArgs)}
            result = train(TrainArgs(**{k: v for k, v in vars(args).items() if k in fields}))
            if result["history"]:
                final = result["eval"][-1]
                print(f"validation: {final['bpc']:.4f} bits per token, perplexity {final['perplexity']:.3f} "
                      f"({final['tokens']} tokens)" + (f"; model saved to {result['model_dir']}" if args.save_model else ""))
    except (DataError, ModelError, FileNotFoundError) as error:
        print(f"train_lm.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
