"""Convert a checkpoint written by facebookresearch/adaptive-span's trainer to a `txv_adaptive_span_original` model.

    python -m conversion.adaptive_span --checkpoint checkpoints/enwik8.pt --corpus data/enwik8 \
        --output adaptive-span-enwik8 --preset enwik8
    python -m conversion.adaptive_span --checkpoint my.pt --corpus data/text8 --output my-model -- \
        --nlayers 12 --hid-sz 512 --inner-hid-sz 2048 --nheads 8 --attn-span 8192 --block-sz 512 \
        --adapt-span --adapt-span-loss 0.0000005 --adapt-span-cache

The checkpoint is the `torch.save` dict of the original's `save_checkpoint` (`iter_no`, `model` with the `module.`
prefix of DataParallel / DistributedDataParallel, `optimizer`, `logger`), in either torch container (zip, torch >= 1.6,
or the legacy one of older torch). It is read by the restricted unpickler (conversion/safe_pickle.py): nothing in it is
executed, and a file asking for anything but tensors and plain containers is refused with one line.

The hyper-parameters are not in the checkpoint: they are the original's command-line flags, given after `--` exactly
as its experiment scripts pass them (every flag of its config.py is accepted; the training-only ones are ignored),
and/or a `--preset` (the flags of experiments/<preset>.sh). With flags or a preset, the model the original would build
from them is checked against every tensor (a flag that contradicts a tensor shape is an error naming both); with
neither, the architecture is inferred from the tensors and the rest (the ramp, 32) takes the original's defaults.

The vocabulary is not in the checkpoint either: the original's data.py numbers the symbols of `train.txt` in the order
they first appear (one `<eos>` per line) and caches that as a pickled `corpus.pt`. `--corpus DIR` reads `corpus.pt`
(restricted unpickler, tensors not loaded) or else `train.txt`, and writes the tokenizer that gives the same ids to
text in the original's format (whitespace-separated symbols, a newline is `<eos>`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import OrderedDict

import torch

from hf_txvariants.cli.errors import run_guarded
from hf_txvariants.training.adaptive_span_flags import PRESETS, config_kwargs
from hf_txvariants.training.adaptive_span_flags import parse_original_flags as parse_flags

from .common import ConversionError, atomic_output_dir, parse_dtype
from .safe_pickle import PickledObject, load_torch_file

# What a checkpoint dict may pickle: plain containers and tensors only (the model is a state dict).
CHECKPOINT_CLASSES: dict = {}
# data.py's pickled corpus: the classes are recorded by name, never imported or run.
CORPUS_CLASSES = {"data": {"Corpus", "Dictionary"}}


def parse_original_flags(argv: list[str]) -> tuple[dict, set]:
    """The original's parsed parameters (its defaults where not given) and the destinations that were given."""
    try:
        return parse_flags(argv, error_class=ConversionError)
    except ConversionError as error:
        message = str(error).replace("the original's flags:", "the original's flags after --:", 1)
        raise ConversionError(message) from None


def read_checkpoint(path) -> tuple[OrderedDict, dict]:
    """The model's tensors (without the `module.` prefix) and the rest of the checkpoint dict."""
    checkpoint = load_torch_file(path, classes=CHECKPOINT_CLASSES)
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        found = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ConversionError(
            f"{path}: not a checkpoint of the original's save_checkpoint (a dict with 'model', "
            f"'iter_no', 'optimizer', 'logger'); found {found}"
        )
    state = OrderedDict()
    for name, tensor in checkpoint["model"].items():
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(f"{path}: model entry {name} is not a tensor ({type(tensor).__name__})")
        state[name[len("module.") :] if name.startswith("module.") else name] = tensor
    return state, {k: v for k, v in checkpoint.items() if k != "model"}


def _shape(state, name, path):
    if name not in state:
        raise ConversionError(f"{path}: the checkpoint has no tensor {name}")
    return tuple(state[name].shape)


def infer_architecture(state, path) -> dict:
    """What the tensors say: vocab, widths, layers, span, heads, persistent memory, adaptive span."""
    if any(name.startswith(("in_emb.emb_layers", "out_emb.out_layers")) for name in state):
        raise ConversionError(
            f"{path}: an adaptive input/output model (--adapt-io, e.g. wiki103_pers) is not "
            "supported; the converter takes the character-level models"
        )
    vocab, hidden = _shape(state, "in_emb.weight", path)
    _, head_dim, span = _shape(state, "key_pe", path)
    layers = 1 + max(int(m.group(1)) for m in (re.match(r"layers\.(\d+)\.", n) for n in state) if m)
    arch = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        head_dim=head_dim,
        attn_span=span,
        num_hidden_layers=layers,
        num_attention_heads=hidden // head_dim,
    )
    pers_key = "layers.0.attn.attn.persistent_memory.key"
    arch["pers_mem_size"] = _shape(state, pers_key, path)[2] if pers_key in state else 0
    fc1 = "layers.0.ff.fc1.weight"
    arch["inner_hidden_size"] = _shape(state, fc1, path)[0] if fc1 in state else None
    span_key = "layers.0.attn.attn.adaptive_span._mask.current_val"
    arch["adapt_span_enabled"] = span_key in state
    if arch["adapt_span_enabled"]:
        arch["num_attention_heads"] = _shape(state, span_key, path)[0]
    elif arch["pers_mem_size"]:
        arch["num_attention_heads"] = _shape(state, pers_key, path)[0]
    return arch


