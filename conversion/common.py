"""Shared pieces of the Transformer-XL converters: presets, expected shapes, atomic output, summary."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections import OrderedDict

import numpy as np
import torch

from .errors import ConversionError

# The paper's evaluation settings, from kimiyoung/transformer-xl tf/sota/<name>.sh
# (tgt_len is the evaluation segment length; all four evaluate with same_length=True).
PRESETS = {
    "wt103": dict(
        mem_len=1600, clamp_len=1000, same_length=True, tgt_len=128, result="test perplexity 18.3", metric="perplexity"
    ),
    "enwik8": dict(mem_len=3800, clamp_len=1000, same_length=True, tgt_len=128, result="test bpc 0.99", metric="bpc"),
    "text8": dict(mem_len=3800, clamp_len=1000, same_length=True, tgt_len=128, result="test bpc 1.08", metric="bpc"),
    "lm1b": dict(
        mem_len=128, clamp_len=-1, same_length=True, tgt_len=32, result="test perplexity 21.8", metric="perplexity"
    ),
}


def to_torch(array):
    if isinstance(array, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array))
    return array


def expected_shapes(cfg):
    """State-dict key -> shape of a TransfoXLLMHeadModel (legacy transformers key names) for a config dict."""
    n_token, cutoffs = cfg["vocab_size"], list(cfg["cutoffs"])
    d_model, d_embed, div_val = cfg["d_model"], cfg["d_embed"], cfg["div_val"]
    n_head, d_head, d_inner, n_layer = cfg["n_head"], cfg["d_head"], cfg["d_inner"], cfg["n_layer"]
    ends = [0] + cutoffs + [n_token]
    shapes = OrderedDict()
    if div_val == 1:
        shapes["transformer.word_emb.emb_layers.0.weight"] = (n_token, d_embed)
        if d_model != d_embed:
            shapes["transformer.word_emb.emb_projs.0"] = (d_model, d_embed)
    else:
        for i in range(len(ends) - 1):
            d_i = d_embed // div_val**i
            shapes[f"transformer.word_emb.emb_layers.{i}.weight"] = (ends[i + 1] - ends[i], d_i)
            shapes[f"transformer.word_emb.emb_projs.{i}"] = (d_model, d_i)
    if not cfg["untie_r"]:
        shapes["transformer.r_w_bias"] = (n_head, d_head)
        shapes["transformer.r_r_bias"] = (n_head, d_head)
    for layer in range(n_layer):
        p = f"transformer.layers.{layer}."
        shapes[p + "dec_attn.qkv_net.weight"] = (3 * n_head * d_head, d_model)
        shapes[p + "dec_attn.r_net.weight"] = (n_head * d_head, d_model)
        shapes[p + "dec_attn.o_net.weight"] = (d_model, n_head * d_head)
        shapes[p + "dec_attn.layer_norm.weight"] = (d_model,)
        shapes[p + "dec_attn.layer_norm.bias"] = (d_model,)
        if cfg["untie_r"]:
            shapes[p + "dec_attn.r_w_bias"] = (n_head, d_head)
            shapes[p + "dec_attn.r_r_bias"] = (n_head, d_head)
        shapes[p + "pos_ff.CoreNet.0.weight"] = (d_inner, d_model)
        shapes[p + "pos_ff.CoreNet.0.bias"] = (d_inner,)
        shapes[p + "pos_ff.CoreNet.3.weight"] = (d_model, d_inner)
        shapes[p + "pos_ff.CoreNet.3.bias"] = (d_model,)
        shapes[p + "pos_ff.layer_norm.weight"] = (d_model,)
        shapes[p + "pos_ff.layer_norm.bias"] = (d_model,)
    if cutoffs:
        shapes["crit.cluster_weight"] = (len(cutoffs), d_embed)
        shapes["crit.cluster_bias"] = (len(cutoffs),)
    if div_val == 1:
        shapes["crit.out_layers.0.weight"] = (n_token, d_embed)
        shapes["crit.out_layers.0.bias"] = (n_token,)
        if d_model != d_embed:
            for i in range(len(ends) - 1):
                shapes[f"crit.out_projs.{i}"] = (d_model, d_embed)
    else:
        for i in range(len(ends) - 1):
            d_i = d_embed // div_val**i
            shapes[f"crit.out_layers.{i}.weight"] = (ends[i + 1] - ends[i], d_i)
            shapes[f"crit.out_layers.{i}.bias"] = (ends[i + 1] - ends[i],)
            shapes[f"crit.out_projs.{i}"] = (d_model, d_i)
    return shapes


def check_shapes(state, sources, expected, what="checkpoint"):
    """Every expected key present with its shape, nothing unexpected; errors name the source tensor."""
    for key, shape in expected.items():
        if key not in state:
            raise ConversionError(f"{what}: no tensor was found for {key} (expected shape {list(shape)})")
        got = tuple(state[key].shape)
        if got != tuple(shape):
            raise ConversionError(
                f"{what}: shape mismatch for {sources.get(key, key)} -> {key}: "
                f"got {list(got)}, the inferred config needs {list(shape)}"
            )
    extra = [k for k in state if k not in expected]
    if extra:
        raise ConversionError(
            f"{what}: tensors with no place in the model: " + ", ".join(f"{sources.get(k, k)} -> {k}" for k in extra)
        )


def check_against_model(state, model, sources):
    """Compare with the real model's state dict (catches any drift between expected_shapes and the model)."""
    target = model.state_dict()
    for key, value in state.items():
        if key not in target:
            raise ConversionError(f"model has no parameter {key} (from {sources.get(key, key)})")
        if tuple(target[key].shape) != tuple(value.shape):
            raise ConversionError(
                f"shape mismatch for {sources.get(key, key)} -> {key}: converted "
                f"{list(value.shape)}, model {list(target[key].shape)}"
            )
    missing = [k for k in target if k not in state and not _is_derived_buffer(k)]
    if missing:
        raise ConversionError("the converted checkpoint lacks " + ", ".join(missing))


