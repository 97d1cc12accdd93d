"""Convert a model saved by kimiyoung/transformer-xl pytorch/train.py to an hf_txvariants Transformer-XL.

    python -m conversion.kimiyoung_pytorch --checkpoint work_dir/model.pt --vocab data/wt103/cache.pt \
        --output transfo-xl-mine

train.py saves the whole module (``torch.save(model)``): a pickled ``mem_transformer.MemTransformerLM``.
It is read by a restricted unpickler (conversion/safe_pickle.py) that rebuilds tensors and records the
state of the known classes without importing or running any of them; every other global is refused.
Both torch.save formats (zip, and the legacy one of torch < 1.6) and fp16 models (--fp16) are accepted.

The original PyTorch code differs from TF and transformers in ways the config records so that the converted
model reproduces it: the first segment starts with an empty memory (memory_init="empty"), same_length lets
each query see mem_len keys (same_length_extra_key=False), layer norm epsilon is 1e-5. Its adaptive softmax
reads tail cluster i from head column -i (ours: cutoffs[0] + i - 1), so the cluster rows are reversed.
Only attn_type 0 (the paper's relative attention) is supported; other attn_types are refused.
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict

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
from .safe_pickle import MODULE_CLASSES, ArrayStub, PickledObject, load_torch_file

ATTN_TYPES = {
    0: "relative positional encoding (paper)",
    1: "learnable relative embeddings (Shaw et al.)",
    2: "absolute sinusoidal (Vaswani et al.)",
    3: "absolute learnable deeper (Al-Rfou et al.)",
}


def _modules(obj):
    return obj.get("_modules") or {}


def named_tensors(obj, prefix=""):
    """Parameters and persistent buffers of a pickled module tree, like nn.Module.state_dict()."""
    out = OrderedDict()
    for kind in ("_parameters", "_buffers"):
        skip = set(obj.get("_non_persistent_buffers_set") or ()) if kind == "_buffers" else set()
        for name, t in (obj.get(kind) or {}).items():
            if t is None or name in skip:
                continue
            if isinstance(t, ArrayStub) or not isinstance(t, torch.Tensor):
                raise ConversionError(f"{prefix}{name}: not a tensor ({type(t).__name__})")
            out[prefix + name] = t
    for name, child in _modules(obj).items():
        if child is None:
            continue
        if not isinstance(child, PickledObject):
            raise ConversionError(f"{prefix}{name}: unexpected module object {type(child).__name__}")
        out.update(named_tensors(child, f"{prefix}{name}."))
    return out


def infer_config(root):
    if not isinstance(root, PickledObject) or root.name != "MemTransformerLM":
        raise ConversionError(
            f"the checkpoint holds {root!r}, not a pickled mem_transformer.MemTransformerLM "
            "(a state_dict-only file cannot be converted without its hyper-parameters)"
        )
    st = root.state
    attn_type = st.get("attn_type", 0)
    if attn_type != 0:
        raise ConversionError(
            f"attn_type={attn_type} ({ATTN_TYPES.get(attn_type, 'unknown')}) is not supported "
            "by hf_txvariants' TransfoXL; only attn_type=0 converts"
        )
    if st.get("sample_softmax", -1) > 0:
        raise ConversionError(f"sample_softmax={st['sample_softmax']} models have no adaptive softmax to convert")
    mods = _modules(root)
    emb, crit = mods["word_emb"], mods.get("crit")
    if crit is None:
        raise ConversionError("the model has no 'crit' (ProjectedAdaptiveLogSoftmax)")
    layer0 = _modules(mods["layers"])["0"]
    attn = _modules(layer0)["dec_attn"]
    ff = _modules(layer0)["pos_ff"]
    n_token = st["n_token"]
    cutoffs = list(emb["cutoffs"])[:-1]  # AdaptiveEmbedding stores cutoffs + [n_token]
    div_val = emb["div_val"]
    d_model, d_embed = st["d_model"], st["d_embed"]
    n_clusters = len(cutoffs) + 1
    # ties are identities between pickled parameters
    emb_projs = _modules(emb).get("emb_projs")
    out_projs = _modules(crit).get("out_projs")
    ep = (emb_projs.get("_parameters") or {}) if emb_projs is not None else {}
    op = (out_projs.get("_parameters") or {}) if out_projs is not None else {}
    tie_projs = []
    for i in range(n_clusters):
        src = ep.get("0") if div_val == 1 else ep.get(str(i))
        tie_projs.append(bool(op.get(str(i)) is not None and op.get(str(i)) is src))
    out_layers = _modules(_modules(crit)["out_layers"])
    emb_layers = _modules(_modules(emb)["emb_layers"])
    tied_w = all(out_layers[k]["_parameters"]["weight"] is emb_layers[k]["_parameters"]["weight"] for k in out_layers)
    ln = _modules(attn)["layer_norm"]
    cfg = dict(
        vocab_size=n_token,
        cutoffs=cutoffs,
        d_model=d_model,
        d_embed=d_embed,
        n_head=st["n_head"],
        d_head=st["d_head"],
        d_inner=ff["d_inner"],
        div_val=div_val,
        pre_lnorm=bool(attn.get("pre_lnorm")),
        n_layer=st["n_layer"],
        untie_r=False,
        tie_projs=tie_projs,
        dropout=0.0,
        dropatt=0.0,
        layer_norm_epsilon=float(ln.get("eps", 1e-5)),
        tie_word_embeddings=tied_w,
        memory_init="empty",
        same_length_extra_key=False,
    )
    trained = dict(
        mem_len=st.get("mem_len"),
        clamp_len=st.get("clamp_len", -1),
        same_length=bool(st.get("same_length", False)),
        tgt_len=st.get("tgt_len"),
    )
    return cfg, trained


def convert_state(root, cfg, show_progress=True):
    src = named_tensors(root)
    n_clusters = len(cfg["cutoffs"]) + 1
    state, sources = OrderedDict(), {}
    dropped = {"pos_emb.inv_freq"}
    for name, t in progress(src.items(), total=len(src), desc="converting", enable=show_progress):
        if name in dropped:
            continue
        if name in ("r_w_bias", "r_r_bias"):
            key = "transformer." + name
        elif name.startswith(("word_emb.", "layers.")):
            key = "transformer." + name
        elif name.startswith("crit."):
            key = name
        else:
            raise ConversionError(f"model.pt tensor {name} has no place in TransfoXL")
        t = t.detach().to(torch.float32).clone()
        if name in ("crit.cluster_weight", "crit.cluster_bias") and n_clusters > 2:
            # original: tail cluster i reads head column -i; ours: cutoffs[0] + i - 1
            t = t.flip(0).contiguous()
        state[key] = t
        sources[key] = f"model.pt:{name}"
    if not cfg["tie_word_embeddings"]:
        pass  # out_layers weights were pickled separately and are converted as they are
    return state, sources


def main(argv=None, prog="python -m conversion.kimiyoung_pytorch"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="model.pt written by pytorch/train.py (torch.save(model))")
    ap.add_argument("--vocab", help="the cache.pt of pytorch/data_utils.py (or a TF cache.pkl)")
    ap.add_argument("--dataset", choices=sorted(PRESETS), help="vocabulary rules when the cache does not say")
    ap.add_argument("--output", required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="paper's evaluation settings")
    ap.add_argument("--mem-len", type=int)
    ap.add_argument("--clamp-len", type=int)
    ap.add_argument("--same-length", type=lambda s: s.lower() in ("1", "true", "yes"), default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--push-to-hub", metavar="REPO")
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = ap.parse_args(argv)
    return run_guarded(lambda: convert(args), "error: ", args.debug)


def convert(args):
    """The conversion (atomic: a failure leaves nothing at --output), then the optional upload."""
    root = load_torch_file(args.checkpoint, classes=MODULE_CLASSES)
    cfg, trained = infer_config(root)
    # without a preset, evaluate with the settings the model was saved with
    settings = apply_eval_settings(
        cfg,
        args.preset,
        args.mem_len if args.mem_len is not None else (None if args.preset else trained["mem_len"]),
        args.clamp_len if args.clamp_len is not None else (None if args.preset else trained["clamp_len"]),
        args.same_length if args.same_length is not None else (None if args.preset else trained["same_length"]),
    )
    summary(cfg, dict(attn_type=0, preset=args.preset, saved_tgt_len=trained["tgt_len"]))
    state, sources = convert_state(root, cfg, show_progress=not args.no_progress)
    expected = expected_shapes(cfg)
    check_shapes(state, sources, expected, what=args.checkpoint)
    with atomic_output_dir(args.output, overwrite=args.overwrite) as tmp:
        finish_output(
            tmp,
            cfg,
            state,
            sources,
            settings,
            args.vocab,
            args.preset,
            parse_dtype(args.dtype),
            vocab_kind=args.dataset,
        )
    print(f"wrote {args.output}", file=sys.stderr)
    if args.push_to_hub:
        push_to_hub(args.output, args.push_to_hub, args.preset)


if __name__ == "__main__":
    sys.exit(main())
