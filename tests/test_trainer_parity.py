"""`txv train` follows the original trainers step for step: on the original's own initial weights (converted by
conversion/), with the original's options mapped by the one mapping the recipes use, every training step's loss and
the final validation loss equal those the original wrote (tests/fixtures/make_trainer_parity_fixtures.py), in float64
on both sides.

* kimiyoung/transformer-xl pytorch/train.py (character level, as enwik8): its ordered iterator's batches across an
  epoch (the restart with an empty memory, the shorter last segment), two chunks per batch with their own memories,
  Adam, clipping at 0.25, its warm-up (the first step at the full rate) and cosine, validation with a shorter segment
  and the memory lengthened by the difference;
* facebookresearch/adaptive-span main.py: its blocks and the restart at a random offset with the cache zeroed, the
  batch split in two, Adagrad clipping each parameter, its warm-up, the span penalty, the clamp after each step, the
  trimmed cache; and the learned spans.

Tolerance: 1e-9 relative. Both sides compute in float64 with other kernels in other orders (a different module
structure, fused attention), which leaves differences of a few 1e-16 per operation; 40 steps grow them to about
1e-14 here (the benchmark's 300 steps: at most 2e-16 on the training loss of every setting). A wrong detail (a data
row, a rate, a clipping, a memory) shows at 1e-3 or more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_txvariants.cli import main
from hf_txvariants.training import read_metrics

FIXTURES = Path(__file__).parent / "fixtures" / "trainer_parity"
RTOL = 1e-9

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _flags(fields: dict) -> list[str]:
    flags = []
    for name, value in fields.items():
        if name == "extra_config":
            flags += ["--extra-config", json.dumps(value)] if value else []
        elif value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def _train(tmp_path, model: Path, data: Path, fields: dict) -> list[dict]:
    for name in ("tokenizer", "variant", "eval_every"):  # the converted model brings its tokenizer; eval at the end
        fields.pop(name, None)
    argv = ["train", "--model", str(model), "--output-dir", str(tmp_path / "run"), "--dtype", "float64"]
    argv += ["--data", str(data / "train.txt"), "--valid-data", str(data / "valid.txt"), "--eval-every", "0"]
    argv += ["--token-cache", str(tmp_path / "cache"), "--no-tensorboard", "--no-progress", "--no-save-model"]
    assert main(argv + _flags(fields)) == 0
    return read_metrics(tmp_path / "run")


def _assert_the_runs_agree(reference: dict, records: list[dict]):
    train = [r for r in records if r["split"] == "train"]
    valid = [r for r in records if r["split"] == "valid"]
    assert [r["step"] for r in train] == list(range(1, len(reference["step_losses"]) + 1))
    assert [r["lm_loss"] for r in train] == pytest.approx(reference["step_losses"], rel=RTOL, abs=0)
    assert [r["lr"] for r in train] == pytest.approx(reference["step_lrs"], rel=1e-15, abs=0)
    assert valid[-1]["valid_loss"] == pytest.approx(reference["valid_loss"], rel=RTOL, abs=0)
    return train


def test_txv_train_follows_kimiyoungs_train_py_step_for_step(tmp_path):
    from conversion.kimiyoung_pytorch import main as convert
    from hf_txvariants.training.transfo_xl_flags import train_py_settings

    folder = FIXTURES / "xl"
    reference = json.loads((folder / "reference.json").read_text())
    options = dict(reference["flags"])
    options.update(max_step=options.pop("steps"), dropout=0.0, dropatt=0.0, eval_interval=0)
    model = tmp_path / "converted"
    assert (
        convert(
            ["--checkpoint", str(folder / "init.pt"), "--vocab", str(folder / "cache.pt")]
            + ["--output", str(model), "--no-progress"]
        )
        == 0
    )
    _assert_the_runs_agree(reference, _train(tmp_path, model, folder, train_py_settings(options).train_args))


def test_txv_train_follows_adaptive_spans_main_py_step_for_step(tmp_path):
    from conversion.adaptive_span import main as convert
    from hf_txvariants.training.adaptive_span_flags import parse_original_flags, train_settings_from_flags

    folder = FIXTURES / "span"
    reference = json.loads((folder / "reference.json").read_text())
    options = dict(reference["flags"])
    steps, seed = options.pop("steps"), options.pop("seed")
    argv = []
    for name, value in {**options, "niter": steps // 10, "nbatches": 10, "dropout": 0.0}.items():
        argv += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])
    model = tmp_path / "converted"
    assert (
        convert(
            ["--checkpoint", str(folder / "init.pt"), "--corpus", str(folder), "--output", str(model)] + ["--", *argv]
        )
        == 0
    )
    fields, config = train_settings_from_flags(parse_original_flags(argv)[0])
    fields.update(seed=seed, extra_config={"attention_dropout": config["attention_dropout"]})
    train = _assert_the_runs_agree(reference, _train(tmp_path, model, folder, fields))
    # the learned spans: txv's step k + 1 takes its penalty from the spans the original had after step k
    spans = [sum(layer_spans) for layer_spans in reference["spans"][:-1]]
    assert [r["span_penalty"] for r in train[1:]] == pytest.approx(spans, rel=RTOL, abs=1e-12)
