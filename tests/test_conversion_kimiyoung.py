"""Conversion of the original kimiyoung/transformer-xl checkpoints (issue 3), on fixtures in the exact original
formats made by the original code (tests/fixtures/kimiyoung/make_*_fixtures.py). Offline, CPU, no TensorFlow."""

import json
import os
import pickle
import shutil
import sys
import zipfile

import numpy as np
import pytest
import torch

from conversion import evaluate as conv_eval
from conversion import kimiyoung_pytorch as kpt
from conversion import kimiyoung_tf as ktf
from conversion.common import ConversionError, check_shapes, expected_shapes
from conversion.safe_pickle import UnsafePickleError, load_plain_pickle, load_torch_file
from conversion.tf_bundle import TFBundleError, TFCheckpointReader
from conversion.vocab import convert_vocab
from hf_txvariants.txv_compat import output_cache

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "kimiyoung")
sys.path.insert(0, FIX)
import naive_txl  # noqa: E402

TF_NAMES = ["wt103", "lm1b", "enwik8"]
PT_NAMES = ["wt103", "enwik8"]
TOL = 1e-5


def _tf(name):
    d = os.path.join(FIX, f"tf_{name}")
    return (
        os.path.join(d, "model.ckpt-7"),
        os.path.join(d, "corpus-info.json"),
        np.load(os.path.join(d, "reference.npz")),
    )


def _run_model(out, ref):
    """Run the converted model segment by segment with memory; max abs diff of per-token nll and memories."""
    from transformers import AutoModelForCausalLM

    import hf_txvariants  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(out).eval()
    past, worst = None, 0.0
    with torch.no_grad():
        for s in range(ref["inputs"].shape[0]):
            x = torch.from_numpy(ref["inputs"][s]).T
            y = torch.from_numpy(ref["targets"][s]).T
            o = model(input_ids=x, cache=past, use_cache=True)
            past = output_cache(o)
            nll = -o.logits.gather(-1, y[..., None])[..., 0].T
            worst = max(worst, (nll - torch.from_numpy(ref["nll"][s])).abs().max().item())
            mems = o.mems
            assert len(mems) == model.config.n_layer
            for layer, m in enumerate(mems):  # the PyTorch original returns one more (the last output): unused
                r = torch.from_numpy(ref[f"mems_{s}_{layer}"])
                assert m.shape == r.shape, (s, layer)
                worst = max(worst, (m - r).abs().max().item())
    return worst


# ----------------------------------------------------------------------------------------- TF bundle reader
def test_tf_bundle_reader_reads_every_variable():
    prefix, _, _ = _tf("wt103")
    with TFCheckpointReader(prefix, verify_checksums="always") as r:
        names = r.keys()
        assert "global_step" in names and "beta1_power" in names
        assert any(n.endswith("/Adam_1") for n in names)
        assert int(r.get("global_step")) == 7 and r.get("global_step").dtype == np.int64
        qkv = r.get("transformer/layer_0/rel_attn/qkv/kernel")
        assert qkv.shape == (16, 48) and qkv.dtype == np.float32
        assert r.shape("transformer/r_w_bias") == (2, 2, 8)


def test_tf_bundle_reader_detects_corruption_and_bad_files(tmp_path):
    prefix, _, _ = _tf("enwik8")
    for f in os.listdir(os.path.dirname(prefix)):
        shutil.copy(os.path.join(os.path.dirname(prefix), f), tmp_path)
    data = tmp_path / "model.ckpt-7.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    r = TFCheckpointReader(tmp_path / "model.ckpt-7")
    e = r.entries["transformer/layer_0/ff/layer_1/kernel"]
    raw[e.offset + 3] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(TFBundleError, match="checksum mismatch"):
        TFCheckpointReader(tmp_path / "model.ckpt-7").get("transformer/layer_0/ff/layer_1/kernel")
    (tmp_path / "bad.index").write_bytes(b"\0" * 64)
    with pytest.raises(TFBundleError, match="magic"):
        TFCheckpointReader(tmp_path / "bad")


def test_tensorflow_is_not_needed():
    assert "tensorflow" not in sys.modules