def cross_check(arch, flags, path):
    """Every architecture value of the original's flags must be what the tensors hold (the error names both)."""
    checks = [
        ("--hid-sz", flags["hidden_size"], arch["hidden_size"], "in_emb.weight [vocab, hidden]"),
        ("--nlayers", flags["nb_layers"], arch["num_hidden_layers"], "the layers.<i> tensors"),
        ("--attn-span", flags["attn_span"], arch["attn_span"], "key_pe [1, head_dim, attn_span]"),
        (
            "--nheads",
            flags["nb_heads"],
            arch["num_attention_heads"],
            f"key_pe [1, head_dim={arch['head_dim']}, ...] with hidden size {arch['hidden_size']}",
        ),
        (
            "--pers-mem-size",
            flags["pers_mem_size"],
            arch["pers_mem_size"],
            "layers.0.attn.attn.persistent_memory.key [heads, head_dim, size]",
        ),
        (
            "--adapt-span",
            flags["adapt_span_enabled"],
            arch["adapt_span_enabled"],
            "layers.0.attn.attn.adaptive_span._mask.current_val",
        ),
    ]
    if arch["inner_hidden_size"] is not None:
        checks.append(
            (
                "--inner-hid-sz",
                flags["inner_hidden_size"],
                arch["inner_hidden_size"],
                "layers.0.ff.fc1.weight [inner, hidden]",
            )
        )
    for flag, given, found, tensor in checks:
        if given != found:
            raise ConversionError(f"{flag} {given} contradicts the checkpoint {path}: {tensor} says {found}")
    if flags["adapt_io_enabled"]:
        raise ConversionError("--adapt-io models are not supported (adaptive input/output, e.g. wiki103_pers)")


def convert_state(state, arch, path) -> tuple[OrderedDict, dict]:
    """Our names for the original's tensors (-> source name); the original's mask templates are rebuilt, the
    persistent memory's second reference to the span parameters must equal the first."""
    converted, sources = OrderedDict(), {}

    def put(ours, theirs, tensor=None):
        converted[ours] = (state[theirs] if tensor is None else tensor).detach().to(torch.float32).clone()
        sources[ours] = theirs

    put("model.embed_tokens.weight", "in_emb.weight")
    put("model.key_pe", "key_pe")
    put("lm_head.weight", "out_emb.weight")
    put("lm_head.bias", "out_emb.bias")
    used = {"in_emb.weight", "key_pe", "out_emb.weight", "out_emb.bias"}
    for i in range(arch["num_hidden_layers"]):
        theirs, ours = f"layers.{i}.", f"model.layers.{i}."
        names = [f"attn.proj_{p}.weight" for p in ("query", "key", "val", "out")] + ["norm1.weight", "norm1.bias"]
        if arch["inner_hidden_size"] is not None:
            names += ["ff.fc1.weight", "ff.fc1.bias", "ff.fc2.weight", "ff.fc2.bias", "norm2.weight", "norm2.bias"]
        for name in names:
            if theirs + name not in state:
                raise ConversionError(f"{path}: the checkpoint has no tensor {theirs + name}")
            put(ours + name, theirs + name)
            used.add(theirs + name)
        mask = theirs + "attn.attn.adaptive_span._mask."
        if arch["adapt_span_enabled"]:
            put(ours + "attn.adaptive_span.current_val", mask + "current_val", state[mask + "current_val"].reshape(-1))
            used.update({mask + "current_val", mask + "mask_template"})
            span = arch["attn_span"]
            if _shape(state, mask + "mask_template", path) != (span,):
                raise ConversionError(
                    f"{path}: {mask}mask_template has shape {list(state[mask + 'mask_template'].shape)}"
                    f", the span {span} of key_pe needs [{span}]"
                )
        if arch["pers_mem_size"]:
            memory = theirs + "attn.attn.persistent_memory."
            put(ours + "attn.persistent_key", memory + "key")
            put(ours + "attn.persistent_value", memory + "val")
            used.update({memory + "key", memory + "val"})
            if arch["adapt_span_enabled"]:  # the same module registered twice by the original
                for leaf in ("current_val", "mask_template"):
                    alias = memory + "adaptive_span._mask." + leaf
                    if alias in state and not torch.equal(state[alias], state[mask + leaf]):
                        raise ConversionError(
                            f"{path}: {alias} differs from {mask + leaf} (one module in the original)"
                        )
                    used.add(alias)
    unused = [name for name in state if name not in used]
    if unused:
        raise ConversionError(f"{path}: tensors with no place in the model: {', '.join(unused)}")
    return converted, sources


