"""The Hub: a repo folder with weights, config + auto_map, remote code, tokenizer and model card; loaded by repo id
from a temporary HF cache with HF_HUB_OFFLINE=1 (with the plugin, and with trust_remote_code in a clean process that
cannot import hf_txvariants); the push path run against a mocked HfApi, asserting the uploaded file set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import torch
from huggingface_hub import ModelCard

import hf_txvariants
from hf_txvariants.hub import build_model_card, push_to_hub, save_for_hub, snapshot_into_cache
from hf_txvariants.training import build_char_tokenizer, build_config, build_model

REPO = "txv-test/tiny-transfo-xl"
EXPECTED = {
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "eval_results.json",
    "configuration_transfo_xl.py",
    "modeling_transfo_xl.py",
}
METRICS = {"valid_bpc": 2.345, "valid_perplexity": 5.08}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer("hello transformer-xl world\n")
    model = build_model(
        build_config("transfo-xl", len(tokenizer), d_model=32, n_layer=2, n_head=2, mem_len=8, dropout=0.0)
    )
    return model.eval(), tokenizer


def _reference(model, tokenizer):
    ids = tokenizer("hello world", return_tensors="pt").input_ids
    with torch.no_grad():
        return ids, model(input_ids=ids).logits


def test_repo_folder_and_model_card(tiny, tmp_path):
    model, tokenizer = tiny
    files = set(save_for_hub(model, tmp_path / "repo", REPO, tokenizer, METRICS, dataset="stdlib docstrings"))
    assert EXPECTED <= files
    assert any(f.startswith("txv_") for f in files)  # the shared blocks the modeling file imports
    config = json.loads((tmp_path / "repo" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_transfo_xl.TransfoXLLMHeadModel"
    assert set(config["auto_map"]) >= {
        "AutoConfig",
        "AutoModel",
        "AutoModelForCausalLM",
        "AutoModelForSequenceClassification",
    }
    card = ModelCard.load(tmp_path / "repo" / "README.md")
    assert card.data.library_name == "transformers"
    assert {"hf-txvariants", "transfo-xl", "custom_code"} <= set(card.data.tags)
    results = card.data.eval_results
    assert {(r.metric_type, r.metric_value) for r in results} == {("bpc", 2.345), ("perplexity", 5.08)}
    assert results[0].dataset_name == "stdlib docstrings"
    assert "| hidden_size | 32 |" in card.text and REPO in card.text


def test_card_from_model_cards_keeps_its_body(tiny):
    model, _ = tiny
    base = Path(__file__).resolve().parents[1] / "model_cards" / "transfo-xl-enwik8.md"
    if not base.exists():
        pytest.skip("model_cards/transfo-xl-enwik8.md is not in this checkout")
    card = build_model_card(model, "me/enwik8", {"test_bpc": 0.99}, dataset="enwik8", base_card=base)
    assert ModelCard.load(base).text.strip() in card.text
    assert "hf-txvariants" in card.data.tags and card.data.eval_results[0].metric_value == 0.99


@pytest.mark.slow  # a clean subprocess
def test_load_by_repo_id_from_the_hf_cache_offline(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = tiny
    save_for_hub(model, tmp_path / "repo", REPO, tokenizer, METRICS)
    cache = tmp_path / "hub-cache"
    snapshot_into_cache(tmp_path / "repo", REPO, cache)
    ids, expected = _reference(model, tokenizer)
    with mock.patch.dict(os.environ, {"HF_HUB_OFFLINE": "1"}):
        loaded = AutoModelForCausalLM.from_pretrained(REPO, cache_dir=str(cache)).eval()
        loaded_tokenizer = AutoTokenizer.from_pretrained(REPO, cache_dir=str(cache))
    assert type(loaded) is hf_txvariants.TransfoXLLMHeadModel
    assert loaded_tokenizer("hello world").input_ids == ids[0].tolist()
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)

    # a clean process that cannot import hf_txvariants loads the same repo id with trust_remote_code
    torch.save({"ids": ids, "logits": expected}, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["hf_txvariants"] = None  # importing the plugin now fails
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        try:
            import hf_txvariants
            raise SystemExit("hf_txvariants was importable")
        except ImportError:
            pass
        model = AutoModelForCausalLM.from_pretrained({REPO!r}, cache_dir={str(cache)!r}, trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({REPO!r}, cache_dir={str(cache)!r})
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        assert tokenizer("hello world").input_ids == expected["ids"][0].tolist()
        assert "hf_txvariants" not in type(model).__module__, type(model).__module__
        with torch.no_grad():
            logits = model(input_ids=expected["ids"]).logits
        assert torch.allclose(logits, expected["logits"], atol=1e-5)
        print("REMOTE-CODE-OK", type(model).__module__)
    """)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),
        OMP_NUM_THREADS="1",
        HF_MODULES_CACHE=str(tmp_path / "modules"),
        PYTHONPATH="",
    )
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "REMOTE-CODE-OK transformers_modules" in run.stdout


