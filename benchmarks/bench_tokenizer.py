"""Transformer-XL tokenizer: loading a wt103-size legacy folder and tokenizing a page, hf_txvariants against
transformers 4.46.3's TransfoXLTokenizer on the same folder (issue 22: at most 1.5x).

    python benchmarks/bench_tokenizer.py --legacy-python /work/scratch-tok/venv/bin/python [--words 267735]
        [--rounds 3]

`--legacy-python` is an interpreter with transformers==4.46.3, torch and sacremoses (a throwaway venv outside the
repository). That interpreter writes the folder itself (`TransfoXLTokenizer.save_pretrained`: vocab.pkl holding the
tokenizer's __dict__, the counts included, as the real wt103 file does) with a synthetic vocabulary of `--words`
symbols (the real wt103 has 267,735). Each measurement runs in a fresh process (imports done before the clock starts):
`from_pretrained(folder)` (ours through AutoTokenizer: the restricted unpickler reads vocab.pkl; 4.46.3: pickle.load,
allowed with TRUST_REMOTE_CODE=True), then `encode(page)` of PAGE, wall-clock and CPU time of the process (the CPU
time is the steadier figure on a shared machine); the two alternate for `--rounds` rounds and the best round of each
measure is kept. Both must give the same ids.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PAGE = (
    "The game's first season was released in 1991, selling 23,000 copies in its first week; by 1993 it had sold "
    "1,234,567. It was the first time that a state-of-the-art engine ran on home computers in Europe and the United "
    'States, and critics praised its music, its art and its "unusually humane" story (the director, who later left '
    "the studio, called it \"a record of a year\"). She wasn't there, but he's sure they'll come back: the sequel "
    "grossed $12.5 million, about 40% more than expected, and ran 1.80 times faster on the same machines. "
) * 6  # about 3,000 characters: one page

WORKER = r"""
import json, os, sys, time
os.environ["TRUST_REMOTE_CODE"] = "True"
os.environ["HF_HUB_OFFLINE"] = "1"
import warnings; warnings.filterwarnings("ignore")
import transformers
transformers.logging.set_verbosity_error()
mode, folder, page = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "legacy":
    from transformers.models.deprecated.transfo_xl.tokenization_transfo_xl import TransfoXLTokenizer as Loader
else:
    import hf_txvariants
    from transformers import AutoTokenizer as Loader
import sacremoses  # imported by both before the clock starts
start, start_cpu = time.perf_counter(), time.process_time()
tokenizer = Loader.from_pretrained(folder)
loaded, loaded_cpu = time.perf_counter(), time.process_time()
ids = tokenizer.encode(page)
done, done_cpu = time.perf_counter(), time.process_time()
print(json.dumps({"load_s": loaded - start, "encode_s": done - loaded, "load_cpu_s": loaded_cpu - start_cpu,
                  "encode_cpu_s": done_cpu - loaded_cpu, "ids": ids, "class": type(tokenizer).__name__,
                  "vocab": len(tokenizer)}))
"""

MAKE_FOLDER = r"""
import collections, os, random, sys
os.environ["TRUST_REMOTE_CODE"] = "True"
import warnings; warnings.filterwarnings("ignore")
import transformers
transformers.logging.set_verbosity_error()
from transformers.models.deprecated.transfo_xl.tokenization_transfo_xl import TransfoXLTokenizer
folder, size, page = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(0)
words = ["<eos>", "<unk>"]
words += [w for w in dict.fromkeys(TransfoXLTokenizer(vocab_file=None).moses_pipeline(page)) if w not in words]
seen = set(words)
letters = "abcdefghijklmnopqrstuvwxyz"
while len(words) < size:
    word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 12)))
    word = word.capitalize() if rng.random() < 0.1 else word
    if word not in seen:
        seen.add(word)
        words.append(word)
os.makedirs(folder, exist_ok=True)
vocab_txt = os.path.join(folder, "vocab.txt")
with open(vocab_txt, "w", encoding="utf-8") as f:
    f.write("".join(w + "\n" for w in words))
tokenizer = TransfoXLTokenizer(vocab_file=vocab_txt)
tokenizer.counter = collections.Counter({w: rng.randint(3, 10**6) for w in words})
os.remove(vocab_txt)
tokenizer.vocab_file = None
tokenizer.init_kwargs.pop("vocab_file", None)
tokenizer.save_pretrained(folder)
print(os.path.getsize(os.path.join(folder, "vocab.pkl")))
"""


def run(python, script, *args):
    result = subprocess.run([python, "-c", script, *args], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return result.stdout.strip().splitlines()[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", required=True, help="interpreter with transformers==4.46.3 and sacremoses")
    parser.add_argument("--words", type=int, default=267735, help="vocabulary size (wt103: 267,735)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "wt103-size")
        pkl_bytes = int(run(args.legacy_python, MAKE_FOLDER, folder, str(args.words), PAGE))
        best = {}
        ids = {}
        for round_ in range(args.rounds):
            for name, python in (("transformers 4.46.3", args.legacy_python), ("hf_txvariants", sys.executable)):
                out = json.loads(
                    run(python, WORKER, "legacy" if python == args.legacy_python else "ours", folder, PAGE)
                )
                ids[name] = out["ids"]
                out["total_s"] = out["load_s"] + out["encode_s"]
                out["total_cpu_s"] = out["load_cpu_s"] + out["encode_cpu_s"]
                previous = best.setdefault(name, {})
                for key, value in out.items():  # the best round of each measure
                    if key.endswith("_s") and (key not in previous or value < previous[key]):
                        previous[key] = value
                previous["ids"] = out["ids"]
                print(
                    f"round {round_}: {name:20s} load {out['load_s']:.3f} s, encode {out['encode_s']:.3f} s",
                    file=sys.stderr,
                )
        same = ids["hf_txvariants"] == ids["transformers 4.46.3"]
        legacy, ours = best["transformers 4.46.3"], best["hf_txvariants"]
        print(
            f"\nvocabulary {args.words:,} words, vocab.pkl {pkl_bytes / 1e6:.1f} MB, page {len(PAGE):,} characters "
            f"-> {len(ours['ids'])} tokens; same ids: {same}; best of {args.rounds} rounds"
        )
        print("| measure | transformers 4.46.3 | hf_txvariants | ours / 4.46.3 |")
        print("|---|---|---|---|")
        for key, label in (
            ("load_s", "from_pretrained, wall (s)"),
            ("encode_s", "encode one page, wall (s)"),
            ("total_s", "load + encode, wall (s)"),
            ("load_cpu_s", "from_pretrained, CPU (s)"),
            ("encode_cpu_s", "encode one page, CPU (s)"),
            ("total_cpu_s", "load + encode, CPU (s)"),
        ):
            print(f"| {label} | {legacy[key]:.3f} | {ours[key]:.3f} | {ours[key] / legacy[key]:.2f}x |")
        if not same:
            sys.exit("the two tokenizers gave different ids")


if __name__ == "__main__":
    main()