def read_vocabulary(folder) -> list[str]:
    """The original's symbol list: `corpus.pt` (restricted unpickler) or else `train.txt` (data.py's rules)."""
    corpus_pt, train = os.path.join(folder, "corpus.pt"), os.path.join(folder, "train.txt")
    if os.path.isfile(corpus_pt):
        corpus = load_torch_file(corpus_pt, classes=CORPUS_CLASSES, load_tensors=False)
        dictionary = corpus.get("_dictionary") if isinstance(corpus, PickledObject) else None
        words = dictionary.get("idx2word") if isinstance(dictionary, PickledObject) else None
        if not isinstance(words, list) or not words:
            raise ConversionError(f"{corpus_pt}: not the original's pickled data.Corpus with a Dictionary")
        return [str(w) for w in words]
    if not os.path.isfile(train):
        raise ConversionError(f"--corpus {folder}: holds neither corpus.pt nor train.txt")
    words, seen = [], set()
    with open(train, encoding="utf8") as f:
        for line in f:
            for word in line.split() + ["<eos>"]:
                if word not in seen:
                    seen.add(word)
                    words.append(word)
    return words


def build_tokenizer(words: list[str]):
    """A word-level tokenizer of the original's format: whitespace-separated symbols, a newline is `<eos>`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(words)}
    if len(vocab) != len(words):
        raise ConversionError("the corpus vocabulary holds a symbol twice")
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace("\n", " <eos> ")
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<eos>" if "<eos>" in vocab else None,
        unk_token="<unk>" if "<unk>" in vocab else None,
    )


def convert(args):
    """The conversion (atomic: a failure leaves nothing at --output)."""
    import hf_txvariants  # noqa: F401 - registers the Auto classes
    from hf_txvariants import AdaptiveSpanOriginalConfig, AdaptiveSpanOriginalForCausalLM

    argv = (PRESETS[args.preset]["flags"].split() if args.preset else []) + list(args.original_flags)
    flags, _ = parse_original_flags(argv)
    state, _ = read_checkpoint(args.checkpoint)
    arch = infer_architecture(state, args.checkpoint)
    if argv:
        cross_check(arch, flags, args.checkpoint)
    else:  # nothing given: the tensors decide what they can, the original's defaults the rest
        flags.update(adapt_span_enabled=arch["adapt_span_enabled"])
    config = AdaptiveSpanOriginalConfig(**config_kwargs(arch, flags))
    converted, sources = convert_state(state, arch, args.checkpoint)
    model = AdaptiveSpanOriginalForCausalLM(config)
    expected = model.state_dict()
    for key, tensor in converted.items():
        if key not in expected or tuple(expected[key].shape) != tuple(tensor.shape):
            want = list(expected[key].shape) if key in expected else "no such parameter"
            raise ConversionError(f"{sources[key]} {list(tensor.shape)} -> {key}: the model needs {want}")
    missing = [k for k in expected if k not in converted]
    if missing:
        raise ConversionError(f"{args.checkpoint}: no tensor for {', '.join(missing)}")
    model.load_state_dict(converted, strict=True)
    model = model.to(parse_dtype(args.dtype)).eval()
    tokenizer = None
    if args.corpus:
        words = read_vocabulary(args.corpus)
        if len(words) != config.vocab_size:
            raise ConversionError(
                f"--corpus {args.corpus}: {len(words)} symbols, but in_emb.weight has {config.vocab_size} rows"
            )
        tokenizer = build_tokenizer(words)
    print(
        f"txv_adaptive_span_original: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, span {config.attn_span}, adaptive span {config.adapt_span_enabled}, "
        f"persistent memory {config.persistent_memory_size}, vocabulary {config.vocab_size}",
        file=sys.stderr,
    )
    with atomic_output_dir(args.output, overwrite=args.overwrite) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        card = os.path.join(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_cards", "adaptive_span_original.md"
        )
        if os.path.isfile(card):  # the authors' weights keep their license (CC-BY-NC 4.0)
            with open(card, encoding="utf-8") as f:
                text = f.read().replace("license: apache-2.0", "license: cc-by-nc-4.0", 1)
            with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
                f.write(text)
    print(f"wrote {args.output}", file=sys.stderr)


def main(argv=None, prog="python -m conversion.adaptive_span"):
    argv = list(sys.argv[1:] if argv is None else argv)
    original = []
    if "--" in argv:
        cut = argv.index("--")
        argv, original = argv[:cut], argv[cut + 1 :]
    ap = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="After --: the original's command-line flags, as its experiment scripts pass them.",
    )
    ap.add_argument("--checkpoint", required=True, help="a checkpoint written by the original's save_checkpoint")
    ap.add_argument("--output", required=True, help="the new model folder")
    ap.add_argument("--corpus", help="the original's data folder (corpus.pt or train.txt): writes the tokenizer")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="the flags of experiments/<preset>.sh")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = ap.parse_args(argv)
    args.original_flags = original
    return run_guarded(lambda: convert(args), "error: ", args.debug)


if __name__ == "__main__":
    sys.exit(main())
