"""The data pipeline of `txv train` at the papers' scale (issue 31 item 5): the vocabulary counted and the text
tokenised into the memory-mapped token cache, its peak memory, and the reload from the cache, against the original
Transformer-XL pipeline (kimiyoung/transformer-xl's `data_utils.get_lm_corpus`, `bench_original_data_pipeline.py`).

    # word level: a WikiText-103 layout (train.txt, valid.txt, test.txt) from benchmarks/make_zipf_corpus.py
    python benchmarks/bench_data_pipeline.py --data /tmp/wt103-zipf --tokenizer word \
        [--original ~/transformer-xl/pytorch]
    # byte level: one raw file (the enwik8 recipes' --tokenizer byte; 5% held out)
    python benchmarks/bench_data_pipeline.py --raw /tmp/enwik8-like.txt --tokenizer byte \
        [--original ~/transformer-xl/pytorch]

Each pipeline runs in a fresh process (imports before the clock starts) and reports its wall time and its peak
resident memory (`ru_maxrss`, imports included; for the build also the largest helper process's, as the word
vocabulary is counted by one process per CPU):
1. `build`: `plan_corpus(...).prepare()` with an empty cache (word level: the vocabulary of train.txt is counted, then
   train.txt and valid.txt are tokenised and written to the cache);
2. `reload`: the same call again, which maps the cached ids (and loads the cached vocabulary);
3. `original` (with `--original`): the original pipeline on the same files (word level: it also encodes test.txt;
   byte level: its enwik8 preparation, untimed, then its Corpus), which has no cache of its own but a pickled one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, resource, sys, time
from hf_txvariants.training import TrainArgs
from hf_txvariants.training.token_cache import plan_corpus
train_file, valid_file, tokenizer, cache = sys.argv[1:5]
args = TrainArgs(data=train_file, valid_data=valid_file or None, tokenizer=tokenizer, token_cache=cache)
start = time.perf_counter()
corpus = plan_corpus(args).prepare(warn=print)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
helper_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # the largest helper (word numbering)
print(json.dumps({"seconds": seconds, "peak_rss_gib": peak, "helper_peak_rss_gib": helper_peak,
                  "train_tokens": len(corpus.train_ids), "valid_tokens": len(corpus.valid_ids),
                  "vocab": len(corpus.tokenizer), "dtype": str(corpus.train_ids.dtype)}))
"""


def _run(command: list[str]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="a folder with train.txt and valid.txt (word level)")
    parser.add_argument("--raw", type=Path, help="one raw text file (byte level)")
    parser.add_argument("--tokenizer", default="word", choices=["word", "byte", "char"])
    parser.add_argument("--original", type=Path, help="the pytorch/ folder of a kimiyoung/transformer-xl clone")
    parser.add_argument("--cache", type=Path, help="token cache folder (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    if (args.data is None) == (args.raw is None):
        parser.error("give --data (a train.txt / valid.txt folder) or --raw (one file)")
    cache = args.cache or Path(tempfile.mkdtemp(prefix="txv-bench-cache-"))
    shutil.rmtree(cache, ignore_errors=True)
    if args.data is not None:
        train_file, valid_file = args.data / "train.txt", args.data / "valid.txt"
        size = train_file.stat().st_size
    else:
        train_file, valid_file = args.raw, None
        size = args.raw.stat().st_size
    worker = [sys.executable, "-c", WORKER, str(train_file), str(valid_file or ""), args.tokenizer, str(cache)]
    results = {"training text MB": round(size / 1e6, 1), "build": _run(worker), "reload": _run(worker)}
    if args.original is not None:
        peer = [
            sys.executable,
            str(Path(__file__).with_name("bench_original_data_pipeline.py")),
            "--original",
            str(args.original),
        ]
        peer += (
            ["--dataset", "wt103", "--data", str(args.data)]
            if args.data
            else ["--dataset", "enwik8", "--raw", str(args.raw)]
        )
        results["original"] = _run(peer)
    build, reload = results["build"], results["reload"]
    print(
        f"build: {build['seconds']:.1f} s, peak RSS {build['peak_rss_gib']:.2f} GiB "
        f"(largest helper process {build['helper_peak_rss_gib']:.2f} GiB), "
        f"{build['train_tokens'] + build['valid_tokens']:,} tokens ({build['dtype']}), vocabulary {build['vocab']:,}"
    )
    print(f"reload from the cache: {reload['seconds']:.2f} s, peak RSS {reload['peak_rss_gib']:.2f} GiB")
    if "original" in results:
        original = results["original"]
        print(
            f"original: {original['seconds']:.1f} s, peak RSS {original['peak_rss_gib']:.2f} GiB "
            f"({build['seconds'] / original['seconds']:.2f}x its time)"
        )
    print(json.dumps(results))
    if args.cache is None:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
