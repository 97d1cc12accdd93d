"""The legacy Transformer-XL tokenizer (issue 22): a folder saved by transformers 4.46.3 loads with AutoTokenizer /
AutoModelForCausalLM / pipeline and reproduces 4.46.3's tokens, decodes and greedy generations (fixtures made by
4.46.3 itself: tests/fixtures/make_transfo_xl_tokenizer_fixtures.py); its vocab.pkl is read without executing
anything; the safe re-save and `txv upgrade-legacy` give the same tokenizer and model, also as remote code."""

from __future__ import annotations

import collections
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

import hf_txvariants  # noqa: F401 - registers the Auto classes
from hf_txvariants import TransfoXLTokenizer
from hf_txvariants.cli import main as txv_main
from hf_txvariants.tokenization_transfo_xl import read_legacy_vocabulary
from hf_txvariants.txv_safe_pickle import (
    TRANSFO_XL_TOKENIZER_CLASSES,
    PickledObject,
    UnsafePickleError,
    load_plain_pickle,
)

FIXTURES = Path(__file__).parent / "fixtures" / "transfo_xl_tokenizer"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))
WT103 = FIXTURES / "wt103_like"
FOLDERS = ["wt103_like", "lower_2019"]


def assert_tokenizes_as_4_46_3(tokenizer, reference):
    """Every field the 4.46.3 fixture recorded, compared exactly."""
    for row in reference["texts"]:
        text = row["text"]
        assert tokenizer.tokenize(text) == row["tokens"], text
        assert tokenizer.encode(text) == row["ids"], text
        assert tokenizer.decode(row["ids"]) == row["decode"], text
        assert tokenizer.decode(row["ids"], skip_special_tokens=True) == row["decode_skip_special"], text
        assert tokenizer.convert_tokens_to_string(row["tokens"]) == row["convert_tokens_to_string"], text
    assert tokenizer([row["text"] for row in reference["texts"]])["input_ids"] == reference["batch_input_ids"]
    assert len(tokenizer) == reference["len"] and tokenizer.vocab_size == reference["vocab_size"]
    for name, value in {**reference["special_tokens"], **reference["special_ids"]}.items():
        assert getattr(tokenizer, name) == value, name
    assert tokenizer.additional_special_tokens == reference["additional_special_tokens"]
    assert tokenizer.additional_special_tokens_ids == reference["additional_special_tokens_ids"]
    assert tokenizer.all_special_tokens == reference["all_special_tokens"]
    assert tokenizer.lower_case == reference["lower_case"] and tokenizer.delimiter == reference["delimiter"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_auto_tokenizer_reproduces_4_46_3_on_its_legacy_folder(folder):
    """wt103_like: vocab.pkl holding 4.46.3's pickled __dict__ (sacremoses objects, Trie, AddedTokens, regexes);
    lower_2019: the 2019 plain-dict vocab.pkl, lower-casing, a config.json and no tokenizer_config.json."""
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / folder)
    assert type(tokenizer) is TransfoXLTokenizer
    assert_tokenizes_as_4_46_3(tokenizer, REFERENCE[folder])


def test_legacy_vocab_pkl_classes_are_read_as_inert_records():
    state = load_plain_pickle(WT103 / "vocab.pkl", classes=TRANSFO_XL_TOKENIZER_CLASSES, encoding="utf-8")
    for key in (
        "moses_tokenizer",
        "moses_detokenizer",
        "moses_punct_normalizer",
        "tokens_trie",
        "punction_without_space_before_pattern",
    ):
        assert isinstance(state[key], PickledObject), key  # recorded, never instantiated
    assert state["punction_without_space_before_pattern"].cls == "re._compile"  # no regex was compiled
    assert all(isinstance(token, PickledObject) for token in state["_added_tokens_decoder"].values())
    assert isinstance(state["counter"], collections.Counter) and state["idx2sym"][:2] == ["<eos>", "<unk>"]


