"""The training corpus as memory-mapped token ids, tokenised once per (data, tokenizer) and cached on disk.

`plan_corpus(args)` opens the data (every process: a bad split, column or file fails everywhere at once) and
`CorpusPlan.prepare(log)` returns the tokenizer and the token ids of the training and validation text as read-only
memory maps (run it on one process first: under DDP rank 0 tokenises while the others wait, then every rank maps the
same files). The text is streamed block by block (data.text_blocks): each block is encoded and its ids appended to
the file, so memory stays at a block, never the corpus. A word vocabulary built from the training text is counted in
the same pass that numbers the text's words (`corpus_tokenizers.WordNumbering`, the numbers in an unnamed temporary
file in the cache folder), so that text is read and split once.

Cache layout, in `--token-cache` (default `$HF_HOME/txv-token-cache`, i.e. ~/.cache/huggingface/txv-token-cache;
`TXV_TOKEN_CACHE` overrides the default): per part of the corpus
* `<name>.ids`: the ids, raw little-endian uint16 (vocabularies up to 65,536) or int32;
* `<name>.json`, written last: what they were made from (the data's fingerprint, the characters taken, the
  tokenizer's fingerprint), their dtype and count;
* `<name>.tokenizer/`: a tokenizer built from the data (`char`, `word`), with the fingerprint of its data.
`<name>` names what was asked for (the data, split, column, range and --tokenizer); the fingerprints say what it
holds. A cache made from other data or with another tokenizer is rebuilt, and a torn one (file size not the
count, unreadable header) too; each rebuild is logged with its reason. Files are written to a temporary name and
renamed (`write_atomically`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..txv_files import atomic_write
from .data import DataError, TextSource, build_char_tokenizer, count_chars, open_text_source, text_blocks
from .folder_lock import locked_atomic_directory

BUILT_TOKENIZERS = ("char", "byte", "word")
CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    if os.environ.get("TXV_TOKEN_CACHE"):
        return Path(os.environ["TXV_TOKEN_CACHE"])
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(hf_home) / "txv-token-cache"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _entry_name(source: TextSource, role: str, identity: dict) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source.description.rstrip("/")).name or "data")[:48].strip("_.")
    return f"{slug or 'data'}-{role}-{_digest(identity)[:16]}"


@dataclass
class CorpusPart:
    """The text of one part (training or validation): the characters [start, stop) of `source`, where `holdout`
    (training text with a validation fraction held out) makes the end depend on the length of the text."""

    role: str
    source: TextSource
    max_chars: int | None = None
    holdout: float | None = None  # the last `holdout` of the characters are the validation part
    shared: dict = field(default_factory=dict, repr=False)  # the text's length, counted once for both parts

    @property
    def spec(self) -> dict:
        return {"max_chars": self.max_chars, "holdout": self.holdout}

    def bounds(self) -> tuple[int, int | None]:
        if self.holdout is None:
            return 0, self.max_chars
        # as data.split_text: the last `holdout` of the characters (after --max-chars)
        if "total" not in self.shared:
            self.shared["total"] = count_chars(self.source, self.max_chars)
        total = self.shared["total"]
        cut = int(total * (1.0 - self.holdout))
        return (0, cut) if self.role == "train" else (cut, total)

    def blocks(self, line_ends: bool = False):
        """The part's text in blocks; `line_ends`: the text ends with a newline (one is added if it does not)."""
        start, stop = self.bounds()
        last = ""
        for block in text_blocks(self.source, start, stop):
            yield block
            last = block
        if line_ends and last and not last.endswith("\n"):
            yield "\n"


def _silent(message: str):
    pass


@dataclass
class _Log:
    warn: object
    inform: object


@dataclass
class PreparedCorpus:
    tokenizer: object
    train_ids: np.ndarray
    valid_ids: np.ndarray
    files: list[Path]  # the cache files in use