def _is_derived_buffer(key):
    return key.endswith("inv_freq") or key.endswith("pos_emb.inv_freq")


def summary(cfg, extra=None, file=None):
    file = file or sys.stderr
    rows = [
        ("vocab_size", cfg["vocab_size"]),
        ("cutoffs", cfg["cutoffs"]),
        ("n_layer", cfg["n_layer"]),
        ("d_model", cfg["d_model"]),
        ("d_embed", cfg["d_embed"]),
        ("n_head", cfg["n_head"]),
        ("d_head", cfg["d_head"]),
        ("d_inner", cfg["d_inner"]),
        ("div_val", cfg["div_val"]),
        ("untie_r", cfg["untie_r"]),
        ("tie_projs", cfg["tie_projs"]),
        ("mem_len / clamp_len / same_length", (cfg["mem_len"], cfg["clamp_len"], cfg["same_length"])),
        ("memory_init", cfg["memory_init"]),
        ("same_length_extra_key", cfg["same_length_extra_key"]),
        ("layer_norm_epsilon", cfg["layer_norm_epsilon"]),
    ]
    rows += list((extra or {}).items())
    width = max(len(k) for k, _ in rows)
    print("Inferred Transformer-XL config:", file=file)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}", file=file)


@contextlib.contextmanager
def atomic_output_dir(output, overwrite=False):
    """Yield a temporary directory next to ``output``; it replaces ``output`` (as a whole) only if the block
    succeeds. The project's one atomic-folder helper (`atomic_directory`) does the work, under the folder's lock (a
    second conversion into it meanwhile is refused)."""
    from hf_txvariants.training.folder_lock import locked_atomic_directory

    output = os.path.abspath(output)
    if os.path.exists(output) and not overwrite:
        raise ConversionError(f"{output} already exists (use --overwrite to replace it)")
    with locked_atomic_directory(output, keep_existing=False) as staging:
        yield str(staging)