class _Trap:
    """Unpickling this runs `touch <marker>` if the pickle is executed."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("layout", ["value", "top"])
def test_booby_trapped_vocab_pkl_is_refused_and_nothing_runs(tmp_path, layout):
    folder = tmp_path / "trap"
    shutil.copytree(WT103, folder)
    marker = tmp_path / "executed"
    state = {"idx2sym": ["<eos>", "<unk>"], "sym2idx": {"<eos>": 0, "<unk>": 1}, "x": _Trap(marker)}
    (folder / "vocab.pkl").write_bytes(pickle.dumps(state if layout == "value" else _Trap(marker), protocol=4))
    with pytest.raises(UnsafePickleError, match=r"vocab\.pkl.*refusing to load global 'posix\.system'"):
        AutoTokenizer.from_pretrained(folder)
    assert not marker.exists()


def test_unknown_class_in_vocab_pkl_is_refused_naming_the_file_and_global(tmp_path):
    path = tmp_path / "vocab.pkl"
    path.write_bytes(pickle.dumps({"idx2sym": ["a"], "when": collections.deque([1])}, protocol=2))
    with pytest.raises(UnsafePickleError, match=rf"{path}.*'collections\.deque'"):
        read_legacy_vocabulary(path)


def test_vocab_bin_and_vocab_txt_give_the_same_tokenizer(tmp_path):
    """The 2019 plain dict saved with torch.save as vocab.bin, and the original's vocab.txt, as what a folder has."""
    state = load_plain_pickle(FIXTURES / "lower_2019" / "vocab.pkl", classes={}, encoding="utf-8")
    expected = AutoTokenizer.from_pretrained(FIXTURES / "lower_2019")
    for name in ("vocab.bin", "vocab.txt"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(FIXTURES / "lower_2019" / "config.json", folder)
        if name == "vocab.bin":
            torch.save(state, folder / name)
        else:
            (folder / name).write_text("".join(f"{symbol}\n" for symbol in state["idx2sym"]), encoding="utf-8")
        tokenizer = AutoTokenizer.from_pretrained(folder, lower_case=True)
        assert tokenizer.idx2sym == expected.idx2sym
        assert_tokenizes_as_4_46_3(tokenizer, REFERENCE["lower_2019"])


def test_save_pretrained_writes_no_pickle_and_reloads_the_same_tokenizer(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(WT103)
    tokenizer.save_pretrained(tmp_path / "saved")
    files = sorted(path.name for path in (tmp_path / "saved").iterdir())
    assert not [name for name in files if name.endswith((".pkl", ".bin"))], files
    assert "vocab.json" in files and "tokenization_transfo_xl.py" in files and "txv_safe_pickle.py" in files
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["aggressive_dash_splits"] is True and config["split_numbers"] is True
    assert config["language"] == "en" and config["lower_case"] is False and config["unk_idx"] == 1
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_transfo_xl.TransfoXLTokenizer"
    assert_tokenizes_as_4_46_3(AutoTokenizer.from_pretrained(tmp_path / "saved"), REFERENCE["wt103_like"])


def test_padding_is_left_with_eos_and_an_attention_mask():
    tokenizer = AutoTokenizer.from_pretrained(WT103)
    batch = tokenizer(["The game", "It was the first time"], padding=True)
    assert tokenizer.pad_token == "<eos>" and tokenizer.padding_side == "left"
    short = tokenizer.encode("The game")
    pad = 5 - len(short)
    assert batch["input_ids"][0] == [tokenizer.eos_token_id] * pad + short
    assert batch["attention_mask"][0] == [0] * pad + [1] * len(short)


# --------------------------------------------------------------------------------------------------- generation
GENERATION = REFERENCE["wt103_like"]["generation"]


def test_generate_reproduces_4_46_3_tokens_and_text():
    tokenizer = AutoTokenizer.from_pretrained(WT103)
    model = AutoModelForCausalLM.from_pretrained(WT103).eval()
    for row in GENERATION["prompts"]:
        inputs = tokenizer(row["prompt"], return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == row["input_ids"]
        output = model.generate(**inputs, max_new_tokens=GENERATION["max_new_tokens"], do_sample=False)
        assert output[0].tolist() == row["generated_ids"], row["prompt"]
        assert tokenizer.decode(output[0]) == row["decoded"]


def test_text_generation_pipeline_on_the_legacy_folder():
    """The pipeline loads from the folder alone, prepends transformers' XL_PREFIX as 4.46.3 did, and generates
    4.46.3's tokens; batched prompts (left-padded with <eos>, masked) give what each prompt gives alone. Its text is
    transformers 5's: the prompt followed by the decoded new tokens (4.46.3 cut the decoded whole sequence instead,
    which differs where a continuation starts with punctuation; see the model card)."""
    generator = pipeline("text-generation", model=str(WT103))
    tokenizer = generator.tokenizer
    prompts = [row["prompt"] for row in GENERATION["prompts"]]
    kwargs = dict(max_new_tokens=GENERATION["max_new_tokens"], do_sample=False)
    alone = [generator(prompt, return_tensors=True, **kwargs)[0]["generated_token_ids"] for prompt in prompts]
    assert [list(ids) for ids in alone] == [row["pipeline_ids"] for row in GENERATION["prompts"]]
    batched = generator(prompts, batch_size=len(prompts), return_tensors=True, **kwargs)
    for out, ids in zip(batched, alone):
        padded = list(out[0]["generated_token_ids"])  # the row as generated: left padding, then what it gives alone
        pad = len(padded) - len(ids)
        assert padded == [tokenizer.pad_token_id] * pad + list(ids)
    assert max(len(ids) for ids in alone) > min(len(ids) for ids in alone)  # padding did happen
    for row in GENERATION["prompts"]:
        text = generator(row["prompt"], **kwargs)[0]["generated_text"]
        new_ids = row["pipeline_ids"][-GENERATION["max_new_tokens"] :]
        assert text == row["prompt"] + tokenizer.decode(new_ids, skip_special_tokens=True)


# --------------------------------------------------------------------------------------------- upgrade-legacy
@pytest.mark.slow  # a clean subprocess loading remote code
def test_upgrade_legacy_writes_a_pickle_free_copy_that_loads_as_remote_code(tmp_path, capsys):
    out = tmp_path / "safe"
    assert txv_main(["upgrade-legacy", str(WT103), "--output", str(out)]) == 0
    assert "not carried over" in capsys.readouterr().out
    names = sorted(path.name for path in out.iterdir())
    assert "vocab.pkl" not in names and not [n for n in names if n.endswith((".pkl", ".bin"))], names
    assert {"model.safetensors", "vocab.json", "tokenization_transfo_xl.py", "modeling_transfo_xl.py"} <= set(names)
    assert (WT103 / "vocab.pkl").exists()  # the legacy folder is left alone
    assert_tokenizes_as_4_46_3(AutoTokenizer.from_pretrained(out), REFERENCE["wt103_like"])

    row = GENERATION["prompts"][0]
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["hf_txvariants"] = None  # any import of the plugin fails
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()
        assert not type(tokenizer).__module__.startswith("hf_txvariants"), type(tokenizer).__module__
        ids = tokenizer({row["prompt"]!r}, return_tensors="pt")
        output = model.generate(**ids, max_new_tokens={GENERATION["max_new_tokens"]}, do_sample=False)
        print(json.dumps([output[0].tolist(), tokenizer.decode(output[0])]))
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [row["generated_ids"], row["decoded"]]


def test_upgrade_legacy_in_place_and_bad_input(tmp_path, capsys):
    folder = tmp_path / "legacy"
    shutil.copytree(WT103, folder)
    assert txv_main(["upgrade-legacy", str(folder), "--in-place"]) == 0
    assert not (folder / "vocab.pkl").exists() and (folder / "vocab.json").exists()
    assert_tokenizes_as_4_46_3(AutoTokenizer.from_pretrained(folder), REFERENCE["wt103_like"])
    capsys.readouterr()
    assert txv_main(["upgrade-legacy", str(tmp_path / "missing"), "--output", str(tmp_path / "x")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert txv_main(["upgrade-legacy", str(folder), "--output", str(folder)]) == 2
    assert "already exists" in capsys.readouterr().err


@pytest.mark.slow  # a subprocess that imports the plugin
def test_missing_sacremoses_is_one_clear_error(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["sacremoses"] = None  # not installed
        from hf_txvariants import TransfoXLTokenizer
        try:
            TransfoXLTokenizer.from_pretrained({str(WT103)!r})
        except ImportError as error:
            print(error)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pip install sacremoses" in result.stdout