@dataclass
class CorpusPlan:
    train: CorpusPart
    valid: CorpusPart
    tokenizer_spec: str  # "char", "byte", "word", or what the tokenizer was loaded from
    tokenizer: object | None  # a tokenizer given (loaded); None: built by `prepare`
    cache_dir: Path
    vocab_min_freq: int = 0
    vocab_max_size: int | None = None

    def prepare(self, warn=print, inform=None) -> PreparedCorpus:
        """The tokenizer (built from the training text, or from the cache) and the token ids of both parts. `warn`
        gets each rebuild of a stale cache with its reason, `inform` (if given) what was built and how long it took."""
        log = _Log(warn, inform or _silent)
        from .corpus_tokenizers import CorpusEncoder

        numbering = None  # a word vocabulary built now comes with the training text's ids (`WordNumbering`)
        try:
            if self.tokenizer is not None:
                tokenizer = self.tokenizer
            else:
                tokenizer, numbering = self._built_tokenizer(log)
            encoder = CorpusEncoder(tokenizer)
            train_ids, train_file = self._token_ids(self.train, encoder, log, numbering)
        finally:
            if numbering is not None:
                numbering.close()
        valid_ids, valid_file = self._token_ids(self.valid, encoder, log)
        return PreparedCorpus(tokenizer, train_ids, valid_ids, [train_file, valid_file])

    # ---------------------------------------------------------------------------------------------- tokenizer
    def _built_tokenizer(self, log):
        """The tokenizer (from the cache or built from the training text), and the `WordNumbering` that built a word
        vocabulary now (else None)."""
        from .corpus_tokenizers import WordNumbering, build_byte_tokenizer

        if self.tokenizer_spec == "byte":
            return build_byte_tokenizer(), None
        settings = {"tokenizer": self.tokenizer_spec, "format": CACHE_FORMAT}
        if self.tokenizer_spec == "word":
            settings.update(min_freq=self.vocab_min_freq, max_size=self.vocab_max_size)
        identity = {"source": self.train.source.identity, "range": self.train.spec, **settings}
        folder = self.cache_dir / (_entry_name(self.train.source, "train", identity) + ".tokenizer")
        data = self.train.source.fingerprint()
        stamp = {"data": data, "range": self.train.spec, **settings}
        reason = _stale_reason(folder / "txv-source.json", stamp, what="vocabulary")
        if reason is None:
            try:
                return _load_tokenizer(folder), None
            except Exception as error:  # a damaged folder: rebuilt
                reason = f"it does not load ({type(error).__name__}: {(str(error).splitlines() or [''])[0]})"
        if reason != "missing":
            log.warn(f"rebuilding the {self.tokenizer_spec} vocabulary cached in {folder}: {reason}")
        began = time.perf_counter()
        numbering = None
        if self.tokenizer_spec == "word":
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            blocks = self.train.blocks(line_ends=True)  # as the encoder reads them
            numbering = WordNumbering(blocks, self.cache_dir, self.vocab_min_freq, self.vocab_max_size)
            tokenizer = numbering.tokenizer
        else:
            tokenizer = build_char_tokenizer(self.train.blocks())
        try:
            _save_folder_atomically(tokenizer, folder, stamp)
        except BaseException:
            if numbering is not None:
                numbering.close()
            raise
        log.inform(
            f"built a {self.tokenizer_spec} vocabulary of {len(tokenizer):,} tokens from "
            f"{self.train.source.description} in {time.perf_counter() - began:.1f}s (cached in {folder})"
        )
        return tokenizer, numbering

    # ------------------------------------------------------------------------------------------------- ids
    def _token_ids(self, part: CorpusPart, encoder, log, numbering=None) -> tuple[np.ndarray, Path]:
        """The part's ids from the cache, or encoded now and cached (`numbering`: the training text's ids, already
        numbered while its word vocabulary was counted)."""
        identity = {
            "source": part.source.identity,
            "range": part.spec,
            "role": part.role,
            "tokenizer": self.tokenizer_spec,
        }
        name = _entry_name(part.source, part.role, identity)
        ids_file, header = self.cache_dir / f"{name}.ids", self.cache_dir / f"{name}.json"
        stamp = {
            "format": CACHE_FORMAT,
            "data": part.source.fingerprint(),
            "range": part.spec,
            "role": part.role,
            "tokenizer": encoder.fingerprint,
        }
        reason = _stale_reason(header, stamp, what="tokens")
        if reason is None:
            ids, problem = _map_ids(ids_file, json.loads(header.read_text()))
            if problem is None:
                return ids, ids_file
            reason = problem
        if reason != "missing":
            log.warn(f"rebuilding the token cache {ids_file}: {reason}")
        began = time.perf_counter()
        if numbering is not None:
            id_chunks = numbering.token_ids(encoder.dtype)
        else:
            id_chunks = map(encoder.encode, part.blocks(encoder.line_ends))
        count = write_token_ids(ids_file, header, id_chunks, encoder, {**stamp, "source": part.source.description})
        log.inform(
            f"tokenised {part.source.description} ({part.role}): {count:,} tokens in "
            f"{time.perf_counter() - began:.1f}s (cached in {ids_file})"
        )
        ids, problem = _map_ids(ids_file, json.loads(header.read_text()))
        if problem is not None:
            raise DataError(f"the token cache {ids_file} just written does not read back: {problem}")
        return ids, ids_file


def write_token_ids(ids_file: Path, header: Path, id_chunks, encoder, stamp: dict) -> int:
    """Appends the token ids of `id_chunks` (arrays, in text order) to `ids_file`; then writes `header` (the JSON
    that makes the cache valid). Both are written atomically; the old header goes first, so an interruption leaves no
    valid cache."""
    header.unlink(missing_ok=True)
    dtype = encoder.dtype.newbyteorder("<")
    count = 0

    def write(f):
        nonlocal count
        for ids in id_chunks:
            if len(ids) and int(ids.max()) >= encoder.vocab_size:
                raise DataError(f"the tokenizer produced id {int(ids.max())} >= its size {encoder.vocab_size}")
            f.write(ids.astype(dtype, copy=False).tobytes())
            count += len(ids)

    atomic_write(ids_file, write)
    record = {**stamp, "dtype": dtype.str, "count": count, "bytes": count * dtype.itemsize}
    atomic_write(header, lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()))
    return count