def progress(iterable, total=None, desc=None, enable=True):
    if not enable:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="tensor", file=sys.stderr)


def build_config(cfg):
    from hf_txvariants import TransfoXLConfig

    kwargs = dict(cfg)
    return TransfoXLConfig(**kwargs)


def write_model(out_dir, cfg, state, sources, dtype=torch.float32, generation=None):
    """Instantiate TransfoXLLMHeadModel, load ``state`` strictly, save it (safetensors) into ``out_dir``."""
    from transformers import GenerationConfig

    import hf_txvariants  # noqa: F401 - registers the Auto classes
    from hf_txvariants import TransfoXLLMHeadModel

    config = build_config(cfg)
    with torch.device("cpu"):
        model = TransfoXLLMHeadModel(config)
    check_against_model(state, model, sources)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not _is_derived_buffer(k)]
    if missing or unexpected:
        raise ConversionError(f"loading the converted tensors failed: missing {missing}, unexpected {unexpected}")
    for key, value in state.items():  # ties must not have silently overwritten a converted tensor
        if not torch.equal(model.state_dict()[key].float(), value.float()):
            raise ConversionError(
                f"{key} differs after loading: tied to a tensor with another value (from {sources.get(key, key)})"
            )
    model = model.to(dtype).eval()
    model.save_pretrained(out_dir)
    if generation:
        gen = GenerationConfig(**generation)
        gen.save_pretrained(out_dir)
    return model


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def model_card_path(name):
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "model_cards", f"transfo-xl-{name}.md")


def push_to_hub(out_dir, repo_id, preset=None, private=False):
    from huggingface_hub import HfApi

    card = model_card_path(preset) if preset else None
    if card and os.path.isfile(card) and not os.path.exists(os.path.join(out_dir, "README.md")):
        shutil.copyfile(card, os.path.join(out_dir, "README.md"))
    api = HfApi()
    api.create_repo(repo_id, exist_ok=True, private=private)
    api.upload_folder(
        folder_path=out_dir, repo_id=repo_id, commit_message="Convert kimiyoung/transformer-xl checkpoint"
    )
    print(f"pushed {out_dir} to https://huggingface.co/{repo_id}", file=sys.stderr)


# ------------------------------------------------------------------------------------ shared by the converters
def apply_eval_settings(cfg, preset=None, mem_len=None, clamp_len=None, same_length=None):
    settings = dict(PRESETS[preset]) if preset else dict(mem_len=0, clamp_len=-1, same_length=False, tgt_len=None)
    if mem_len is not None:
        settings["mem_len"] = mem_len
    if clamp_len is not None:
        settings["clamp_len"] = clamp_len
    if same_length is not None:
        settings["same_length"] = same_length
    cfg.update(mem_len=settings["mem_len"], clamp_len=settings["clamp_len"], same_length=settings["same_length"])
    return settings


def finish_output(tmp, cfg, state, sources, settings, vocab_path, preset, dtype, vocab_kind=None):
    from .vocab import convert_vocab

    eos = None
    tokenizer = None
    if vocab_path:
        tokenizer, vocab_info = convert_vocab(vocab_path, dataset=vocab_kind)
        if len(vocab_info["idx2sym"]) != cfg["vocab_size"]:
            raise ConversionError(f"vocabulary has {len(vocab_info['idx2sym'])} symbols, the model {cfg['vocab_size']}")
        eos = vocab_info.get("eos_token_id")
    cfg["eos_token_id"] = eos
    gen = dict(
        eos_token_id=eos,
        mem_len=settings["mem_len"],
        clamp_len=settings["clamp_len"],
        same_length=settings["same_length"],
    )
    if settings.get("tgt_len"):
        gen["eval_tgt_len"] = settings["tgt_len"]
    write_model(tmp, cfg, state, sources, dtype=dtype, generation=gen)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if preset and os.path.isfile(model_card_path(preset)):
        shutil.copyfile(model_card_path(preset), os.path.join(tmp, "README.md"))


def parse_dtype(name):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
