"""Convert a kimiyoung/transformer-xl TensorFlow checkpoint to an hf_txvariants Transformer-XL, without TensorFlow.

    python -m conversion.kimiyoung_tf --checkpoint pretrained_xl/tf_wt103/model/model.ckpt-0 \
        --corpus-info pretrained_xl/tf_wt103/data/corpus-info.json \
        --vocab pretrained_xl/tf_wt103/data/cache.pkl --output transfo-xl-wt103 --preset wt103

The architecture is read off the variables (layers, sizes, div_val, cutoffs, tied/untied u and v biases,
shared or separate softmax projections, proj_same_dim) and cross-checked with corpus-info.json. Optimizer
slots (``*/Adam``, ``*/Adam_1``), ``beta*_power`` and ``global_step`` are skipped. TF stores dense kernels
as [in, out] and projections as [d_emb, d_model]: they are transposed. Clusters without a projection
(proj_same_dim=False, lm1b) get an exact identity projection. The TF code always ties the softmax weights to
the embedding, uses layer-norm epsilon 1e-12, starts evaluation with ``mem_len`` zero memories and, with
same_length, lets each query see ``mem_len + 1`` keys: the config says so (memory_init="zeros",
same_length_extra_key=True) so that the converted model reproduces the TF outputs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import OrderedDict

import numpy as np
import torch

from hf_txvariants.cli.errors import run_guarded

from .common import (
    PRESETS,
    ConversionError,
    apply_eval_settings,
    atomic_output_dir,
    check_shapes,
    expected_shapes,
    finish_output,
    parse_dtype,
    progress,
    push_to_hub,
    summary,
)
from .tf_bundle import TFCheckpointReader

SKIP = re.compile(r"(/Adam(_\d+)?$|(^|/)beta[12]_power$|(^|/)global_step$|/ExponentialMovingAverage$)")
P = "transformer/"


def model_variables(reader):
    names = [n for n in reader.keys() if not SKIP.search(n)]
    stray = [n for n in names if not n.startswith(P)]
    if stray:
        raise ConversionError(
            "variables outside the transformer/ scope, not a kimiyoung Transformer-XL "
            "checkpoint or an unsupported variant: " + ", ".join(stray[:8])
        )
    return names


def infer_config(reader, corpus_info=None):
    """Architecture from the variable shapes (and corpus-info.json when given)."""
    names = set(model_variables(reader))
    shape = reader.shape

    def need(name):
        if name not in names:
            raise ConversionError(f"expected variable {name} is missing from the checkpoint")
        return shape(name)

    layers = sorted({int(m.group(1)) for n in names for m in [re.match(P + r"layer_(\d+)/", n)] if m})
    if not layers or layers != list(range(len(layers))):
        raise ConversionError(f"cannot find layers transformer/layer_0.. (found indices {layers})")
    n_layer = len(layers)
    d_model, three_hd = need(P + "layer_0/rel_attn/qkv/kernel")
    rw = need(P + "r_w_bias")
    untie_r = len(rw) == 3
    if untie_r and rw[0] != n_layer:
        raise ConversionError(f"transformer/r_w_bias has {rw[0]} layers, the checkpoint has {n_layer}")
    n_head, d_head = rw[-2], rw[-1]
    if three_hd != 3 * n_head * d_head:
        raise ConversionError(
            f"transformer/layer_0/rel_attn/qkv/kernel: {three_hd} outputs, but r_w_bias says "
            f"3 * {n_head} heads * {d_head} = {3 * n_head * d_head}"
        )
    d_inner = need(P + "layer_0/ff/layer_1/kernel")[1]

    E = P + "adaptive_embed/"
    if E + "lookup_table" in names:
        div_val = 1
        n_token, d_embed = shape(E + "lookup_table")
        emb_sizes = None
    else:
        tables = sorted(int(m.group(1)) for n in names for m in [re.match(E + r"cutoff_(\d+)/lookup_table$", n)] if m)
        if not tables:
            raise ConversionError("no transformer/adaptive_embed/lookup_table nor cutoff_i/lookup_table")
        emb_sizes = [shape(f"{E}cutoff_{i}/lookup_table") for i in tables]
        n_token = sum(r for r, _ in emb_sizes)
        d_embed = emb_sizes[0][1]
        div_val = d_embed // emb_sizes[1][1] if len(emb_sizes) > 1 else 1
        for i, (_, d) in enumerate(emb_sizes):
            if d != d_embed // div_val**i:
                raise ConversionError(
                    f"{E}cutoff_{i}/lookup_table has width {d}, div_val={div_val} needs {d_embed // div_val**i}"
                )
    S = P + "adaptive_softmax/"
    if emb_sizes is not None:
        ends = np.cumsum([0] + [r for r, _ in emb_sizes]).tolist()
        cutoffs = ends[1:-1]
    else:
        bs = sorted(int(m.group(1)) for n in names for m in [re.match(S + r"cutoff_(\d+)/b$", n)] if m)
        sizes = [shape(f"{S}cutoff_{i}/b")[0] for i in bs]
        cutoffs = np.cumsum(sizes).tolist()[:-1] if sizes else []
    if corpus_info is not None:
        ci_cut = list(corpus_info.get("cutoffs", []))[1:-1]  # tf/train_gpu.py: corpus_info["cutoffs"][1:-1]
        if corpus_info.get("vocab_size") != n_token:
            raise ConversionError(
                f"corpus-info.json says vocab_size {corpus_info.get('vocab_size')}, the embedding has {n_token} rows"
            )
        if ci_cut != cutoffs:
            raise ConversionError(f"corpus-info.json cutoffs {ci_cut} differ from the checkpoint's {cutoffs}")
    n_clusters = len(cutoffs) + 1

    # projections: tie_projs[i] <=> softmax cluster i has no own 'proj' but uses the embedding's one
    tie_projs, proj_same_dim = [], True
    for i in range(n_clusters):
        d_i = d_embed // div_val**i
        if div_val == 1:
            emb_proj = E + "proj_W" in names
            own = f"{S}cutoff_{i}/proj" in names if cutoffs else False
        else:
            emb_proj = f"{E}cutoff_{i}/proj_W" in names
            own = f"{S}cutoff_{i}/proj" in names
            if not emb_proj:
                if d_i != d_model:
                    raise ConversionError(
                        f"{E}cutoff_{i}/proj_W is missing but cluster {i} has width {d_i} != d_model {d_model}"
                    )
                proj_same_dim = False
        tie_projs.append(bool(emb_proj and not own))
    cfg = dict(
        vocab_size=int(n_token),
        cutoffs=[int(c) for c in cutoffs],
        d_model=int(d_model),
        d_embed=int(d_embed),
        n_head=int(n_head),
        d_head=int(d_head),
        d_inner=int(d_inner),
        div_val=int(div_val),
        pre_lnorm=False,
        n_layer=n_layer,
        untie_r=bool(untie_r),
        tie_projs=tie_projs,
        dropout=0.0,
        dropatt=0.0,
        layer_norm_epsilon=1e-12,
        tie_word_embeddings=True,
        memory_init="zeros",
        same_length_extra_key=True,
    )
    return cfg, dict(proj_same_dim=proj_same_dim)


def convert_state(reader, cfg, show_progress=True):
    """TF variables -> (state dict with legacy transformers names, {hf key: TF name})."""
    E, S = P + "adaptive_embed/", P + "adaptive_softmax/"
    d_model, d_embed, div_val = cfg["d_model"], cfg["d_embed"], cfg["div_val"]
    n_clusters = len(cfg["cutoffs"]) + 1
    plan = OrderedDict()  # hf key -> (tf name or None, transform)
    T = "T"
    if div_val == 1:
        plan["transformer.word_emb.emb_layers.0.weight"] = (E + "lookup_table", None)
        if d_model != d_embed:
            plan["transformer.word_emb.emb_projs.0"] = (E + "proj_W", T)
    else:
        for i in range(n_clusters):
            plan[f"transformer.word_emb.emb_layers.{i}.weight"] = (f"{E}cutoff_{i}/lookup_table", None)
            src = f"{E}cutoff_{i}/proj_W"
            plan[f"transformer.word_emb.emb_projs.{i}"] = (src, T) if src in reader else (None, ("eye", i))
    if not cfg["untie_r"]:
        plan["transformer.r_w_bias"] = (P + "r_w_bias", None)
        plan["transformer.r_r_bias"] = (P + "r_r_bias", None)
    for layer in range(cfg["n_layer"]):
        p, t = f"transformer.layers.{layer}.", f"{P}layer_{layer}/"
        plan[p + "dec_attn.qkv_net.weight"] = (t + "rel_attn/qkv/kernel", T)
        plan[p + "dec_attn.r_net.weight"] = (t + "rel_attn/r/kernel", T)
        plan[p + "dec_attn.o_net.weight"] = (t + "rel_attn/o/kernel", T)
        plan[p + "dec_attn.layer_norm.weight"] = (t + "rel_attn/LayerNorm/gamma", None)
        plan[p + "dec_attn.layer_norm.bias"] = (t + "rel_attn/LayerNorm/beta", None)
        if cfg["untie_r"]:
            plan[p + "dec_attn.r_w_bias"] = (P + "r_w_bias", ("layer", layer))
            plan[p + "dec_attn.r_r_bias"] = (P + "r_r_bias", ("layer", layer))
        plan[p + "pos_ff.CoreNet.0.weight"] = (t + "ff/layer_1/kernel", T)
        plan[p + "pos_ff.CoreNet.0.bias"] = (t + "ff/layer_1/bias", None)
        plan[p + "pos_ff.CoreNet.3.weight"] = (t + "ff/layer_2/kernel", T)
        plan[p + "pos_ff.CoreNet.3.bias"] = (t + "ff/layer_2/bias", None)
        plan[p + "pos_ff.layer_norm.weight"] = (t + "ff/LayerNorm/gamma", None)
        plan[p + "pos_ff.layer_norm.bias"] = (t + "ff/LayerNorm/beta", None)
    if cfg["cutoffs"]:
        plan["crit.cluster_weight"] = (S + "cutoff_0/cluster_W", None)
        plan["crit.cluster_bias"] = (S + "cutoff_0/cluster_b", None)
    # TF always ties the softmax weights to the embedding tables
    if div_val == 1:
        plan["crit.out_layers.0.weight"] = (E + "lookup_table", None)
        if cfg["cutoffs"]:
            plan["crit.out_layers.0.bias"] = (None, ("concat", [f"{S}cutoff_{i}/b" for i in range(n_clusters)]))
        else:
            plan["crit.out_layers.0.bias"] = (S + "bias", None)
        if d_model != d_embed:
            for i in range(n_clusters):
                own = f"{S}cutoff_{i}/proj"
                plan[f"crit.out_projs.{i}"] = (E + "proj_W", T) if cfg["tie_projs"][i] else (own, T)
    else:
        for i in range(n_clusters):
            plan[f"crit.out_layers.{i}.weight"] = (f"{E}cutoff_{i}/lookup_table", None)
            plan[f"crit.out_layers.{i}.bias"] = (f"{S}cutoff_{i}/b", None)
            own, emb = f"{S}cutoff_{i}/proj", f"{E}cutoff_{i}/proj_W"
            if cfg["tie_projs"][i]:
                plan[f"crit.out_projs.{i}"] = (emb, T)
            elif own in reader:
                plan[f"crit.out_projs.{i}"] = (own, T)
            else:
                plan[f"crit.out_projs.{i}"] = (None, ("eye", i))

    used = set()
    state, sources = OrderedDict(), {}
    cache = {}

    def load(name):
        if name not in reader:
            raise ConversionError(f"variable {name} is missing from the checkpoint")
        if name not in cache:
            cache[name] = reader.get(name)
        used.add(name)
        return cache[name]

    for key, (src, how) in progress(plan.items(), total=len(plan), desc="converting", enable=show_progress):
        if how == T:
            arr = load(src).T
        elif isinstance(how, tuple) and how[0] == "layer":
            arr = load(src)[how[1]]
        elif isinstance(how, tuple) and how[0] == "eye":
            arr = np.eye(d_model, dtype=np.float32)
            src = f"(identity: cluster {how[1]} has no projection)"
        elif isinstance(how, tuple) and how[0] == "concat":
            arr = np.concatenate([load(n) for n in how[1]])
            src = " + ".join(how[1])
        else:
            arr = load(src)
        if arr.dtype != np.float32:
            arr = arr.astype(np.float32)
        state[key] = torch.from_numpy(np.ascontiguousarray(arr))
        sources[key] = src
    leftover = sorted(set(model_variables(reader)) - used)
    if leftover:
        raise ConversionError(
            "checkpoint variables that this converter does not know where to put: " + ", ".join(leftover)
        )
    return state, sources


def read_corpus_info(path):
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except FileNotFoundError:
        raise ConversionError(f"corpus-info file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConversionError(f"{path} is not a JSON corpus-info file ({error})") from None
    if not isinstance(info, dict) or "vocab_size" not in info or "cutoffs" not in info:
        raise ConversionError(f"{path}: a corpus-info.json needs 'vocab_size' and 'cutoffs'")
    return info


def main(argv=None, prog="python -m conversion.kimiyoung_tf"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint prefix, e.g. .../model/model.ckpt-0")
    ap.add_argument("--corpus-info", help="data/corpus-info.json (vocab size and cutoffs, cross-checked)")
    ap.add_argument("--vocab", help="data/cache.pkl (Python 2 pickle, read without executing it) or cache.pt")
    ap.add_argument("--output", required=True, help="output directory (must not exist unless --overwrite)")
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="paper's evaluation settings (default: from corpus-info.json's dataset)",
    )
    ap.add_argument("--mem-len", type=int)
    ap.add_argument("--clamp-len", type=int)
    ap.add_argument("--same-length", type=lambda s: s.lower() in ("1", "true", "yes"), default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--verify-checksums", default="auto", choices=["auto", "always", "never"])
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--push-to-hub", metavar="REPO", help="upload the converted folder (with its model card)")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = ap.parse_args(argv)
    return run_guarded(lambda: convert(args), "error: ", args.debug)


def convert(args):
    """The conversion (atomic: a failure leaves nothing at --output), then the optional upload."""
    info = read_corpus_info(args.corpus_info) if args.corpus_info else None
    preset = args.preset or (info.get("dataset") if info and info.get("dataset") in PRESETS else None)
    with TFCheckpointReader(args.checkpoint, verify_checksums=args.verify_checksums) as reader:
        cfg, notes = infer_config(reader, info)
        settings = apply_eval_settings(cfg, preset, args.mem_len, args.clamp_len, args.same_length)
        summary(cfg, dict(proj_same_dim=notes["proj_same_dim"], preset=preset))
        state, sources = convert_state(reader, cfg, show_progress=not args.no_progress)
    check_shapes(state, sources, expected_shapes(cfg), what=args.checkpoint)
    with atomic_output_dir(args.output, overwrite=args.overwrite) as tmp:
        finish_output(
            tmp,
            cfg,
            state,
            sources,
            settings,
            args.vocab,
            preset,
            parse_dtype(args.dtype),
            vocab_kind=info.get("dataset") if info else None,
        )
    print(f"wrote {args.output}", file=sys.stderr)
    if args.push_to_hub:
        push_to_hub(args.output, args.push_to_hub, preset)


if __name__ == "__main__":
    sys.exit(main())