# ----------------------------------------------------------------------------------------- TF conversion
def test_tf_infer_config():
    expect = {
        "wt103": dict(cutoffs=[10, 20], div_val=2, untie_r=True, tie_projs=[False, True, True], proj_same_dim=True),
        "lm1b": dict(cutoffs=[8, 16], div_val=2, untie_r=True, tie_projs=[False, False, False], proj_same_dim=False),
        "enwik8": dict(cutoffs=[], div_val=1, untie_r=False, tie_projs=[False], proj_same_dim=True),
    }
    for name, exp in expect.items():
        prefix, info, _ = _tf(name)
        cfg, notes = ktf.infer_config(TFCheckpointReader(prefix), ktf.read_corpus_info(info))
        assert cfg["n_layer"] == 2 and cfg["d_model"] == 16 and cfg["n_head"] == 2 and cfg["d_head"] == 8
        assert cfg["layer_norm_epsilon"] == 1e-12 and cfg["memory_init"] == "zeros" and cfg["same_length_extra_key"]
        assert {k: cfg[k] for k in ("cutoffs", "div_val", "untie_r", "tie_projs")} == {
            k: exp[k] for k in ("cutoffs", "div_val", "untie_r", "tie_projs")
        }
        assert notes["proj_same_dim"] == exp["proj_same_dim"]


@pytest.mark.parametrize("name", TF_NAMES)
def test_tf_naive_reference_parity(name):
    """The converted tensors reproduce the TF graph's outputs through an independent naive forward."""
    prefix, info, ref = _tf(name)
    r = TFCheckpointReader(prefix)
    cfg, _ = ktf.infer_config(r, ktf.read_corpus_info(info))
    sd, _ = ktf.convert_state(r, cfg, show_progress=False)
    ml, cl, sl = int(ref["mem_len"]), int(ref["clamp_len"]), bool(ref["same_length"])
    mems = [torch.zeros(ml, 2, cfg["d_model"]) for _ in range(cfg["n_layer"])]
    for s in range(ref["inputs"].shape[0]):
        h, mems = naive_txl.forward(sd, cfg, torch.from_numpy(ref["inputs"][s]), mems, ml, cl, sl, True, 1e-12)
        nll = naive_txl.nll(sd, cfg, h, torch.from_numpy(ref["targets"][s]))
        torch.testing.assert_close(nll, torch.from_numpy(ref["nll"][s]), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", TF_NAMES)
def test_tf_convert_cli_matches_original(name, tmp_path, capsys):
    prefix, info, ref = _tf(name)
    out = tmp_path / "out"
    rc = ktf.main(
        [
            "--checkpoint",
            prefix,
            "--corpus-info",
            info,
            "--output",
            str(out),
            "--no-progress",
            "--mem-len",
            str(int(ref["mem_len"])),
            "--clamp-len",
            str(int(ref["clamp_len"])),
            "--same-length",
            str(bool(ref["same_length"])),
        ]
    )
    assert rc == 0
    assert {"config.json", "model.safetensors", "generation_config.json"} <= set(os.listdir(out))
    assert "Inferred Transformer-XL config" in capsys.readouterr().err
    assert _run_model(str(out), ref) < TOL
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".out.")]  # no temp folder left


def test_tf_preset_writes_paper_settings_and_tokenizer(tmp_path):
    import json

    prefix, info, _ = _tf("wt103")
    # the wt103 fixture vocabulary has 14 symbols; the checkpoint 40: the mismatch is refused...
    rc = ktf.main(
        [
            "--checkpoint",
            prefix,
            "--corpus-info",
            info,
            "--output",
            str(tmp_path / "bad"),
            "--no-progress",
            "--vocab",
            os.path.join(FIX, "vocab", "wt103.cache.pkl"),
        ]
    )
    assert rc == 2 and not (tmp_path / "bad").exists()
    # ...and without a vocabulary the preset (from corpus-info's dataset) sets the paper's evaluation
    assert (
        ktf.main(["--checkpoint", prefix, "--corpus-info", info, "--output", str(tmp_path / "ok"), "--no-progress"])
        == 0
    )
    cfg = json.load(open(tmp_path / "ok" / "config.json"))
    gen = json.load(open(tmp_path / "ok" / "generation_config.json"))
    assert (cfg["mem_len"], cfg["clamp_len"], cfg["same_length"]) == (1600, 1000, True)
    assert gen["mem_len"] == 1600 and gen["eval_tgt_len"] == 128
    assert (tmp_path / "ok" / "README.md").exists()  # the model card