def test_push_uploads_the_complete_repo_without_network(tiny):
    model, tokenizer = tiny
    uploaded = {}

    def upload_folder(*, repo_id, folder_path, repo_type, commit_message, revision=None, create_pr=False):
        uploaded["repo_id"] = repo_id
        uploaded["files"] = {str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file()}
        uploaded["config"] = json.loads((Path(folder_path) / "config.json").read_text())
        return "https://huggingface.co/txv-test/tiny-transfo-xl/commit/0"

    api = mock.Mock()
    api.upload_folder.side_effect = upload_folder
    result = push_to_hub(model, REPO, tokenizer, METRICS, api=api, dataset="stdlib docstrings")
    api.create_repo.assert_called_once_with(REPO, private=False, exist_ok=True, repo_type="model")
    assert result.endswith("/commit/0") and uploaded["repo_id"] == REPO
    code = {f for f in uploaded["files"] if f.endswith(".py")}
    assert EXPECTED <= uploaded["files"]
    assert code == {f for f in uploaded["files"] if f.startswith(("configuration_", "modeling_", "txv_"))}
    # every file the remote-code loader will need is uploaded: the modeling file's relative imports
    from transformers.dynamic_module_utils import get_relative_import_files

    needed = {Path(f).name for f in get_relative_import_files(hf_txvariants.modeling_transfo_xl.__file__)}
    assert needed <= code
    assert "AutoModelForCausalLM" in uploaded["config"]["auto_map"]
    # the default HfApi is what is patched in real use
    with mock.patch("huggingface_hub.HfApi") as hf_api:
        hf_api.return_value.upload_folder.side_effect = upload_folder
        push_to_hub(model, REPO, tokenizer, token="hf_fake")
        hf_api.assert_called_once_with(token="hf_fake")


def test_txv_push_command(tiny, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    from hf_txvariants.cli import main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # HfApi is mocked: nothing leaves the machine

    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "eval_results.json").write_text(json.dumps({"valid_bpc": 1.5}))
    seen = {}

    def upload_folder(*, repo_id, folder_path, repo_type, commit_message, revision, create_pr):
        seen.update(message=commit_message, revision=revision, create_pr=create_pr)
        seen["files"] = {p.name for p in Path(folder_path).iterdir()}
        seen["card"] = ModelCard.load(Path(folder_path) / "README.md")
        return mock.Mock(
            commit_url="https://huggingface.co/me/m/commit/1", pr_url="https://huggingface.co/me/m/discussions/1"
        )

    with mock.patch("huggingface_hub.HfApi") as hf_api:
        hf_api.return_value.upload_folder.side_effect = upload_folder
        assert (
            main(
                [
                    "push",
                    "--model",
                    str(tmp_path / "model"),
                    "--repo-id",
                    "me/m",
                    "--dataset",
                    "toy",
                    "--token",
                    "hf_x",
                    "--revision",
                    "dev",
                    "--commit-message",
                    "first",
                    "--create-pr",
                ]
            )
            == 0
        )
    hf_api.assert_called_with(token="hf_x")
    assert seen["message"] == "first" and seen["revision"] == "dev" and seen["create_pr"] is True
    assert "pushed to https://huggingface.co/me/m/discussions/1" in capsys.readouterr().out
    assert EXPECTED <= seen["files"]
    assert seen["card"].data.eval_results[0].metric_value == 1.5


def test_txv_push_offline_is_one_clear_line(tiny, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    from hf_txvariants.cli import main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    capsys.readouterr()  # (save_pretrained's progress bar)
    assert main(["push", "--model", str(tmp_path / "model"), "--repo-id", "me/m"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "txv: error: cannot push to the Hub: HF_HUB_OFFLINE is set (unset it to upload)"
    # a missing folder is named first, offline or not (issue 24: only the offline setting was reported)
    assert main(["push", "--model", str(tmp_path / "missing"), "--repo-id", "me/m"]) == 2
    assert capsys.readouterr().err.strip() == f"txv: error: model folder not found: {tmp_path / 'missing'}"


def test_transformers_push_to_hub_uploads_the_remote_code_too(tiny):
    """What the README says: `model.push_to_hub` (transformers) uploads the remote-code payload as well (it calls our
    `save_pretrained`); `hf_txvariants.hub.push_to_hub` adds the tokenizer and the card with the Hub metadata."""
    model, _ = tiny
    uploaded = {}

    def upload(folder, *args, **kwargs):
        uploaded["files"] = {p.name for p in Path(folder).iterdir()}
        return mock.Mock()

    with (
        mock.patch("transformers.utils.hub.hf_api") as hf_api,
        mock.patch("transformers.utils.hub.create_and_tag_model_card", return_value=ModelCard("")),
        mock.patch.object(type(model), "_upload_modified_files", side_effect=upload),
    ):
        hf_api.return_value.create_repo.return_value.repo_id = "me/m"
        model.push_to_hub("me/m")
    files = uploaded["files"]
    assert f"{type(model).__module__.rsplit('.', 1)[-1]}.py" in files  # the variant's modeling file
    assert f"{type(model.config).__module__.rsplit('.', 1)[-1]}.py" in files
    assert any(f.startswith("txv_") for f in files)
