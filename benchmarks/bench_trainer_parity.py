"""`txv train` beside the trainers that produced the papers' numbers, step for step: kimiyoung/transformer-xl
`pytorch/train.py` (word level with train.py's wt103 adaptive softmax, and character level as for enwik8) and
facebookresearch/adaptive-span `main.py` (`txv_adaptive_span_original`), each run from a clone with the patches
listed in benchmarks/original_trainers.py.

    git clone https://github.com/kimiyoung/transformer-xl /tmp/orig/txl
    git clone https://github.com/facebookresearch/adaptive-span /tmp/orig/adaptive-span
    python benchmarks/bench_trainer_parity.py --transfo-xl /tmp/orig/txl --adaptive-span /tmp/orig/adaptive-span
    python benchmarks/bench_trainer_parity.py --report        # the tables and the plot from the stored runs

For each setting, the original runs first, saves its own initialisation at its seed (train.py: `torch.save(model)`;
main.py: its checkpoint dict), which conversion/ converts; `txv train --model CONVERTED` then trains on the same text
with the same options, mapped by the one mapping the recipes use (hf_txvariants/training/transfo_xl_flags.py,
adaptive_span_flags.py): batch, segment, memory, optimiser, clipping, schedule, warm-up, data order, evaluation.
* float64 on both sides, dropout 0: the per-step training loss and the final validation loss (`--steps-float64`);
* float32, dropout 0: the per-step relative difference (`--steps-float32`);
* the settings' dropout, float32: `--seeds` seeds each (each seed's own initialisation, shared by both sides; the
  dropout masks differ), the final validation losses;
* speed: tokens/s of both trainers on one and two threads (`--speed`), on larger models of each setting's kind,
  alternating the trainers, the median step of each run.

Every finished run is stored in `--out` (benchmarks/trainer_parity.json, a `runs` list of {trainer, setting, dtype,
seed, dropout, steps, step_losses, valid_loss, ...}) as soon as it ends: a re-run skips the runs stored. The plot:
benchmarks/trainer_parity.png.

The settings are small enough for 2 CPU cores: the word corpus is generated (benchmarks/make_zipf_corpus.py: 1M words
over 260,000 Zipf-distributed types, so that train.py's cutoffs [20000, 40000, 200000] have a fourth cluster), the
character corpus is the package's embedded text; the character runs cross an epoch (train.py's restart with an
empty memory and its shorter last segment), the adaptive-span runs a restart at a random offset.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from original_trainers import (  # noqa: E402
    ADAPTIVE_SPAN_PATCHES,
    TRANSFO_XL_PATCHES,
    patch_table,
    prepare_adaptive_span,
    prepare_transfo_xl,
    run_original,
)

# train.py / main.py flags of each setting (the run's steps, seed, dropout and evaluation interval are added per run)
SETTINGS = {
    "word": dict(
        trainer="transformer-xl",
        data="word",
        flags=dict(
            dataset="wt103",
            adaptive=True,
            div_val=2,
            n_layer=2,
            d_model=64,
            n_head=2,
            d_head=32,
            d_inner=128,
            optim="adam",
            lr=0.00025,
            warmup_step=0,
            tgt_len=16,
            mem_len=16,
            eval_tgt_len=16,
            batch_size=4,
        ),
        dropout=0.1,  # run_wt103_base.sh
    ),
    "char": dict(
        trainer="transformer-xl",
        data="char",
        flags=dict(
            dataset="enwik8",
            n_layer=3,
            d_model=64,
            n_head=4,
            d_head=16,
            d_inner=128,
            optim="adam",
            lr=0.001,
            warmup_step=20,
            tgt_len=32,
            mem_len=32,
            eval_tgt_len=16,
            batch_size=4,
            batch_chunk=2,
        ),
        dropout=0.1,  # run_enwik8_base.sh
    ),
    "span": dict(
        trainer="adaptive-span",
        data="span",
        flags=dict(
            nlayers=2,
            hid_sz=64,
            inner_hid_sz=128,
            nheads=4,
            attn_span=64,
            block_sz=16,
            batch_sz=4,
            batch_split=2,
            lr=0.07,
            momentum=0,
            optim="adagrad",
            lr_warmup=50,
            grad_clip=0.03,
            adapt_span=True,
            adapt_span_loss=0.0000005,
            adapt_span_cache=True,
        ),
        dropout=0.3,  # experiments/enwik8.sh
    ),
}
# larger models of each kind for the speed runs (the parity models are overhead-bound)
SPEED_SETTINGS = {
    "char": dict(
        n_layer=6,
        d_model=256,
        n_head=4,
        d_head=64,
        d_inner=1024,
        tgt_len=128,
        mem_len=128,
        batch_size=8,
        eval_tgt_len=128,
        batch_chunk=1,
        warmup_step=0,
    ),
    "span": dict(
        nlayers=4,
        hid_sz=256,
        inner_hid_sz=1024,
        nheads=4,
        attn_span=512,
        block_sz=128,
        batch_sz=8,
        batch_split=1,
        lr_warmup=0,
    ),
}
# the corpora: character text cut from the embedded corpus (bytes), the word corpus generated
CHAR_SPLITS = {"train": (0, 90_000), "valid": (90_000, 110_000), "test": (110_000, 130_000)}
SPAN_SPLITS = {"train": (0, 50_000), "valid": (50_000, 70_000), "test": (70_000, 90_000)}
SPEED_SPLITS = {"train": (0, 1_000_000), "valid": (1_000_000, 1_050_000), "test": (1_050_000, 1_100_000)}
WORDS = dict(train=1_000_000, valid=10_000, test=10_000, vocab=260_000, exponent=0.6)


# --------------------------------------------------------------------------------------------------------------------
# data
def write_atomically(path: Path, data: bytes):
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def prepare_char_corpus(folder: Path, splits: dict, known_only: bool = False) -> Path:
    """enwik8 as kimiyoung's and adaptive-span's prep_enwik8.py writes it (each byte as its decimal value, a newline
    byte as a line break) in NAME.txt, the raw bytes in NAME.txt.raw (what txv train reads with the converted
    tokenizer of train.py's runs). `known_only`: the validation and test text keep only the bytes the training text
    has (adaptive-span's vocabulary is the training text's, and it has no unknown symbol)."""
    from hf_txvariants.training.data import default_corpus

    folder.mkdir(parents=True, exist_ok=True)
    text = default_corpus().encode("utf-8")
    start, end = splits["train"]
    known = set(text[start:end])
    for name, (start, end) in splits.items():
        part = text[start:end]
        if known_only and name != "train":
            part = bytes(c for c in part if c in known)
        if not (folder / f"{name}.txt.raw").exists():
            prepared = " ".join(str(c) if c != ord("\n") else "\n" for c in part)
            write_atomically(folder / f"{name}.txt", prepared.encode())
            write_atomically(folder / f"{name}.txt.raw", part)
    return folder


def prepare_word_corpus(folder: Path) -> Path:
    """WikiText-103-like files: Zipf words, `<unk>` for a valid or test word the training text lacks (train.py's
    vocabulary is the training text's)."""
    from make_zipf_corpus import write_corpus

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "test.txt").exists():
        return folder
    for seed, name in enumerate(("train", "valid", "test")):
        write_corpus(folder / f"{name}.txt", WORDS[name], WORDS["vocab"], WORDS["exponent"], seed)
    known = set((folder / "train.txt").read_text().split())
    with open(folder / "train.txt", "a") as f:
        f.write(" <unk> \n")
    for name in ("valid", "test"):
        lines = [line for line in (folder / f"{name}.txt").read_text().split("\n") if line.strip()]
        text = "".join(" " + " ".join(w if w in known else "<unk>" for w in line.split()) + " \n" for line in lines)
        write_atomically(folder / f"{name}.txt", text.encode())
    return folder


def corpus_folder(work: Path, setting: str, speed: bool = False) -> Path:
    data = SETTINGS[setting]["data"]
    if data == "word":
        return prepare_word_corpus(work / "data" / "word")
    splits = SPEED_SPLITS if speed else (CHAR_SPLITS if data == "char" else SPAN_SPLITS)
    return prepare_char_corpus(work / "data" / (f"{data}-speed" if speed else data), splits, data == "span")


# --------------------------------------------------------------------------------------------------------------------
# the runs
def original_flags(setting: str, flags: dict, steps: int, seed: int, dropout: float, data: Path, work: Path) -> list:
    """The command line of the original's trainer for a run."""
    spec = SETTINGS[setting]
    if spec["trainer"] == "transformer-xl":
        values = {**flags, "max_step": steps, "seed": seed, "dropout": dropout, "dropatt": 0.0}
        argv = ["--data", str(data), "--eval-interval", str(steps), "--log-interval", str(10**9)]
        argv += ["--work_dir", str(work)]
        for name, value in values.items():
            if value is True:
                argv.append(f"--{name}")
            elif value is not False:
                argv += [f"--{name}", str(value)]
        return argv
    iterations, per_iteration = max(1, steps // 10), min(10, steps)
    values = {**flags, "niter": iterations, "nbatches": per_iteration, "dropout": dropout}
    argv = ["--data", str(data), "--checkpoint", str(work / "checkpoint.pt")]
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, str(value)]
    return argv


def txv_settings(setting: str, flags: dict, steps: int, seed: int, dropout: float) -> dict:
    """The TrainArgs fields of the same run, from the one mapping of the original's options."""
    spec = SETTINGS[setting]
    if spec["trainer"] == "transformer-xl":
        from hf_txvariants.training.transfo_xl_flags import train_py_settings

        options = {**flags, "max_step": steps, "seed": seed, "dropout": dropout, "dropatt": 0.0, "eval_interval": 0}
        fields = train_py_settings(options).train_args
        extra = {}
    else:
        from hf_txvariants.training.adaptive_span_flags import parse_original_flags, train_settings_from_flags

        argv = original_flags(setting, flags, steps, seed, dropout, Path("."), Path("."))[4:]
        parsed, _ = parse_original_flags(argv)
        fields, config = train_settings_from_flags(parsed)
        fields["seed"] = seed
        extra = {"attention_dropout": config["attention_dropout"]}  # --dropout is both dropouts in the original
    for name in ("tokenizer", "variant", "eval_every"):  # the converted model brings its tokenizer; eval at the end
        fields.pop(name, None)
    fields["extra_config"] = extra
    return fields


def txv_command(fields: dict, model: Path, data: Path, output: Path, dtype: str, raw: bool, cache: Path) -> list:
    suffix = ".txt.raw" if raw else ".txt"
    argv = [sys.executable, "-m", "hf_txvariants.cli", "train", "--model", str(model), "--output-dir", str(output)]
    argv += ["--data", str(data / f"train{suffix}"), "--valid-data", str(data / f"valid{suffix}")]
    argv += ["--dtype", dtype, "--eval-every", "0", "--token-cache", str(cache)]
    argv += ["--no-tensorboard", "--no-progress", "--no-save-model"]
    for name, value in fields.items():
        flag = "--" + name.replace("_", "-")
        if name == "extra_config":
            if value:
                argv += [flag, json.dumps(value)]
        elif value is None:
            continue
        else:
            argv += [flag, str(value)]
    return argv


def convert_initialisation(setting: str, init: Path, data: Path, output: Path, flags: dict):
    """The original's initial weights as a txv model, through conversion/."""
    if output.exists():
        return
    if SETTINGS[setting]["trainer"] == "transformer-xl":
        argv = ["-m", "conversion.kimiyoung_pytorch", "--checkpoint", str(init), "--vocab", str(data / "cache.pt")]
        argv += ["--output", str(output), "--no-progress"]
    else:
        original = original_flags(setting, flags, 1, 0, 0.0, Path("."), Path("."))[4:]
        argv = ["-m", "conversion.adaptive_span", "--checkpoint", str(init), "--corpus", str(data)]
        argv += ["--output", str(output), "--", *original]
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"conversion of {init} failed: {result.stderr[-2000:]}")


