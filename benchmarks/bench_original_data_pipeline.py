"""The peer of the data pipeline benchmark: kimiyoung/transformer-xl's own data pipeline (`data_utils.Corpus` of its
PyTorch code: count the vocabulary, build it, encode every split into LongTensors), timed and with its peak resident
memory, on the same files as `bench_data_pipeline.py`. Its code is not part of this repository: pass the `pytorch/`
folder of a clone (`--original`); it is imported from there, in this process, which measures nothing else.

    # word level, WikiText-103 style (train.txt, valid.txt, test.txt in --data; benchmarks/make_zipf_corpus.py)
    python benchmarks/bench_original_data_pipeline.py --original ~/transformer-xl/pytorch --data /tmp/wt103-zipf \
        --dataset wt103
    # byte level, enwik8 style: --raw is split 90/5/5 % into train/valid/test and written as the enwik8
    # preparation script does (each byte as its decimal value, separated by spaces, newlines kept), untimed
    python benchmarks/bench_original_data_pipeline.py --original ~/transformer-xl/pytorch --raw /tmp/text.txt \
        --dataset enwik8

Prints one JSON line: seconds, peak RSS (GiB), tokens per split, vocabulary size."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def write_enwik8_layout(raw: Path, folder: Path) -> None:
    """The enwik8 preparation: the first 90% of the bytes for training, 5% validation, 5% test, each written as the
    bytes' decimal values separated by spaces, with newline bytes kept as line breaks."""
    data = raw.read_bytes()
    n = len(data)
    cuts = {"train": data[: n * 90 // 100], "valid": data[n * 90 // 100 : n * 95 // 100], "test": data[n * 95 // 100 :]}
    newline = ord("\n")
    for name, part in cuts.items():
        with open(folder / f"{name}.txt", "w", encoding="utf-8") as f:
            f.write(" ".join(str(byte) if byte != newline else "\n" for byte in part))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--original", required=True, type=Path, help="the pytorch/ folder of a transformer-xl clone")
    parser.add_argument("--dataset", required=True, choices=["wt103", "enwik8"])
    parser.add_argument("--data", type=Path, help="folder with train.txt, valid.txt, test.txt (wt103)")
    parser.add_argument("--raw", type=Path, help="raw text file (enwik8 style)")
    args = parser.parse_args(argv)
    if not (args.original / "data_utils.py").is_file():
        parser.error(f"--original {args.original} has no data_utils.py")
    sys.path.insert(0, str(args.original))
    from data_utils import get_lm_corpus  # noqa: E402  (the original's code, from the clone)

    with tempfile.TemporaryDirectory() as scratch:
        if args.dataset == "enwik8":
            if args.raw is None:
                parser.error("--dataset enwik8 needs --raw")
            data = Path(scratch)
            write_enwik8_layout(args.raw, data)
        else:
            if args.data is None:
                parser.error("--dataset wt103 needs --data")
            data = args.data
        # get_lm_corpus caches the corpus with torch.save next to the data: copy nothing, time only the first build
        cache = Path(data) / "cache.pt"
        if cache.exists():
            parser.error(f"{cache} exists: remove it so that the original builds its corpus")
        start = time.perf_counter()
        corpus = get_lm_corpus(str(data), args.dataset)
        seconds = time.perf_counter() - start
        cache.unlink(missing_ok=True)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux
    print(
        json.dumps(
            {
                "pipeline": "kimiyoung data_utils.get_lm_corpus",
                "dataset": args.dataset,
                "seconds": round(seconds, 1),
                "peak_rss_gib": round(peak_gib, 2),
                "vocab": len(corpus.vocab),
                "tokens": {split: int(getattr(corpus, split).numel()) for split in ("train", "valid", "test")},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
