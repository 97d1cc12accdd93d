"""FSDP2 in the Accelerate training loop: `accelerate launch --config_file examples/accelerate_configs/fsdp.yaml`
shards the parameters over 2 CPU processes (gloo) and reproduces the one-process loss curve; its bf16 policy is
honoured unless --mixed-precision is given; settings the loop cannot honour are refused with one line; each process
gets its own GPU or the CPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_txvariants.training import build_config, build_model, read_metrics, segment_stream, variant_names
from hf_txvariants.training.distributed import (
    FsdpSettings,
    ShardedModel,
    choose_device,
    device_choice_from_environment,
    fsdp_settings_from_environment,
    resolve_mixed_precision,
)
from hf_txvariants.training.models import ModelError, init_memory, lm_forward
from test_training import TINY_FLAGS, _env, _error_line, _free_port, _losses, _train_in_one_process

# under `pytest -n 2 --dist loadgroup` every test here runs on one worker, one after the other: the two-process launches
# never overlap (two launches at once put four training processes and their gloo groups on the 2 cores)
pytestmark = pytest.mark.xdist_group("distributed")

ROOT = Path(__file__).resolve().parents[1]
FSDP_YAML = ROOT / "examples" / "accelerate_configs" / "fsdp.yaml"
ACCELERATE = Path(sys.executable).with_name("accelerate")
# what `accelerate launch --config_file fsdp.yaml` exports (the slow tests below run the launcher itself)
FSDP_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_OFFLOAD_PARAMS": "false",
    "ACCELERATE_MIXED_PRECISION": "bf16",
    "LOCAL_RANK": "0",
}


# --- device per rank -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "processes, gpus, force_cpu, cpu, note",
    [
        (1, 0, False, True, False),  # no GPU
        (2, 0, False, True, False),  # CPU processes, gloo
        (1, 1, False, False, False),  # one process, one GPU
        (2, 2, False, False, False),  # one GPU each
        (2, 8, False, False, False),
        (2, 1, False, True, True),  # two ranks would share the GPU (NCCL: "Duplicate GPU detected"): CPU for all
        (4, 2, False, True, True),
        (2, 2, True, True, False),  # --cpu
    ],
)
def test_each_process_gets_its_own_gpu_or_the_cpu(processes, gpus, force_cpu, cpu, note):
    choice = choose_device(processes, gpus, force_cpu)
    assert choice.cpu == cpu
    assert (choice.note is not None) == note
    if note:
        assert f"{processes} processes" in choice.note and f"{gpus} GPU" in choice.note


def test_device_choice_reads_the_launcher_environment(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # set by torchrun / accelerate launch
    assert device_choice_from_environment().cpu
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert not device_choice_from_environment().cpu
    assert device_choice_from_environment(force_cpu=True).cpu
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # accelerate launch --cpu
    assert device_choice_from_environment().cpu


# --- what the Accelerate config asks for -----------------------------------------------------------------------------


def test_fsdp_settings_come_from_the_launcher_environment():
    assert fsdp_settings_from_environment({}) is None
    assert fsdp_settings_from_environment(dict(FSDP_ENV, ACCELERATE_USE_FSDP="false")) is None
    assert fsdp_settings_from_environment(FSDP_ENV) == FsdpSettings(reshard_after_forward=True, wrap_classes=None)
    settings = fsdp_settings_from_environment(
        dict(FSDP_ENV, FSDP_RESHARD_AFTER_FORWARD="false", FSDP_TRANSFORMER_CLS_TO_WRAP="TransfoXLLayer, Other")
    )
    assert settings == FsdpSettings(reshard_after_forward=False, wrap_classes=("TransfoXLLayer", "Other"))
    assert fsdp_settings_from_environment(dict(FSDP_ENV, FSDP_AUTO_WRAP_POLICY="NO_WRAP")).wrap_classes == ()
    with pytest.raises(ModelError, match="not started by `accelerate launch` or torchrun"):
        fsdp_settings_from_environment({k: v for k, v in FSDP_ENV.items() if k != "LOCAL_RANK"})


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("FSDP_VERSION", "1", "fsdp_version 1"),
        ("FSDP_OFFLOAD_PARAMS", "true", "fsdp_offload_params"),
        ("FSDP_ACTIVATION_CHECKPOINTING", "true", "fsdp_activation_checkpointing"),
        ("FSDP_CPU_RAM_EFFICIENT_LOADING", "true", "fsdp_cpu_ram_efficient_loading"),
        ("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT", "FULL_STATE_DICT"),
        ("FSDP_AUTO_WRAP_POLICY", "SIZE_BASED_WRAP", "SIZE_BASED_WRAP"),
    ],
)
def test_fsdp_settings_the_loop_cannot_honour_are_refused(setting, value, message):
    with pytest.raises(ModelError, match=message) as error:
        fsdp_settings_from_environment(dict(FSDP_ENV, **{setting: value}))
    assert "\n" not in str(error.value)


def test_the_mixed_precision_flag_wins_over_the_config():
    assert resolve_mixed_precision(None, True, {"ACCELERATE_MIXED_PRECISION": "bf16"}) == "bf16"
    assert resolve_mixed_precision("no", True, {"ACCELERATE_MIXED_PRECISION": "bf16"}) == "no"
    assert resolve_mixed_precision(None, False, {}) == "no"
    assert resolve_mixed_precision(None, False, {"ACCELERATE_MIXED_PRECISION": "fp16"}) == "fp16"
    with pytest.raises(ModelError, match="mixed_precision is 'fp16'.*under FSDP"):
        resolve_mixed_precision(None, True, {"ACCELERATE_MIXED_PRECISION": "fp16"})
    with pytest.raises(ModelError, match="--mixed-precision is 'fp8'"):
        resolve_mixed_precision("fp8", False, {})


def test_fsdp_that_cannot_run_is_refused_with_one_line(tmp_path, monkeypatch, capsys):
    for name, value in FSDP_ENV.items():
        monkeypatch.setenv(name, value)
    flags = ["train", "--max-steps", "1"] + TINY_FLAGS
    monkeypatch.setenv("FSDP_VERSION", "1")
    err = _error_line(capsys, flags + ["--output-dir", str(tmp_path / "a")])
    assert "fsdp_version 1" in err and "FSDP2" in err
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.delenv("LOCAL_RANK")  # FSDP asked for in a process that no launcher started: no silent DDP
    err = _error_line(capsys, flags + ["--output-dir", str(tmp_path / "b")])
    assert "accelerate launch" in err
    assert not (tmp_path / "b" / "metrics.jsonl").exists()


def test_trainer_path_refuses_an_fsdp_config(tmp_path, monkeypatch, capsys):
    from test_trainer import _example

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert _example("train_lm").main(["--trainer", "--output-dir", str(tmp_path / "t")] + TINY_FLAGS) == 2
    err = capsys.readouterr().err.strip()
    assert "--trainer runs one process without FSDP" in err and "\n" not in err
    assert not (tmp_path / "t").exists()


# --- the bf16 policy, in one process (a 1-rank gloo group) -----------------------------------------------------------


@pytest.fixture
def one_rank_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_bf16_policy_computes_in_bf16_and_keeps_fp32_weights_and_gradients(one_rank_group):
    from torch.distributed.fsdp import FSDPModule

    torch.manual_seed(0)
    config = build_config("transfo-xl", 40, d_model=32, n_layer=2, n_head=2, mem_len=8, seg_len=16, dropout=0.0)
    reference = build_model(config)
    model = build_model(config)
    model.load_state_dict(reference.state_dict())
    inputs, targets = segment_stream(torch.randint(0, 40, (200,)), 2, 16).segment(0)
    fp32_loss, _ = lm_forward(reference, inputs, targets, init_memory(reference, 2))

    sharded = ShardedModel(model, FsdpSettings(), torch.device("cpu"), 1, "bf16")
    units = [m for m in sharded.module.modules() if isinstance(m, FSDPModule)]
    layers = [m for m in units if "TransfoXLLayer" in {c.__name__ for c in type(m).__mro__}]
    assert len(layers) == 2 and len(units) == sharded.units == 3  # one unit per layer, plus the root
    seen = []
    layers[0].register_forward_pre_hook(lambda module, args: seen.append({p.dtype for p in module.parameters()}))
    loss, _ = lm_forward(sharded.module, inputs, targets, init_memory(sharded.module, 2))
    loss.backward()
    assert seen == [{torch.bfloat16}]  # the layer's gathered parameters during the forward
    assert loss.item() == pytest.approx(fp32_loss.item(), abs=0.05) and loss.item() != fp32_loss.item()
    for name, p in sharded.module.named_parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32, name


REFORMER = {"axial_pos_embds_dim": [16, 16], "axial_pos_shape": [4, 4], "attn_layers": ["local", "lsh"]}


def _tiny_config(variant, **extra):
    vocab = 257 if variant == "txv_image_transformer" else 40  # 256 intensities + the start token
    return build_config(variant, vocab, d_model=32, n_layer=2, n_head=2, mem_len=8, seg_len=16, dropout=0.0, **extra)


@pytest.mark.parametrize("variant", sorted(variant_names()))
def test_every_causal_variant_sharded_gives_the_loss_and_gradients_of_the_plain_model(one_rank_group, variant):
    """Each layer unit must gather its parameters wherever they are used, and gradients must reach the shards."""
    torch.manual_seed(0)
    try:
        config = _tiny_config(variant, **(dict(REFORMER, reversible=False) if variant == "txv_reformer" else {}))
    except ModelError as error:  # e.g. the ACT RNN: no layers or heads for the loop's build_config to size
        pytest.skip(f"the training loop does not build {variant}: {error}")
    reference = build_model(config)
    model = build_model(config)
    model.load_state_dict(reference.state_dict())
    sharded = ShardedModel(model, FsdpSettings(), torch.device("cpu"), 1, "no")
    inputs, targets = segment_stream(torch.randint(0, config.vocab_size, (400,)), 2, 16).segment(0)
    losses = []
    for m in (reference, sharded.module):
        torch.manual_seed(1)  # the same LSH rotations
        loss, _ = lm_forward(m, inputs, targets, init_memory(m, 2))
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    expected = dict(reference.named_parameters())
    for name, p in sharded.module.named_parameters():
        if expected[name].grad is None:
            assert p.grad is None, name
        else:
            assert torch.allclose(p.grad.full_tensor(), expected[name].grad, atol=1e-6), name


def test_reversible_layers_are_refused_under_fsdp(one_rank_group):
    """The reversible backward (txv_reversible) differentiates against the parameters it was given, not FSDP's
    gathered copies: its layer gradients would silently be zero."""
    model = build_model(_tiny_config("txv_reformer", **REFORMER))
    with pytest.raises(ModelError, match="reversible.*--extra-config") as error:
        ShardedModel(model, FsdpSettings(), torch.device("cpu"), 1, "no")
    assert "\n" not in str(error.value)


# --- two CPU processes under the real launcher ---------------------------------------------------------------------

SHARD_LINE = re.compile(
    r"rank (\d)/2 on cpu\S* holds ([\d,]+) of ([\d,]+) parameter elements \S+; "
    r"compute (b?float\d+), gradients reduced in (b?float\d+)"
)


def _launch_fsdp(output_dir, flags):
    run = subprocess.run(
        [
            str(ACCELERATE),
            "launch",
            "--config_file",
            str(FSDP_YAML),
            "--main_process_port",
            str(_free_port()),
            "-m",
            "hf_txvariants.cli",
            "train",
            "--output-dir",
            str(output_dir),
        ]
        + flags,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    shards = {
        int(m[1]): (int(m[2].replace(",", "")), int(m[3].replace(",", "")), m[4], m[5])
        for m in SHARD_LINE.finditer(run.stderr)
    }
    assert sorted(shards) == [0, 1], run.stderr[-3000:]
    return shards


@pytest.mark.slow
def test_fsdp_config_shards_over_two_cpu_processes_and_gives_the_loss_curve_of_one(tmp_path):
    flags = TINY_FLAGS + ["--max-steps", "6", "--dropout", "0", "--save-every", "3"]
    _train_in_one_process(tmp_path / "one", flags)
    # the config's bf16 is overridden by the explicit flag, so that the curve can be compared with fp32
    shards = _launch_fsdp(tmp_path / "two", flags + ["--mixed-precision", "no"])
    (local0, total, compute, reduce), (local1, total1, _, _) = shards[0], shards[1]
    assert total == total1 and local0 + local1 == total  # each element held by exactly one rank
    assert abs(local0 - total / 2) < 0.02 * total  # about half each
    assert (compute, reduce) == ("float32", "float32")
    step6 = tmp_path / "two" / "checkpoints" / "step-6"
    assert {p.name for p in step6.glob("fsdp_shards_rank*.pt")} == {"fsdp_shards_rank0.pt", "fsdp_shards_rank1.pt"}
    rank0 = torch.load(step6 / "fsdp_shards_rank0.pt", weights_only=True)["model"]
    assert sum(t.numel() for t in rank0.values()) < 0.6 * total  # the checkpoint holds the shard, not the model

    # fp32 sums in another order (gradients reduce-scattered over two ranks, the clipping norm from two partial
    # norms) round differently from the one-process run: equal to ~1e-6, not bit for bit
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert list(a) == list(b) == list(range(1, 7))
    for step in a:
        assert a[step] == pytest.approx(b[step], abs=1e-5), (step, a, b)
    assert a[6] < a[1]
    grad_norms = [[m["grad_norm"] for m in read_metrics(tmp_path / f) if m["split"] == "train"] for f in ("one", "two")]
    assert grad_norms[0] == pytest.approx(grad_norms[1], rel=1e-4)

    # the saved model is the whole model, under its own class (auto_map names its own modeling file)
    from transformers import AutoModelForCausalLM

    single = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "model")
    sharded = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "model")
    assert not list((tmp_path / "two" / "model").glob("_fsdp*.py"))
    for (name, p), q in zip(single.named_parameters(), sharded.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name

    # resuming from the step-3 shards replays steps 4-6 of the two-process run
    two = _losses(tmp_path / "two")
    _launch_fsdp(
        tmp_path / "two",
        flags + ["--mixed-precision", "no", "--resume", str(tmp_path / "two" / "checkpoints" / "step-3")],
    )
    resumed = _losses(tmp_path / "two")
    assert list(resumed) == list(range(1, 7))
    for step in resumed:
        assert resumed[step] == pytest.approx(two[step], abs=1e-6), (step, resumed, two)


@pytest.mark.slow
def test_fsdp_config_bf16_policy_is_honoured(tmp_path):
    flags = TINY_FLAGS + ["--max-steps", "3", "--dropout", "0", "--no-save-model"]
    shards = _launch_fsdp(tmp_path / "bf16", flags)
    assert {s[2:] for s in shards.values()} == {("bfloat16", "float32")}
    losses = _losses(tmp_path / "bf16")
    assert list(losses) == [1, 2, 3] and all(torch.isfinite(torch.tensor(v)) for v in losses.values())