def _stale_reason(header: Path, stamp: dict, what: str) -> str | None:
    """None when the JSON `header` matches `stamp`; else why not ("missing", other data, another tokenizer ...)."""
    if not header.exists():
        return "missing"
    try:
        saved = json.loads(header.read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as error:
        return f"its header {header.name} is unreadable ({error})"
    if saved.get("data") != stamp.get("data"):
        return "it was made from other data (the files or the dataset changed since)"
    if saved.get("tokenizer") != stamp.get("tokenizer"):
        return "it was made with another tokenizer"
    differing = sorted(k for k in stamp if saved.get(k) != stamp[k])
    if differing:
        return f"it was made with other settings ({', '.join(differing)})"
    return None


def _map_ids(ids_file: Path, record: dict) -> tuple[np.ndarray | None, str | None]:
    """The ids as a read-only (copy-on-write) memory map, or why the file does not match its header."""
    try:
        dtype, count = np.dtype(record["dtype"]), int(record["count"])
    except (KeyError, TypeError, ValueError) as error:
        return None, f"its header is incomplete ({error})"
    if not ids_file.exists():
        return None, f"{ids_file.name} is missing"
    size = ids_file.stat().st_size
    if size != count * dtype.itemsize:
        return None, f"{ids_file.name} is torn: {size} bytes, but its header says {count} ids of {dtype.itemsize} bytes"
    if count == 0:
        return np.zeros(0, dtype), None
    return np.memmap(ids_file, dtype=dtype, mode="c", shape=(count,)), None


def _load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    import hf_txvariants  # noqa: F401  (registers TransfoXLTokenizer with AutoTokenizer)

    return AutoTokenizer.from_pretrained(str(folder))


def _save_folder_atomically(tokenizer, folder: Path, stamp: dict):
    """The tokenizer saved with `txv-source.json` into `folder`, as one atomic folder (a whole new one or none)."""
    with locked_atomic_directory(folder, keep_existing=False) as staging:
        tokenizer.save_pretrained(str(staging))
        (staging / "txv-source.json").write_text(json.dumps(stamp, indent=1) + "\n")


# --------------------------------------------------------------------------------------------------------------------
def plan_corpus(args, tokenizer_source=None, resumed: bool = False) -> CorpusPlan:
    """What `prepare` will read and build for a `TrainArgs`: the training and validation text (opened and checked
    now: a missing split, column or file is a `DataError`) and the tokenizer: `tokenizer_source` (--model's) unless
    --tokenizer names one; `char`, `byte`, `word` are built, anything else is loaded with `AutoTokenizer`.
    `resumed`: `tokenizer_source` is a resumed checkpoint's tokenizer, used whatever --tokenizer says; the cache
    entries are those of the run's own --tokenizer / --model, so a resumed run maps the ids its first start made."""
    train_source = open_text_source(args.data, args.text_column, args.data_config, args.train_split, "--train-split")
    holdout = None
    if args.valid_data is not None:
        valid_source = open_text_source(
            args.valid_data, args.text_column, args.data_config, args.valid_split, "--valid-split"
        )
    elif args.valid_split is not None:
        valid_source = open_text_source(
            args.data, args.text_column, args.data_config, args.valid_split, "--valid-split"
        )
    else:
        valid_source, holdout = train_source, args.valid_fraction
    shared = {}
    train = CorpusPart("train", train_source, args.max_chars, holdout, shared)
    valid = CorpusPart("valid", valid_source, args.max_chars if holdout else None, holdout, shared)

    spec = args.tokenizer
    tokenizer = None
    if resumed:
        tokenizer = load_tokenizer(tokenizer_source)
        spec = spec or (_tokenizer_name(args.model) if args.model else "char")
    elif spec is None:
        spec = "char" if tokenizer_source is None else _tokenizer_name(tokenizer_source)
        if tokenizer_source is not None:
            tokenizer = load_tokenizer(tokenizer_source)
    elif spec not in BUILT_TOKENIZERS:
        tokenizer = load_tokenizer(spec, flag="--tokenizer")
        spec = _tokenizer_name(spec)
    cache_dir = Path(args.token_cache) if args.token_cache else default_cache_dir()
    return CorpusPlan(train, valid, spec, tokenizer, cache_dir, args.vocab_min_freq, args.vocab_max_size)


def _tokenizer_name(source) -> str:
    """A tokenizer folder by its absolute path, a Hub name as given."""
    return str(Path(source).resolve()) if Path(source).exists() else str(source)


def load_tokenizer(source, flag: str | None = None):
    """`AutoTokenizer.from_pretrained(source)` (a folder or Hub name), or a `ModelError` naming it."""
    from transformers import AutoTokenizer

    import hf_txvariants  # noqa: F401  (registers TransfoXLTokenizer)

    from .models import ModelError

    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError, TypeError) as error:
        where = f"{flag} {source}" if flag else str(source)
        raise ModelError(f"could not load the tokenizer from {where}: {str(error).splitlines()[0]}") from None
