"""The word-level data pipeline of `txv train --tokenizer word` (issue 31 items 2, 3, 7): building the vocabulary and
tokenising a corpus into the memory-mapped token cache, its peak memory, and the reload from the cache.

    python benchmarks/bench_data_pipeline.py [--words 10000000] [--vocab 1000000] [--folder DIR] [--keep]

A corpus of `--words` words is generated first (`generate_corpus`, seeded): words drawn from a Zipf distribution
(exponent 1) over a synthetic vocabulary of `--vocab` words, lines of 20-100 words, as WikiText-103's train split
(103M words, 267,735 distinct) is shaped. Then, each in a fresh process (imports before the clock starts):
1. `build`: `plan_corpus(...).prepare()` with an empty cache: the word vocabulary is counted, the training text (the
   first 95% of the characters) and the held-out 5% are tokenised and written to the cache;
2. `reload`: the same call again, which maps the cached ids (and loads the cached vocabulary).
3. `original` (the peer): the original Transformer-XL pipeline on the same file and split, in plain Python as
   kimiyoung/transformer-xl's `Vocab` does it: `count_file` line by line, `build_vocab`, `encode_file` (a LongTensor
   per line, then `torch.cat`), the whole corpus in memory, every run.
Each reports its wall time and the peak resident memory of its process (`ru_maxrss`, imports included), next to the
corpus size; the goal at 103M words is a peak RSS <= 3 GB (int32 ids: 0.4 GB). `--no-peer` skips the original.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORKER = r"""
import json, resource, sys, time
from hf_txvariants.training import TrainArgs
from hf_txvariants.training.token_cache import plan_corpus
corpus_file, cache = sys.argv[1], sys.argv[2]
args = TrainArgs(data=corpus_file, tokenizer="word", token_cache=cache)
start = time.perf_counter()
corpus = plan_corpus(args).prepare(warn=print)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_tokens": len(corpus.train_ids), "valid_tokens": len(corpus.valid_ids),
                  "vocab": len(corpus.tokenizer), "dtype": str(corpus.train_ids.dtype)}))
"""


ORIGINAL = r"""
import json, resource, sys, time
from collections import Counter, OrderedDict
import torch
corpus_file = sys.argv[1]
start = time.perf_counter()
text = open(corpus_file, encoding="utf-8").read()  # the same split as plan_corpus: the last 5% of the characters
cut = int(len(text) * 0.95)
train, valid = text[:cut], text[cut:]
del text
counter = Counter()
for line in train.splitlines():
    counter.update(line.strip().split())
idx2sym, sym2idx = [], OrderedDict()
for sym in ["<eos>", "<unk>"] + [s for s, c in counter.most_common()]:
    if sym not in sym2idx:
        sym2idx[sym] = len(idx2sym)
        idx2sym.append(sym)
def encode(part):
    return torch.cat([torch.LongTensor([sym2idx.get(s, 1) for s in line.strip().split() + ["<eos>"]])
                      for line in part.splitlines()])
train_ids, valid_ids = encode(train), encode(valid)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_tokens": len(train_ids), "valid_tokens": len(valid_ids), "vocab": len(idx2sym),
                  "dtype": str(train_ids.dtype)}))
"""


def word_forms(count: int) -> list[str]:
    """`count` distinct synthetic words (base-26 spellings of their rank)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for rank in range(count):
        word, value = "", rank
        while True:
            word = letters[value % 26] + word
            value = value // 26 - 1
            if value < 0:
                break
        words.append(word)
    return words


def generate_corpus(path: Path, words: int, vocab: int, seed: int = 0, chunk: int = 1_000_000) -> dict:
    """Writes `words` Zipf-distributed words in lines of 20-100 words to `path`, `chunk` words at a time."""
    rng = np.random.default_rng(seed)
    forms = np.array(word_forms(vocab), dtype=object)
    probabilities = 1.0 / np.arange(1, vocab + 1)
    probabilities /= probabilities.sum()
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < words:
            n = min(chunk, words - written)
            ranks = rng.choice(vocab, size=n, p=probabilities)
            lengths = rng.integers(20, 101, size=n // 20 + 2)
            ends = np.cumsum(lengths)
            ends = np.append(ends[ends < n], n)
            tokens = forms[ranks]
            start = 0
            lines = []
            for end in ends:
                lines.append(" ".join(tokens[start:end]))
                start = end
            f.write("\n".join(lines) + "\n")
            written += n
    return {"words": words, "bytes": path.stat().st_size}


def run_worker(corpus_file: Path, cache: Path, code: str = WORKER) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = f"{root}{os.pathsep}{env.get('PYTHONPATH', '')}"
    result = subprocess.run([sys.executable, "-c", code, str(corpus_file), str(cache)], env=env, capture_output=True,
                            text=True, check=False)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=10_000_000)
    parser.add_argument("--vocab", type=int, default=1_000_000, help="synthetic vocabulary the words are drawn from")
    parser.add_argument("--folder", help="where the corpus and the cache go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the corpus and the cache")
    parser.add_argument("--no-peer", action="store_true", help="skip the original pipeline")
    args = parser.parse_args(argv)
    folder = Path(args.folder or tempfile.mkdtemp(prefix="txv-bench-data-"))
    folder.mkdir(parents=True, exist_ok=True)
    corpus_file, cache = folder / f"corpus-{args.words}.txt", folder / "cache"
    started = time.perf_counter()
    if not corpus_file.exists():
        info = generate_corpus(corpus_file, args.words, args.vocab)
    else:
        info = {"words": args.words, "bytes": corpus_file.stat().st_size}
    print(f"corpus: {info['words']:,} words, {info['bytes'] / 2**20:.0f} MiB "
          f"(generated in {time.perf_counter() - started:.1f}s) at {corpus_file}")
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    build = run_worker(corpus_file, cache)
    reload = run_worker(corpus_file, cache)
    tokens = build["train_tokens"] + build["valid_tokens"]
    print(f"build (count the vocabulary, tokenise, write the cache): {build['seconds']:.1f}s, "
          f"{tokens / build['seconds'] / 1e6:.2f}M tokens/s, peak RSS {build['peak_rss_mib']:.0f} MiB; "
          f"{tokens:,} tokens ({build['dtype']}), vocabulary {build['vocab']:,}")
    print(f"reload from the cache: {reload['seconds']:.2f}s, peak RSS {reload['peak_rss_mib']:.0f} MiB")
    results = {"corpus": info, "build": build, "reload": reload}
    if not args.no_peer:
        original = results["original"] = run_worker(corpus_file, cache, ORIGINAL)
        same = (original["train_tokens"], original["valid_tokens"]) == (build["train_tokens"], build["valid_tokens"])
        print(f"original pipeline (plain Python, every run): {original['seconds']:.1f}s, peak RSS "
              f"{original['peak_rss_mib']:.0f} MiB; {original['train_tokens'] + original['valid_tokens']:,} tokens "
              f"({'the same counts' if same else 'OTHER COUNTS'}), vocabulary {original['vocab']:,}")
    print(json.dumps(results))
    if not args.keep and not args.folder:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