def test_shape_check_names_the_offender():
    prefix, info, _ = _tf("wt103")
    r = TFCheckpointReader(prefix)
    cfg, _ = ktf.infer_config(r, ktf.read_corpus_info(info))
    sd, src = ktf.convert_state(r, cfg, show_progress=False)
    sd["transformer.layers.1.pos_ff.CoreNet.0.weight"] = torch.zeros(31, 16)
    with pytest.raises(
        ConversionError, match=r"transformer/layer_1/ff/layer_1/kernel -> transformer\.layers\.1\.pos_ff"
    ):
        check_shapes(sd, src, expected_shapes(dict(cfg, mem_len=0)))
    bad = ktf.read_corpus_info(info)
    bad["cutoffs"] = [0, 12, 20, 40]
    with pytest.raises(ConversionError, match="cutoffs"):
        ktf.infer_config(r, bad)


def test_failed_conversion_leaves_no_folder(tmp_path, monkeypatch):
    prefix, info, _ = _tf("enwik8")

    def boom(out_dir, *a, **k):
        open(os.path.join(out_dir, "config.json"), "w").write("{}")
        raise ConversionError("simulated failure half-way")

    monkeypatch.setattr(ktf, "write_model", boom, raising=False)
    import conversion.common as common

    monkeypatch.setattr(common, "write_model", boom)
    monkeypatch.setattr(ktf, "finish_output", lambda tmp, *a, **k: boom(tmp))
    assert (
        ktf.main(["--checkpoint", prefix, "--corpus-info", info, "--output", str(tmp_path / "out"), "--no-progress"])
        == 2
    )
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------------------- PyTorch conversion
@pytest.mark.parametrize("name", PT_NAMES)
def test_pytorch_convert_matches_original(name, tmp_path):
    d = os.path.join(FIX, f"pt_{name}")
    ref = np.load(os.path.join(d, "reference.npz"))
    out = tmp_path / "out"
    assert kpt.main(["--checkpoint", os.path.join(d, "model.pt"), "--output", str(out), "--no-progress"]) == 0
    assert _run_model(str(out), ref) < TOL


@pytest.mark.exact
def test_pytorch_legacy_fp16_file():
    d = os.path.join(FIX, "pt_wt103")
    new = load_torch_file(os.path.join(d, "model.pt"))
    old = load_torch_file(os.path.join(d, "model_legacy.pt"))
    cfg, trained = kpt.infer_config(old)
    assert cfg["memory_init"] == "empty" and not cfg["same_length_extra_key"] and cfg["layer_norm_epsilon"] == 1e-5
    assert trained == dict(mem_len=6, clamp_len=4, same_length=True, tgt_len=5)
    sd_new, _ = kpt.convert_state(new, cfg, False)
    sd_old, _ = kpt.convert_state(old, cfg, False)
    for k in sd_new:
        assert sd_old[k].dtype == torch.float32
        # exact: the same fp16 values, widened to float32
        torch.testing.assert_close(sd_old[k], sd_new[k].half().float(), atol=0, rtol=0)
    # cluster rows reversed: the original reads tail cluster i from head column -i
    raw = old["_modules"]["crit"]["_parameters"]["cluster_bias"].float()
    torch.testing.assert_close(sd_old["crit.cluster_bias"], raw.flip(0))


def test_pytorch_refuses_other_attn_types(tmp_path):
    root = load_torch_file(os.path.join(FIX, "pt_enwik8", "model.pt"))
    root.state["attn_type"] = 2
    with pytest.raises(ConversionError, match="attn_type=2"):
        kpt.infer_config(root)


