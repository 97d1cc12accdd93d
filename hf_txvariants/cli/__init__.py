"""The `txv` command: `txv demo`, `txv train`, `txv eval`, `txv push`. Bad input ends with one line
`txv: error: ...` and exit status 2, not a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def add_train_arguments(parser):
    """One flag per `TrainArgs` field (`--d-model`, `--mem-len`, `--resume latest`, ...)."""
    from ..training.loop import TrainArgs

    for f in dataclasses.fields(TrainArgs):
        if f.name == "extra_config":
            parser.add_argument("--extra-config", type=json.loads, default={},
                                help="JSON dict of extra config fields, e.g. '{\"clamp_len\": 400}'")
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
            continue
        kind = {int: int, float: float}.get(type(default), str)
        if f.name in ("d_inner", "max_chars", "eval_segments"):
            kind = int
        parser.add_argument(flag, type=kind, default=default, help=f"default: {default}")


def _train(args):
    from ..training.loop import TrainArgs, train

    fields = {f.name for f in dataclasses.fields(TrainArgs)}
    result = train(TrainArgs(**{k: v for k, v in vars(args).items() if k in fields}))
    if result["eval"] and result["history"]:  # printed by the main process only
        final = result["eval"][-1]
        print(f"validation: {final['bpc']:.4f} bits per token, perplexity {final['perplexity']:.3f} "
              f"({final['tokens']} tokens)" + (f"; model saved to {result['model_dir']}" if args.save_model else ""))


def _eval(args):
    from transformers import AutoTokenizer

    from ..training import encode, evaluate_sliding_window, evaluate_text, load_model, load_text
    from ..training.models import ModelError, uses_memory

    model = load_model(args.model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except (OSError, ValueError) as error:
        raise ModelError(f"no tokenizer in {args.model}: {str(error).splitlines()[0]}") from None
    text = load_text(args.data, args.text_column)
    if args.max_chars:
        text = text[: args.max_chars]
    tokens = encode(tokenizer, text)
    if args.mem_len is not None and hasattr(model, "reset_memory_length"):
        model.reset_memory_length(args.mem_len)
    if args.window:
        result = evaluate_sliding_window(model, tokens, args.window, args.batch_size)
        how = f"sliding window {args.window}"
    else:
        result = evaluate_text(model, tokens, args.batch_size, args.seg_len)
        how = f"segments of {args.seg_len}" + (f", memory {model.config.mem_len}" if uses_memory(model) else "")
    print(f"{result['bpc']:.4f} bits per token, perplexity {result['perplexity']:.3f}, {result['tokens']} tokens "
          f"({how}), {result['tokens_per_second']:,.0f} tokens/s")
    print(json.dumps(result))


def _push(args):
    from transformers import AutoTokenizer

    from ..hub import push_to_hub
    from ..training import load_model

    model = load_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    metrics = {}
    results = __import__("pathlib").Path(args.model) / "eval_results.json"
    if results.exists():
        metrics = json.loads(results.read_text())
    info = push_to_hub(model, args.repo_id, tokenizer, metrics, private=args.private, dataset=args.dataset,
                       base_card=args.card)
    print(f"pushed to {getattr(info, 'commit_url', info)}")


def _demo(args):
    from .demo import run

    run(args)


def build_parser():
    parser = argparse.ArgumentParser(prog="txv", description="hf-txvariants: train, evaluate, share, demo")
    sub = parser.add_subparsers(dest="command", required=True)
    from .demo import add_arguments

    demo = sub.add_parser("demo", help="Transformer-XL vs a same-size baseline without memory, on CPU")
    add_arguments(demo)
    demo.set_defaults(func=_demo)

    train = sub.add_parser("train", help="train a causal LM with Accelerate (works under `accelerate launch`)")
    add_train_arguments(train)
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="bits per token / perplexity of a saved model on a text")
    ev.add_argument("--model", required=True, help="saved model folder or Hub repo id")
    ev.add_argument("--data", help="text file / folder / saved dataset (default: the embedded corpus)")
    ev.add_argument("--text-column", default="text")
    ev.add_argument("--max-chars", type=int)
    ev.add_argument("--seg-len", type=int, default=64)
    ev.add_argument("--mem-len", type=int, help="memory length at evaluation (memory models)")
    ev.add_argument("--batch-size", type=int, default=1)
    ev.add_argument("--window", type=int, help="score with a sliding window of this length instead (no memory)")
    ev.set_defaults(func=_eval)

    push = sub.add_parser("push", help="upload a saved model with its model card to the Hub")
    push.add_argument("--model", required=True)
    push.add_argument("--repo-id", required=True)
    push.add_argument("--dataset", help="dataset name for the model card")
    push.add_argument("--card", help="a model_cards/*.md to use as the card's body")
    push.add_argument("--private", action="store_true")
    push.set_defaults(func=_push)
    return parser


def main(argv=None) -> int:
    from ..training.data import DataError
    from ..training.models import ModelError

    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (DataError, ModelError, FileNotFoundError) as error:
        print(f"txv: error: {error}", file=sys.stderr)
        return 2
    return 0


__all__ = ["build_parser", "main"]
