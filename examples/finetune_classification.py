"""Sequence classification fine-tuning with transformers' Trainer on a `datasets` Dataset, scored with the plugin's
offline `accuracy` metric.

Default task (no download): sentences of the embedded corpus, label 1 when the sentence is written backwards. Start
from a language model trained by `txv demo` / train_lm.py (its tokenizer is reused and a new head is added) or from
scratch:

    python examples/finetune_classification.py --model txv-demo/transfo-xl/model --output-dir runs/clf
    python examples/finetune_classification.py --train-file my.csv --output-dir runs/clf   # columns: text,label
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def reversed_sentences(n: int, seed: int, max_len: int):
    import datasets

    from hf_txvariants.training import default_corpus

    sentences = [s.strip().replace("\n", " ") for s in default_corpus().split(". ")]
    sentences = [s[:max_len] for s in sentences if 30 <= len(s)]
    rng = random.Random(seed)
    rng.shuffle(sentences)
    texts, labels = [], []
    for i, sentence in enumerate(sentences[:n]):
        texts.append(sentence[::-1] if i % 2 else sentence)
        labels.append(i % 2)
    return datasets.Dataset.from_dict({"text": texts, "label": labels})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a saved hf_txvariants model folder (LM or classifier) with its tokenizer")
    parser.add_argument("--variant", default="transfo-xl", help="variant for a model from scratch")
    parser.add_argument("--train-file", help="CSV or JSON lines with `text` and `label` columns")
    parser.add_argument("--output-dir", default="runs/classification")
    parser.add_argument("--examples", type=int, default=600, help="size of the default task's dataset")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    import hf_txvariants  # noqa: F401
    from hf_txvariants import metrics
    from hf_txvariants.training import build_char_tokenizer, build_config, default_corpus

    if args.train_file:
        path = Path(args.train_file)
        if not path.exists():
            print(f"finetune_classification.py: error: data file not found: {path}", file=sys.stderr)
            return 2
        data = datasets.load_dataset("csv" if path.suffix == ".csv" else "json", data_files=str(path), split="train")
        missing = {"text", "label"} - set(data.column_names)
        if missing:
            print(f"finetune_classification.py: error: {path} lacks column(s) {sorted(missing)}", file=sys.stderr)
            return 2
    else:
        data = reversed_sentences(args.examples, args.seed, args.max_length)
    num_labels = len(set(data["label"]))

    if args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(
            args.model, num_labels=num_labels, pad_token_id=tokenizer.pad_token_id
        )
    else:
        tokenizer = build_char_tokenizer(default_corpus()[:200_000])
        tokenizer.pad_token = tokenizer.eos_token
        config = build_config(
            args.variant,
            len(tokenizer),
            d_model=args.d_model,
            n_layer=args.n_layer,
            n_head=args.n_head,
            mem_len=0,
            seg_len=args.max_length,
            dropout=0.1,
            num_labels=num_labels,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = AutoModelForSequenceClassification.from_config(config)

    def tokenize(batch):
        return tokenizer(batch["text"], truncation=True, max_length=args.max_length, padding="max_length")

    data = data.map(tokenize, batched=True, remove_columns=["text"]).rename_column("label", "labels")
    split = data.train_test_split(test_size=0.2, seed=args.seed)
    accuracy = metrics.load("accuracy")

    def compute_metrics(prediction):
        return accuracy.compute(predictions=prediction.predictions.argmax(-1), references=prediction.label_ids)

    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=args.output_dir,
            per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=args.batch_size,
            learning_rate=args.lr,
            num_train_epochs=args.epochs,
            eval_strategy="epoch",
            save_strategy="no",
            logging_steps=10,
            report_to=[],
            seed=args.seed,
            warmup_steps=10,
        ),
        train_dataset=split["train"],
        eval_dataset=split["test"],
        compute_metrics=compute_metrics,
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    trainer.save_model(f"{args.output_dir}/model")
    tokenizer.save_pretrained(f"{args.output_dir}/model")
    print(
        f"accuracy on {len(split['test'])} held-out examples: {before['eval_accuracy']:.3f} before, "
        f"{after['eval_accuracy']:.3f} after fine-tuning; model saved to {args.output_dir}/model"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
