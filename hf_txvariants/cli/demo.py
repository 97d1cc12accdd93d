"""`txv demo`: Transformer-XL against a same-size baseline without memory, on CPU in a few minutes.

Trains both on the same text (the embedded corpus unless --data is given) for the same number of steps and tokens,
evaluates both on the same held-out characters with the same attention length (Transformer-XL: segments of
`seg_len` with `mem_len` of memory, so a query sees at most `seg_len + mem_len` positions; the baseline: a sliding
window of `seg_len + mem_len` recomputed for every character), prints bits per character and the evaluation-speed
ratio, saves both in Hugging Face format, reloads the Transformer-XL with AutoModelForCausalLM, generates a sample and
plots the training curves."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch


def add_parser(sub, name: str, help_text: str):
    """`txv demo` (see hf_txvariants_commands.COMMANDS)."""
    demo = sub.add_parser(name, help=help_text)
    add_arguments(demo)
    demo.set_defaults(func=run)
    return demo


def add_arguments(parser):
    parser.add_argument(
        "--data",
        help="your text: a file, a folder of text files or a saved `datasets` folder "
        "(default: the embedded corpus, Python standard-library docstrings)",
    )
    parser.add_argument("--out", default="txv-demo", help="output folder (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=800, help="training steps per model (default: %(default)s)")
    parser.add_argument("--d-model", type=int, default=128, help="hidden size of both models")
    parser.add_argument("--n-layer", type=int, default=4, help="layers of both models")
    parser.add_argument("--n-head", type=int, default=4, help="attention heads per layer")
    parser.add_argument("--d-inner", type=int, default=None, help="default: 4 x d-model")
    parser.add_argument("--seg-len", type=int, default=64, help="Transformer-XL segment length")
    parser.add_argument("--mem-len", type=int, default=64, help="Transformer-XL memory length")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="Transformer-XL rows per step; the baseline gets "
        "the same number of tokens per step in rows of seg-len + mem-len",
    )
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout rate")
    parser.add_argument("--max-chars", type=int, default=None, help="use only the first N characters of the text")
    parser.add_argument(
        "--eval-chars",
        type=int,
        default=3000,
        help="held-out characters both models are scored on (default: %(default)s)",
    )
    parser.add_argument("--eval-batch", type=int, default=8, help="windows per forward pass for the baseline")
    parser.add_argument(
        "--baseline",
        default="auto",
        help="baseline variant: 'auto' (txv_vanilla if registered, "
        "else Transformer-XL with mem_len=0), or a registered variant name",
    )
    parser.add_argument("--prompt", default="Return the ", help="text the sample continues")
    parser.add_argument("--sample-chars", type=int, default=200, help="characters to generate")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1; the default models "
        "are too small to gain from more, and several threads slow to a crawl on a busy machine)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def baseline_variant(name: str) -> tuple[str, dict]:
    from ..training.models import config_class, has_variant

    if name == "auto":
        name = "txv_vanilla" if has_variant("txv_vanilla") else "transfo-xl"
    config_class(name)  # an unknown name is a clear error before anything is trained
    return name, ({"mem_len": 0} if name == "transfo-xl" else {})


def plot_curves(runs: dict, path: Path, smooth: int = 20):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for (label, history), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green")):
        train = [(m["step"], m["bpc"]) for m in history if m.get("split") == "train"]
        steps, bpc = [s for s, _ in train], [b for _, b in train]
        k = max(1, min(smooth, len(bpc) // 5 or 1))
        smoothed = [sum(bpc[max(0, i - k + 1) : i + 1]) / len(bpc[max(0, i - k + 1) : i + 1]) for i in range(len(bpc))]
        ax.plot(steps, smoothed, color=color, label=f"{label} train (mean of {k})")
        valid = [(m["step"], m["valid_bpc"]) for m in history if m.get("split") == "valid"]
        if valid:
            ax.plot([s for s, _ in valid], [b for _, b in valid], "o--", color=color, label=f"{label} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per character")
    ax.set_title("hf-txvariants demo: training curves")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_txvariants  # noqa: F401

    from ..training import TrainArgs, encode, evaluate_sliding_window, evaluate_text, load_text, split_text, train
    from ..training.data import DataError

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    window = args.seg_len + args.mem_len
    if (args.batch_size * args.seg_len) % window:
        raise DataError(
            f"batch-size x seg-len ({args.batch_size * args.seg_len}) must be divisible by "
            f"seg-len + mem-len ({window}) so that both models see the same tokens per step"
        )
    base_name, base_extra = baseline_variant(args.baseline)
    common = dict(
        data=args.data,
        max_chars=args.max_chars,
        d_model=args.d_model,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_inner=args.d_inner,
        dropout=args.dropout,
        lr=args.lr,
        max_steps=args.steps,
        eval_every=max(1, args.steps // 5),
        eval_batch_size=4,
        eval_segments=4,
        seed=args.seed,
        warmup_steps=min(50, max(1, args.steps // 10)),
        progress=not args.no_progress,
        tensorboard=True,
    )
    print(f"[1/5] training Transformer-XL ({args.steps} steps, segments of {args.seg_len}, memory {args.mem_len})")
    xl = train(
        TrainArgs(
            output_dir=str(out / "transfo-xl"),
            variant="transfo-xl",
            mem_len=args.mem_len,
            seg_len=args.seg_len,
            batch_size=args.batch_size,
            **common,
        )
    )
    trained_xl = time.perf_counter()
    base_label = f"{base_name} (mem_len=0)" if base_name == "transfo-xl" else base_name
    print(f"[2/5] training the baseline {base_label} ({args.steps} steps, segments of {window}, no memory)")
    base = train(
        TrainArgs(
            output_dir=str(out / "baseline"),
            variant=base_name,
            seg_len=window,
            batch_size=args.batch_size * args.seg_len // window,
            extra_config=base_extra,
            mem_len=0,
            **{k: v for k, v in common.items()},
        )
    )
    trained_base = time.perf_counter()

    print(f"[3/5] evaluating both on the same {args.eval_chars} held-out characters, attention length {window}")
    text = load_text(args.data)
    if args.max_chars:
        text = text[: args.max_chars]
    _, valid_text = split_text(text, 0.05)
    tokens = encode(xl["tokenizer"], valid_text)[: args.eval_chars + 1]
    if len(tokens) <= window + args.seg_len:
        raise DataError(f"the held-out text has {len(tokens)} tokens, too few to evaluate windows of {window}")
    xl_model, base_model = xl["model"], base["model"]
    xl_eval = evaluate_text(xl_model, tokens, 1, args.seg_len)
    base_eval = evaluate_sliding_window(base_model, tokens[: xl_eval["tokens"] + 1], window, args.eval_batch)
    xl_speed = xl_eval["tokens"] / xl_eval["seconds"]
    base_speed = base_eval["tokens"] / base_eval["seconds"]

    print("[4/5] reloading the saved Transformer-XL with AutoModelForCausalLM.from_pretrained and generating")
    model = AutoModelForCausalLM.from_pretrained(xl["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(xl["model_dir"])
    model.eval()
    torch.manual_seed(args.seed)
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    generated = model.generate(
        ids,
        max_new_tokens=args.sample_chars,
        do_sample=True,
        top_k=20,
        temperature=0.8,
        pad_token_id=tokenizer.eos_token_id,
    )
    sample = tokenizer.decode(generated[0], skip_special_tokens=True)

    print("[5/5] plotting the training curves")
    plot = out / "training_curves.png"
    try:
        plot_curves({"Transformer-XL": xl["history"], f"baseline ({base_label})": base["history"]}, plot)
    except ImportError:
        print("      matplotlib is not installed (pip install matplotlib): no plot; the curves are in metrics.jsonl")
        plot = None

    results = {
        "transformer_xl": {
            "bpc": xl_eval["bpc"],
            "chars_per_second": xl_speed,
            "final_valid_bpc": xl["eval"][-1]["bpc"],
            "train_seconds": trained_xl - started,
            "model_dir": xl["model_dir"],
            "parameters": sum(p.numel() for p in xl_model.parameters()),
        },
        "baseline": {
            "variant": base_label,
            "bpc": base_eval["bpc"],
            "chars_per_second": base_speed,
            "final_valid_bpc": base["eval"][-1]["bpc"],
            "train_seconds": trained_base - trained_xl,
            "model_dir": base["model_dir"],
            "parameters": sum(p.numel() for p in base_model.parameters()),
        },
        "eval_chars": xl_eval["tokens"],
        "attention_length": window,
        "speed_ratio": xl_speed / base_speed,
        "sample": sample,
        "plot": str(plot) if plot else None,
        "total_seconds": time.perf_counter() - started,
    }
    (out / "demo_results.json").write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(f"Held-out characters: {xl_eval['tokens']}, attention length {window} for both models")
    print(
        f"  Transformer-XL (memory {args.mem_len}, segments {args.seg_len}): {xl_eval['bpc']:.3f} bits per character, "
        f"{xl_speed:,.0f} chars/s"
    )
    print(
        f"  baseline {base_label} (sliding window {window}):  {base_eval['bpc']:.3f} bits per character, "
        f"{base_speed:,.0f} chars/s"
    )
    print(f"  evaluation-speed ratio (Transformer-XL / baseline): {results['speed_ratio']:.1f}x")
    print(f"Saved: {xl['model_dir']} and {base['model_dir']} (Hugging Face format, with tokenizer)")
    if plot:
        print(f"Plot:  {plot}")
    print(f"Sample from the reloaded Transformer-XL:\n{sample}\n")
    print(f"Total time: {results['total_seconds']:.0f} s")
    if not math.isfinite(xl_eval["bpc"]):
        raise RuntimeError("the Transformer-XL bpc is not finite")
    return results
