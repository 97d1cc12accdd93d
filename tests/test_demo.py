"""A tiny fast run of the README's demo (`txv demo` with a few steps): both models train, both bits-per-character
numbers and the speed ratio are printed, the models are saved in HF format and reload, a sample is generated and the
plot is written. The full demo's numbers are measured in examples/README.md."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_txvariants.cli import main

FAST = [
    "--steps",
    "4",
    "--max-chars",
    "40000",
    "--eval-chars",
    "300",
    "--d-model",
    "32",
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--seg-len",
    "16",
    "--mem-len",
    "16",
    "--batch-size",
    "4",
    "--sample-chars",
    "20",
    "--no-progress",
    "--threads",
    "1",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.slow
def test_fast_demo(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)] + FAST) == 0
    printed = capsys.readouterr().out
    assert "bits per character" in printed and "evaluation-speed ratio" in printed
    results = json.loads((out / "demo_results.json").read_text())
    for name in ("transformer_xl", "baseline"):
        assert math.isfinite(results[name]["bpc"]) and results[name]["bpc"] > 0
        assert f"{results[name]['bpc']:.3f}" in printed
        assert results[name]["chars_per_second"] > 0
    assert results["speed_ratio"] > 0 and f"{results['speed_ratio']:.1f}x" in printed
    assert results["attention_length"] == 32
    png = (out / "training_curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    for folder in ("transfo-xl", "baseline"):
        model = AutoModelForCausalLM.from_pretrained(out / folder / "model")
        tokenizer = AutoTokenizer.from_pretrained(out / folder / "model")
        assert model.config.vocab_size == len(tokenizer)
    assert AutoModelForCausalLM.from_pretrained(out / "transfo-xl" / "model").config.mem_len == 16
    assert results["sample"].startswith("Return the ") and len(results["sample"]) > len("Return the ")

    # `txv eval` on the saved models: with memory, and with a sliding window
    assert main(["eval", "--model", str(out / "transfo-xl" / "model"), "--max-chars", "600", "--seg-len", "16"]) == 0
    with_memory = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # every character after the first is predicted: 37 segments of 16 and the originals' shorter last one of 7
    assert with_memory["tokens"] == 599 and math.isfinite(with_memory["bpc"])
    assert (
        main(
            [
                "eval",
                "--model",
                str(out / "baseline" / "model"),
                "--max-chars",
                "600",
                "--window",
                "32",
                "--batch-size",
                "8",
            ]
        )
        == 0
    )
    window = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert window["tokens"] == 599 and math.isfinite(window["bpc"])


def test_demo_bad_input_is_one_line(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--data", str(tmp_path / "missing.txt")] + FAST) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"txv: error: data file not found: {tmp_path / 'missing.txt'}"
    assert main(["demo", "--out", str(tmp_path), "--baseline", "nope"] + FAST) == 2
    assert "unknown variant 'nope'" in capsys.readouterr().err
