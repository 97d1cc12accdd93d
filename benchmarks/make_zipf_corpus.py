"""A WikiText-103-size word corpus, generated locally (the real one cannot be downloaded here): `--words` tokens
(default 103,227,021, WikiText-103's training tokens) drawn from a Zipf distribution (exponent `--exponent`, 1.0 by
default, close to English word frequencies) over `--vocab` types (default 267,735, WikiText-103's vocabulary), in
lines of 1 to 200 words (mean about 56, as WikiText-103's 1.8M lines), with an empty line after every 8th line as
WikiText's paragraphs have. Word r (0-based rank) is r written in base 26 with the letters a-z, so the frequent words
are short. Deterministic for a seed; written atomically.

    python benchmarks/make_zipf_corpus.py --output /tmp/wt103-zipf/train.txt
    python benchmarks/make_zipf_corpus.py --words 1000000 --output /tmp/small/train.txt
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

WIKITEXT_103_TRAIN_TOKENS = 103_227_021
WIKITEXT_103_VOCAB = 267_735


def word_list(vocab: int) -> np.ndarray:
    """The `vocab` word strings, word r = r in base 26 over a-z ('a', 'b', ..., 'z', 'ba', ...)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = []
    for rank in range(vocab):
        digits = []
        while True:
            rank, digit = divmod(rank, 26)
            digits.append(letters[digit])
            if rank == 0:
                break
        words.append("".join(reversed(digits)))
    return np.array(words, dtype=object)


def write_corpus(output: Path, words: int, vocab: int, exponent: float, seed: int, chunk: int = 4_000_000):
    rng = np.random.default_rng(seed)
    probabilities = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    cumulative = np.cumsum(probabilities / probabilities.sum())
    names = word_list(vocab)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    written, line_index = 0, 0
    with open(partial, "w", encoding="utf-8") as f:
        while written < words:
            count = min(chunk, words - written)
            ranks = np.searchsorted(cumulative, rng.random(count), side="right").clip(max=vocab - 1)
            lengths = rng.integers(1, 112, size=count // 20 + 2)  # mean 56
            ends = np.cumsum(lengths)
            ends = np.concatenate([ends[ends < count], [count]])
            tokens = names[ranks]
            lines = []
            start = 0
            for end in ends:
                lines.append(" " + " ".join(tokens[start:end]) + " \n")  # WikiText's lines start and end with a space
                line_index += 1
                if line_index % 8 == 0:
                    lines.append(" \n")
                start = end
            f.write("".join(lines))
            written += count
    os.replace(partial, output)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--words", type=int, default=WIKITEXT_103_TRAIN_TOKENS)
    parser.add_argument("--vocab", type=int, default=WIKITEXT_103_VOCAB)
    parser.add_argument("--exponent", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.words < 1 or args.vocab < 1:
        parser.error("--words and --vocab must be positive")
    start = time.perf_counter()
    write_corpus(args.output, args.words, args.vocab, args.exponent, args.seed)
    size = args.output.stat().st_size
    print(
        f"{args.output}: {args.words:,} words, {size / 1e6:,.0f} MB, in {time.perf_counter() - start:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