# ----------------------------------------------------------------------------------------- vocabularies
@pytest.mark.parametrize(
    "name,text,symbols",
    [
        ("wt103", "the game of Zürich unseen\nthe", ["the", "game", "of", "Zürich", "<unk>", "<eos>", "the"]),
        ("lm1b", "the Zürich said xyz", ["the", "Zürich", "said", "<UNK>"]),
        ("text8", "a term", ["a", "_", "t", "e", "r", "m"]),
        ("enwik8", "<t>Ü\n&", ["60", "116", "62", "195", "156", "38"]),
    ],
)
def test_cache_pkl_to_tokenizer(name, text, symbols, tmp_path, monkeypatch):
    tok, info = convert_vocab(os.path.join(FIX, "vocab", f"{name}.cache.pkl"))
    ids = tok(text)["input_ids"]
    assert [info["idx2sym"][i] for i in ids] == symbols
    tok.save_pretrained(tmp_path)
    assert not [f for f in os.listdir(tmp_path) if f.endswith((".pkl", ".pt", ".bin"))]
    from transformers import AutoTokenizer

    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle used"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle used"))
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text)["input_ids"] == ids


def test_cache_pt_to_tokenizer():
    tok, info = convert_vocab(os.path.join(FIX, "pt_wt103", "cache.pt"))
    assert info["idx2sym"][:3] == ["<eos>", "the", "="] and info["eos_token_id"] == 0
    assert tok("the game\n")["input_ids"] == [1, 4, 0]


# ----------------------------------------------------------------------------------------- booby traps
def _trap_pickle(marker, module=b"os", name=b"system"):
    cmd = f"touch {marker}".encode()
    return b"\x80\x02c" + module + b"\n" + name + b"\n(U" + bytes([len(cmd)]) + cmd + b"tR."


def _nested_trap(marker):
    """A Corpus whose Vocab state hides the trap (the call would run while unpickling the state)."""
    cmd = f"touch {marker}".encode()
    return b"\x80\x02cdata_utils\nCorpus\n)\x81}U\x05vocabcposix\nsystem\n(U" + bytes([len(cmd)]) + cmd + b"tRsb."


@pytest.mark.parametrize(
    "module,name",
    [
        (b"os", b"system"),
        (b"posix", b"system"),
        (b"builtins", b"eval"),
        (b"subprocess", b"call"),
        (b"__builtin__", b"exec"),
    ],
)
def test_booby_trapped_cache_pkl_is_refused(tmp_path, module, name):
    marker = tmp_path / "pwned"
    p = tmp_path / "cache.pkl"
    p.write_bytes(_trap_pickle(marker, module, name))
    with pytest.raises(UnsafePickleError, match=f"{module.decode()}.{name.decode()}"):
        convert_vocab(p)
    p.write_bytes(_nested_trap(marker))
    with pytest.raises(UnsafePickleError, match="posix.system"):
        load_plain_pickle(p)
    assert not marker.exists()


