"""`txv push`: a saved model folder uploaded to the Hub with its code, tokenizer and model card (its
eval_results.json, if any, in the card's metadata)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .errors import UsageError


def add_parser(sub, name: str, help_text: str):
    """`txv push` (see hf_txvariants_commands.COMMANDS)."""
    push = sub.add_parser(name, help=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    push.add_argument("--model", required=True, help="saved model folder (with its tokenizer)")
    push.add_argument("--repo-id", required=True, help="Hub repo, e.g. user/transfo-xl-char")
    push.add_argument("--dataset", help="dataset name for the model card's metadata")
    push.add_argument("--card", help="a model_cards/*.md to use as the card's body")
    push.add_argument("--private", action="store_true", help="create the repo as private")
    push.add_argument("--token", help="Hub token (default: the one saved by `hf auth login` or HF_TOKEN)")
    push.add_argument("--revision", help="branch to push to (default: main)")
    push.add_argument("--commit-message", default="Upload hf-txvariants model", help="commit message")
    push.add_argument("--create-pr", action="store_true", help="open a pull request instead of committing")
    push.set_defaults(func=run)
    return push


def run(args):
    from huggingface_hub import constants

    from ..hub import push_to_hub
    from ..training.models import load_model, load_tokenizer

    # what is wrong on this machine first (a missing folder or card), then whether the Hub can be reached
    if not Path(args.model).is_dir():
        raise UsageError(f"model folder not found: {args.model}")
    if args.card is not None and not Path(args.card).is_file():
        raise UsageError(f"model card not found: {args.card}")
    if constants.HF_HUB_OFFLINE:
        raise UsageError("cannot push to the Hub: HF_HUB_OFFLINE is set (unset it to upload)")
    model = load_model(args.model)
    tokenizer = load_tokenizer(args.model)
    metrics = {}
    results = Path(args.model) / "eval_results.json"
    if results.exists():
        try:
            metrics = json.loads(results.read_text())
        except json.JSONDecodeError as error:
            raise UsageError(f"{results} is not valid JSON ({error})") from None
    info = push_to_hub(
        model,
        args.repo_id,
        tokenizer,
        metrics,
        private=args.private,
        dataset=args.dataset,
        base_card=args.card,
        token=args.token,
        revision=args.revision,
        commit_message=args.commit_message,
        create_pr=args.create_pr,
    )
    print(f"pushed to {getattr(info, 'pr_url', None) or getattr(info, 'commit_url', info)}")
