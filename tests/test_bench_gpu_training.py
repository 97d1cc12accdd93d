"""benchmarks/bench_gpu_training.py on CPU (its figures need a GPU): the GPT-2 FLOP count from the shapes equals what
torch's FlopCounterMode counts in a tiny GPT-2's forward pass, a worker measures a tiny training run, the records
carry the fraction of the peak, and bad arguments are refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_gpu_training as bench  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_gpt2_flops_from_the_shapes_equal_torchs_count():
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import GPT2LMHeadModel

    config, batch, segment = bench.TRAINING_CONFIGS["tiny"]
    model = GPT2LMHeadModel._from_config(bench.gpt2_config(config, segment), attn_implementation="eager").eval()
    ids = torch.randint(0, config["vocab_size"], (batch, segment))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids)
    # every multiply-add of a GPT-2 forward is a matrix product (the counter counts 2 FLOPs each), so exactly equal
    assert counter.get_total_flops() == bench.gpt2_forward_flops(config, batch, segment)


def test_a_worker_measures_a_tiny_training_run_and_the_record_has_the_fraction_of_the_peak():
    result = bench.worker("ours_eager", "tiny", "cpu", time_limit=0.01, folder=None)
    assert result["steps"] >= 3 and result["tokens_per_s"] > 0 and result["tflops"] > 0
    entry = bench.record("tiny", {"ours_eager": result, "legacy": {"error": "no legacy interpreter"}}, 989.0)
    assert entry["ours_eager"]["fraction_of_peak"] == pytest.approx(result["tflops"] / 989.0)
    assert entry["legacy"] == {"error": "no legacy interpreter"} and entry["batch"] == 2 and entry["segment"] == 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--measure-s", "30"], "--measure-s 30.0 leaves no time to start within --step-limit-s 25.0"),
        (["--peak-tflops", "0"], "--peak-tflops must be > 0, got 0.0"),
        (["--configs", "gpt3"], "invalid choice: 'gpt3'"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_arguments(argv)
    assert message in capsys.readouterr().err


def test_the_defaults_fit_eight_minutes():
    args = bench.parse_arguments([])
    runs = len(args.configs) * ((len(args.implementations) - 1) * args.step_limit_s + args.compile_limit_s)
    assert args.configs == ["enwik8_base", "wt103_base", "nvidia_base"] and runs <= 8 * 60