def _environment(threads: int) -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
    }


def run_txv(command: list, output: Path, threads: int) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    result = subprocess.run(command, cwd=ROOT, env=_environment(threads), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"txv train failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r["split"] == "train"]
    valid = [r for r in records if r["split"] == "valid"]
    return {
        "step_losses": [r["lm_loss"] for r in train],
        "step_lrs": [r["lr"] for r in train],
        "tokens_per_second": [r["tokens_per_second"] for r in train],
        "valid_loss": valid[-1]["valid_loss"],
        "span_penalty": [r.get("span_penalty") for r in train] if "span_penalty" in train[-1] else None,
    }


class Store:
    """The runs of `path`, each saved as soon as it ends (atomically)."""

    def __init__(self, path: Path):
        self.path = path
        self.runs = json.loads(path.read_text())["runs"] if path.exists() else []

    @staticmethod
    def key(run: dict) -> tuple:
        return (
            run["trainer"],
            run["setting"],
            run["dtype"],
            run["seed"],
            run["dropout"],
            run["steps"],
            run.get("threads"),
            run.get("kind", "parity"),
            run.get("round", 0),
        )

    def find(self, **fields) -> dict | None:
        wanted = self.key(fields)
        return next((run for run in self.runs if self.key(run) == wanted), None)

    def add(self, run: dict):
        self.runs.append(run)
        data = {
            "patches": {
                "transformer-xl": patch_table(TRANSFO_XL_PATCHES),
                "adaptive-span": patch_table(ADAPTIVE_SPAN_PATCHES),
            },
            "runs": self.runs,
        }
        write_atomically(self.path, (json.dumps(data, indent=1) + "\n").encode())


def parity_pair(
    store, codes, work, setting, dtype, steps, seed, dropout, threads=1, flags=None, kind="parity", round_=0
):
    """The original's run, then txv's on the converted initialisation; both stored."""
    spec = SETTINGS[setting]
    flags = flags or spec["flags"]
    speed = kind == "speed"
    data = corpus_folder(work, setting, speed)
    tag = f"{kind}-{setting}-{dtype}-s{seed}-d{dropout}-n{steps}-t{threads}-r{round_}"
    folder = work / "runs" / tag
    folder.mkdir(parents=True, exist_ok=True)
    common = dict(
        setting=setting, dtype=dtype, seed=seed, dropout=dropout, steps=steps, threads=threads, kind=kind, round=round_
    )
    segment = ("tgt_len", "batch_size") if spec["trainer"] == "transformer-xl" else ("block_sz", "batch_sz")
    common["tokens_per_step"] = flags[segment[0]] * flags[segment[1]]
    original = store.find(trainer="original", **common)
    init = folder / "init.pt"
    if original is None or not init.exists():
        script = "train.py" if spec["trainer"] == "transformer-xl" else "main.py"
        (folder / "work").mkdir(exist_ok=True)
        (folder / "work" / "checkpoint.pt").unlink(missing_ok=True)  # main.py resumes from an existing checkpoint
        argv = original_flags(setting, flags, steps, seed, dropout, data, folder / "work")
        load = os.getloadavg()[0]  # the machine's 1-minute load average as the run starts
        started = time.perf_counter()
        record = run_original(
            codes[spec["trainer"]],
            script,
            argv,
            folder / "original.json",
            dtype,
            init,
            seed=seed,
            threads=threads,
            log=folder / "original.log",
        )
        if original is None:
            original = {
                "trainer": "original",
                **common,
                "flags": argv,
                "wall_seconds": time.perf_counter() - started,
                "load": load,
                "step_losses": record["step_losses"],
                "step_lrs": record["step_lrs"],
                "step_seconds": record["step_seconds"],
                "valid_loss": record["valid_losses"][-1][1] if "valid_losses" in record else record["valid_loss"],
                "spans": record.get("spans"),
            }
            store.add(original)
            print(f"original {tag}: valid {original['valid_loss']:.6f}", flush=True)
    ours = store.find(trainer="txv", **common)
    if ours is None:
        converted = folder / "converted"
        convert_initialisation(setting, init, data, converted, flags)
        fields = txv_settings(setting, flags, steps, seed, dropout)
        raw = spec["data"] == "char"
        command = txv_command(fields, converted, data, folder / "txv", dtype, raw, work / "token-cache")
        load = os.getloadavg()[0]
        started = time.perf_counter()
        record = run_txv(command, folder / "txv", threads)
        ours = {
            "trainer": "txv",
            **common,
            "command": command[2:],
            "wall_seconds": time.perf_counter() - started,
            "load": load,
            **record,
        }
        store.add(ours)
        print(f"txv {tag}: valid {ours['valid_loss']:.6f}", flush=True)
    return original, ours


# --------------------------------------------------------------------------------------------------------------------
# the report
def relative_differences(a: list, b: list) -> list:
    return [abs(x - y) / abs(x) for x, y in zip(a, b)]


def report(store: Store, plot: Path | None):
    runs = store.runs
    lines = []

    def pairs(kind="parity", **fields):
        found = []
        for run in runs:
            if run["trainer"] != "original" or run.get("kind", "parity") != kind:
                continue
            if any(run[k] != v for k, v in fields.items()):
                continue
            match = [r for r in runs if r["trainer"] == "txv" and Store.key(r)[1:] == Store.key(run)[1:]]
            if match:
                found.append((run, match[0]))
        return found

    for dtype, threshold in (("float64", 1e-9), ("float32", 1e-4)):
        lines.append(f"\n{dtype}, dropout 0: each step's relative difference of the training loss; the validation loss")
        lines.append(
            f"| setting | steps | largest | median | first step above {threshold:g} | valid (original) | valid (txv) | "
            "relative |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for original, ours in pairs(dtype=dtype, dropout=0.0):
            diffs = relative_differences(original["step_losses"], ours["step_losses"])
            above = next((i + 1 for i, d in enumerate(diffs) if d > threshold), None)
            valid = abs(original["valid_loss"] - ours["valid_loss"]) / original["valid_loss"]
            lines.append(
                f"| {original['setting']} | {len(diffs)} | {max(diffs):.2e} (step {diffs.index(max(diffs)) + 1}) | "
                f"{statistics.median(diffs):.2e} | {above or 'none'} | {original['valid_loss']:.9f} | "
                f"{ours['valid_loss']:.9f} | {valid:.2e} |"
            )
    lines.append("\nwith the settings' dropout (float32): final validation loss per seed")
    lines.append(
        "| setting | dropout | seeds | original | txv | original's range | txv's mean inside | difference / its "
        "standard error |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for setting in SETTINGS:
        found = pairs(setting=setting, dtype="float32")
        found = [(o, t) for o, t in found if o["dropout"] > 0]
        if not found:
            continue
        original = [o["valid_loss"] for o, _ in found]
        ours = [t["valid_loss"] for _, t in found]
        mean = statistics.mean(ours)
        inside = min(original) <= mean <= max(original)
        # Welch: the difference of the means over its standard error (each seed's dropout masks differ)
        error = (statistics.variance(original) / len(original) + statistics.variance(ours) / len(ours)) ** 0.5
        lines.append(
            f"| {setting} | {found[0][0]['dropout']} | {len(found)} | "
            f"{statistics.mean(original):.4f} ± {statistics.stdev(original):.4f} | {mean:.4f} ± "
            f"{statistics.stdev(ours):.4f} | {min(original):.4f}-{max(original):.4f} | {'yes' if inside else 'no'} | "
            f"{(mean - statistics.mean(original)) / error:+.2f} |"
        )
    spans = [(o, t) for o, t in pairs(setting="span", dropout=0.0) if o.get("spans") and t.get("span_penalty")]
    if spans:
        lines.append("\nlearned spans (adaptive span, dropout 0): the sum over layers of each layer's mean span")
        lines.append("| dtype | steps | largest relative difference | final span sum (original) | (txv) |")
        lines.append("|---|---|---|---|---|")
        for original, ours in spans:
            # the original's spans after step k are the ones txv's step k + 1 computes its penalty with
            before = [sum(layer_spans) for layer_spans in original["spans"][:-1]]
            after = ours["span_penalty"][1:]
            diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(before, after)]
            lines.append(
                f"| {original['dtype']} | {len(diffs)} | {max(diffs):.2e} | {sum(original['spans'][-2]):.9f} | "
                f"{ours['span_penalty'][-1]:.9f} |"
            )
    speed = pairs(kind="speed")
    if speed:
        lines.append(
            "\nspeed (float32, dropout 0): the median step of each run in tokens/s; a round runs the original, then "
            "txv, so each round's ratio compares neighbours in time"
        )
        lines.append(
            "| setting | threads | rounds | original | txv | ratio (median of rounds) | rounds' ratios | load at the "
            "runs' starts |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for setting in SPEED_SETTINGS:
            for threads in (1, 2):
                found = [(o, t) for o, t in speed if o["setting"] == setting and o["threads"] == threads]
                if not found:
                    continue
                tokens = found[0][0]["tokens_per_step"]
                originals = [tokens / statistics.median(o["step_seconds"][5:]) for o, _ in found]
                ours = [statistics.median(t["tokens_per_second"][5:]) for _, t in found]
                ratios = [t / o for o, t in zip(originals, ours)]
                lines.append(
                    f"| {setting} | {threads} | {len(found)} | {statistics.median(originals):,.0f} | "
                    f"{statistics.median(ours):,.0f} | {statistics.median(ratios):.2f}x | "
                    + ", ".join(f"{ratio:.2f}x" for ratio in ratios)
                    + " | "
                    + ", ".join(f"{o['load']:.1f} / {t['load']:.1f}" for o, t in found)
                    + " |"
                )
    print("\n".join(lines))
    if plot is not None:
        draw(pairs, plot)


def draw(pairs, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(SETTINGS), figsize=(5 * len(SETTINGS), 7), squeeze=False)
    for column, setting in enumerate(SETTINGS):
        top, bottom = axes[0][column], axes[1][column]
        for original, ours in pairs(setting=setting, dropout=0.0):
            if original["dtype"] == "float32":
                top.plot(original["step_losses"], label="original (float32)", lw=1.2)
                top.plot(ours["step_losses"], "--", label="txv train (float32)", lw=1.2)
            diffs = relative_differences(original["step_losses"], ours["step_losses"])
            # points, not lines: equal steps (a difference of 0) sit on the floor of 1e-17
            bottom.semilogy([max(d, 1e-17) for d in diffs], ".", markersize=2, label=original["dtype"])
        top.set_title(f"{setting}: training loss")
        top.set_xlabel("step")
        bottom.set_title(f"{setting}: |original - txv| / original")
        bottom.set_xlabel("step")
        for axis in (top, bottom):
            if axis.lines:
                axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transfo-xl", type=Path, help="a clone (or git mirror) of kimiyoung/transformer-xl")
    ap.add_argument("--adaptive-span", type=Path, help="a clone (or git mirror) of facebookresearch/adaptive-span")
    ap.add_argument("--work", type=Path, default=Path("/tmp/txv-trainer-parity"), help="data and run folders")
    ap.add_argument("--out", type=Path, default=HERE / "trainer_parity.json")
    ap.add_argument("--plot", type=Path, default=HERE / "trainer_parity.png")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    ap.add_argument("--parts", default="float64,float32,dropout", help="float64, float32, dropout, speed")
    ap.add_argument("--steps-float64", type=int, default=300)
    ap.add_argument("--steps-float32", type=int, default=1000)
    ap.add_argument("--steps-dropout", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--speed-steps", type=int, default=30)
    ap.add_argument("--speed-rounds", type=int, default=3)
    ap.add_argument("--report", action="store_true", help="only print the tables and draw the plot")
    args = ap.parse_args(argv)
    store = Store(args.out)
    if not args.report:
        codes = {}
        if args.transfo_xl:
            codes["transformer-xl"] = prepare_transfo_xl(args.transfo_xl)
        if args.adaptive_span:
            codes["adaptive-span"] = prepare_adaptive_span(args.adaptive_span)
        parts = set(args.parts.split(","))
        for setting in args.settings.split(","):
            if SETTINGS[setting]["trainer"] not in codes:
                print(f"skipping {setting}: no clone of {SETTINGS[setting]['trainer']} given", file=sys.stderr)
                continue
            seed = 1111 if SETTINGS[setting]["trainer"] == "transformer-xl" else 0  # train.py's default seed
            if "float64" in parts:
                parity_pair(store, codes, args.work, setting, "float64", args.steps_float64, seed, 0.0)
            if "float32" in parts:
                parity_pair(store, codes, args.work, setting, "float32", args.steps_float32, seed, 0.0)
            if "dropout" in parts:
                for offset in range(args.seeds):
                    parity_pair(
                        store,
                        codes,
                        args.work,
                        setting,
                        "float32",
                        args.steps_dropout,
                        seed + offset,
                        SETTINGS[setting]["dropout"],
                    )
            if "speed" in parts and setting in SPEED_SETTINGS:
                flags = {**SETTINGS[setting]["flags"], **SPEED_SETTINGS[setting]}
                for round_ in range(args.speed_rounds):
                    for threads in (1, 2):
                        parity_pair(
                            store,
                            codes,
                            args.work,
                            setting,
                            "float32",
                            args.speed_steps,
                            seed,
                            0.0,
                            threads=threads,
                            flags=flags,
                            kind="speed",
                            round_=round_,
                        )
    report(store, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