class _Trap:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("legacy", [False, True])
def test_booby_trapped_model_pt_is_refused(tmp_path, legacy, capsys):
    marker = tmp_path / "pwned"
    p = tmp_path / "model.pt"
    torch.save({"weights": torch.zeros(2), "trap": _Trap(marker)}, p, _use_new_zipfile_serialization=not legacy)
    assert kpt.main(["--checkpoint", str(p), "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "refusing to load global" in err and "system" in err
    assert not marker.exists() and not (tmp_path / "out").exists()
    # and as the vocabulary of a TF conversion
    torch.save(_Trap(marker), tmp_path / "cache.pt")
    with pytest.raises(UnsafePickleError):
        convert_vocab(tmp_path / "cache.pt")
    assert not marker.exists()


def test_zip_with_a_trap_in_data_pkl(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "model.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("archive/data.pkl", _trap_pickle(marker))
        z.writestr("archive/version", "3\n")
    with pytest.raises(UnsafePickleError, match="os.system"):
        load_torch_file(p)
    assert not marker.exists()


# ----------------------------------------------------------------------------------------- evaluation helper
def test_evaluate_helper_reproduces_reference_loss(tmp_path, capsys):
    prefix, info, ref = _tf("wt103")
    out = tmp_path / "m"
    assert (
        ktf.main(
            [
                "--checkpoint",
                prefix,
                "--corpus-info",
                info,
                "--output",
                str(out),
                "--no-progress",
                "--mem-len",
                str(int(ref["mem_len"])),
                "--clamp-len",
                str(int(ref["clamp_len"])),
                "--same-length",
                "true",
            ]
        )
        == 0
    )
    # the original batchify: row b of the [bsz, steps] stream is a contiguous slice of the token file
    rows = [np.concatenate([ref["inputs"][:, :, b].reshape(-1), ref["targets"][-1, -1:, b]]) for b in range(2)]
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(int(t)) for t in np.concatenate(rows)))
    capsys.readouterr()
    assert (
        conv_eval.main(
            [
                "--model",
                str(out),
                "--ids",
                str(ids),
                "--batch-size",
                "2",
                "--tgt-len",
                str(int(ref["tgt_len"])),
                "--no-progress",
            ]
        )
        == 0
    )
    out_lines = capsys.readouterr().out.splitlines()
    res = json.loads(out_lines[0])
    assert abs(res["loss"] - float(ref["nll"].mean())) < TOL
    assert "ppl" in out_lines[1]


def test_tf_convert_with_vocab_end_to_end(tmp_path):
    """Checkpoint + cache.pkl -> a folder that AutoModelForCausalLM / AutoTokenizer load and generate from."""
    import make_vocab_fixtures as mvf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    words = ["<eos>"] + [f"w{i}" for i in range(38)] + ["<unk>"]
    state = mvf.vocab(words, special=["<eos>"], lower_case=False)
    w = mvf.Py2Writer()
    w.obj(mvf.Instance("data_utils", "Corpus", dict(dataset="wt103", vocab=mvf.Instance("vocabulary", "Vocab", state))))
    (tmp_path / "cache.pkl").write_bytes(w.finish())
    prefix, info, _ = _tf("wt103")
    out = tmp_path / "out"
    assert (
        ktf.main(
            [
                "--checkpoint",
                prefix,
                "--corpus-info",
                info,
                "--vocab",
                str(tmp_path / "cache.pkl"),
                "--output",
                str(out),
                "--no-progress",
                "--mem-len",
                "8",
            ]
        )
        == 0
    )
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.eos_token_id == 0 and tok.eos_token_id == 0
    enc = tok("w1 w2 nope\nw3", return_tensors="pt")
    assert enc["input_ids"].tolist() == [[2, 3, 39, 0, 4]]
    gen = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert gen.shape == (1, 8)


# ---------------------------------------------------------------------------------------------- resource bounds
class _HugeBytes:
    def __reduce__(self):
        return (bytes, (10**13,))


def _rewrite_torch_zip(path, out, edit_pickle=lambda data: data, compress=zipfile.ZIP_STORED):
    """A copy of a torch.save zip with its data.pkl edited (or every entry compressed)."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", compression=compress) as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, edit_pickle(data) if name.endswith("data.pkl") else data)
    return out


def test_safe_pickle_refuses_huge_allocations(tmp_path):
    """bytes(10**13) from an allow-listed constructor is refused before anything is allocated; so is a memo index
    far beyond the pickle's size (the C unpickler's memo is an array that long) and a string longer than the file."""
    path = tmp_path / "huge.pkl"
    path.write_bytes(pickle.dumps(_HugeBytes(), protocol=2))
    with pytest.raises(UnsafePickleError, match=r"refusing bytes\(10000000000000\)"):
        load_plain_pickle(path)
    path.write_bytes(b"\x80\x02N\x72\xff\xff\xff\x7f.")  # LONG_BINPUT 2**31 - 1
    with pytest.raises(UnsafePickleError, match="memo index of 2147483647"):
        load_plain_pickle(path)
    path.write_bytes(b"\x80\x02Nq\x00.")  # the same with BINPUT 0: read
    assert load_plain_pickle(path) is None
    path.write_bytes(b"\x80\x02X\xff\xff\xff\x7fab.")  # BINUNICODE of 2**31 - 1 bytes in a 12-byte file
    with pytest.raises(UnsafePickleError, match="longer than what is left"):
        load_plain_pickle(path)


@pytest.mark.exact
def test_safe_pickle_checks_storage_bounds_before_building_tensors(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(4.0)}, good)
    assert torch.equal(load_torch_file(good, classes={})["w"], torch.arange(4.0))
    # the size (4,) of the tensor's view becomes (1000,): as_strided would read past the 4-element storage
    grown = _rewrite_torch_zip(good, tmp_path / "grown.pt", lambda d: d.replace(b"K\x04\x85", b"M\xe8\x03\x85", 1))
    with pytest.raises(UnsafePickleError, match="reaches past its storage of 4 elements"):
        load_torch_file(grown, classes={})
    # offset 3 with size (2,) ends one element past the storage
    shifted = _rewrite_torch_zip(
        good, tmp_path / "shifted.pt", lambda d: d.replace(b"K\x00K\x04\x85", b"K\x03K\x02\x85", 1)
    )
    with pytest.raises(UnsafePickleError, match="reaches past its storage"):
        load_torch_file(shifted, classes={})
    # a compressed archive could declare more bytes than the file holds
    deflated = _rewrite_torch_zip(good, tmp_path / "deflated.pt", compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(UnsafePickleError, match="compressed"):
        load_torch_file(deflated, classes={})


def test_opcode_scan_refuses_before_the_unpickler_runs(tmp_path):
    """scan_pickle walks every opcode first: what the C unpickler would turn into a large allocation, the extension
    registry and a pickle without STOP are refused with one error naming the file."""
    path = tmp_path / "x.pkl"
    cases = {
        b"\x80\x04\x95\xff\xff\xff\xff\x00\x00\x00\x00N.": "a frame of 4294967295",  # FRAME longer than the file
        b"\x80\x02\x8e" + (2**40).to_bytes(8, "little") + b".": "longer than what is left",  # BINBYTES8
        b"\x80\x02\x82\x01.": "refusing opcode EXT1",
        b"\x80\x02p99999999999\nN.": "memo index of 99999999999",  # text PUT
        b"\x80\x02N": "ends before its STOP",
        b"\x80\x02\xff.": "unknown pickle opcode 0xff",
    }
    for data, message in cases.items():
        path.write_bytes(data)
        with pytest.raises(UnsafePickleError, match=rf"{path}: .*{message}"):
            load_plain_pickle(path)
    path.write_bytes(pickle.dumps({"a": [1, 2.5, "x" * 300, b"y" * 70000, None, True]}, protocol=4))
    assert load_plain_pickle(path, encoding="utf-8") == {"a": [1, 2.5, "x" * 300, b"y" * 70000, None, True]}


def test_tf_convert_with_the_index_file_as_vocab_is_one_line_naming_it(tmp_path, capsys):
    """`--vocab model.ckpt-0.index` (a TensorFlow file, not a pickle) and a truncated cache.pkl: one `error:` line
    naming the file (a `KeyError: 0` traceback before, issue 24); nothing is written."""
    import make_vocab_fixtures as mvf

    prefix, info, _ = _tf("wt103")
    words = ["<eos>"] + [f"w{i}" for i in range(38)] + ["<unk>"]
    writer = mvf.Py2Writer()
    writer.obj(mvf.Instance("vocabulary", "Vocab", mvf.vocab(words, special=["<eos>"], lower_case=False)))
    truncated = tmp_path / "cache.pkl"
    truncated.write_bytes(writer.finish()[:-2])
    for vocab, expected in [(f"{prefix}.index", "unknown pickle opcode"), (str(truncated), "ends before its STOP")]:
        out = tmp_path / "out"
        assert (
            ktf.main(
                ["--checkpoint", prefix, "--corpus-info", info, "--vocab", vocab, "--output", str(out), "--no-progress"]
            )
            == 2
        )
        err = capsys.readouterr().err  # (the inferred config is printed first)
        last = err.strip().splitlines()[-1]
        assert "Traceback" not in err and last.startswith("error: ") and vocab in last and expected in last, err
        assert not out.exists()
