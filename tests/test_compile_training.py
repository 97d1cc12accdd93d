"""A compiled training step of every XL-family model (Transformer-XL with and without the adaptive softmax, GTrXL,
adaptive span, the original adaptive-span model) trains as the eager one: three segments, the memory carried from
each to the next, an optimiser step after each, give the eager losses, gradients and memories within float32
rounding. `fullgraph=True` makes any graph break an error, so a whole training segment (every layer included) is one
graph, forward and backward (AOTAutograd traces the backward of the forward graph).

Tolerances: the "aot_eager" backend runs the same ATen operations as eager, but through AOTAutograd's decompositions
(e.g. layer norm's and softmax's backward written out in primitive ops), which round differently in float32; after
three steps of SGD the values agree to ~1e-6 relative (rtol 1e-5, atol 1e-6). The inductor backend also fuses and
reorders reductions: rtol 1e-4, atol 1e-5 (float32's 6e-8 epsilon, amplified by sums over a few hundred terms and
three steps). `txv train --compile` and `--trainer --compile` are checked end to end against the uncompiled runs."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_txvariants.training import TrainArgs, train
from hf_txvariants.training.models import init_memory, objective_forward
from tiny_configs import TINY_TRAINING, model_class, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

XL_FAMILY = {
    "transfo-xl": ("transfo-xl", {}),
    "transfo-xl-no-adaptive-softmax": ("transfo-xl", dict(cutoffs=[], div_val=1)),
    "txv_gtrxl": ("txv_gtrxl", {}),
    "txv_adaptive_span": ("txv_adaptive_span", {}),
    "txv_adaptive_span_original": ("txv_adaptive_span_original", {}),
}
AOT_EAGER_TOLERANCE = dict(rtol=1e-5, atol=1e-6)
INDUCTOR_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _memory_tensors(memory) -> list[torch.Tensor]:
    """The tensors a carried memory holds (a `MemoryCache` or the original adaptive span's `SpanCache`)."""
    leaves, _ = torch.utils._pytree.tree_flatten(memory)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _train_segments(model, segments, batch: int):
    """Trains `model` (plain or compiled) on `segments` with the memory carried and one SGD step after each; returns
    per segment the loss, every parameter's gradient and the memory's tensors."""
    parameters = dict(model.named_parameters())
    optimizer = torch.optim.SGD(parameters.values(), lr=0.1)
    memory = init_memory(model, batch)
    records = []
    for inputs, targets in segments:
        losses, memory = objective_forward(model, inputs, targets, memory)
        losses.loss.backward()
        gradients = {name: p.grad.clone() for name, p in parameters.items() if p.grad is not None}
        records.append((losses.loss.detach(), gradients, [t.clone() for t in _memory_tensors(memory)]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return records


def _segments(vocab_size: int, batch=2, length=8, count=3):
    generator = torch.Generator().manual_seed(0)
    return [
        tuple(torch.randint(1, vocab_size, (batch, length), generator=generator) for _ in range(2))
        for _ in range(count)
    ]


# Adaptive span's `adapt_span_cache` trims the memory, in eager mode, to what the current spans reach (a length read
# from the spans' values); compiled code cannot read a value into a shape without a graph break, so it keeps the
# whole memory: what `adapt_span_cache=False` does in eager mode. The two differ once a span grows past the memory the
# last segment kept (eager then lacks keys its spans reach), so the eager reference runs without the trim.
EAGER_OVERRIDES = {"txv_adaptive_span": dict(adapt_span_cache=False)}


def _eager_and_compiled(name: str, backend: str):
    model_type, overrides = XL_FAMILY[name]
    config = tiny_config(model_type, dropout=0.0, **overrides)  # compiled dropout draws other masks than eager's
    torch.manual_seed(0)
    compiled = model_class(model_type, "AutoModelForCausalLM")(config).train()
    eager_config = tiny_config(model_type, dropout=0.0, **overrides, **EAGER_OVERRIDES.get(name, {}))
    eager = model_class(model_type, "AutoModelForCausalLM")(eager_config).train()
    eager.load_state_dict(copy.deepcopy(compiled.state_dict()))
    compiled.compile(fullgraph=True, backend=backend)  # fullgraph: a graph break anywhere is an error
    segments = _segments(config.vocab_size)
    return _train_segments(eager, segments, 2), _train_segments(compiled, segments, 2)


def _assert_same_training(expected, actual, tolerance):
    for step, ((loss, gradients, memory), (loss_c, gradients_c, memory_c)) in enumerate(zip(expected, actual)):
        where = f"segment {step}"
        torch.testing.assert_close(loss_c, loss, **tolerance, msg=f"{where}: the losses differ")
        assert gradients_c.keys() == gradients.keys()
        for name in gradients:
            torch.testing.assert_close(gradients_c[name], gradients[name], **tolerance, msg=f"{where}: {name}.grad")
        assert len(memory_c) == len(memory)
        for carried, carried_c in zip(memory, memory_c):
            torch.testing.assert_close(carried_c, carried, **tolerance, msg=f"{where}: the memory differs")


@pytest.mark.slow  # compiles for seconds
@pytest.mark.parametrize("name", XL_FAMILY)
def test_compiled_training_with_memory_equals_eager(name):
    _assert_same_training(*_eager_and_compiled(name, "aot_eager"), AOT_EAGER_TOLERANCE)


@pytest.mark.slow  # compiles for seconds (inductor: a minute or more)
def test_inductor_compiled_training_with_memory_equals_eager():
    """Inductor's fused kernels (the default backend, what `--compile` runs), on Transformer-XL with its adaptive
    softmax."""
    _assert_same_training(*_eager_and_compiled("transfo-xl", "inductor"), INDUCTOR_TOLERANCE)


@pytest.mark.slow  # compiles for seconds
def test_a_training_segment_compiles_to_one_graph_without_breaks():
    """What `torch._dynamo`'s counters say of three training segments: no graph break, and one graph per memory length
    (the first segment starts with an empty memory, the later ones with a full one)."""
    from torch._dynamo.utils import counters

    model_type, overrides = XL_FAMILY["transfo-xl"]
    config = tiny_config(model_type, dropout=0.0, **overrides)
    model = model_class(model_type, "AutoModelForCausalLM")(config).train()
    model.compile(backend="aot_eager")  # not fullgraph: a break would be counted, not raised
    counters.clear()
    _train_segments(model, _segments(config.vocab_size), 2)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2


def _compile_with(backend: str, monkeypatch) -> list:
    """Makes `torch.compile` (which `nn.Module.compile` and Accelerate call) use `backend` (aot_eager: seconds, not
    inductor's minutes on this CPU) and records what it compiled."""
    compiled = []
    torch_compile = torch.compile

    def compile_with_backend(model=None, **kwargs):
        compiled.append(model)
        return torch_compile(model, **{**kwargs, "backend": backend})

    monkeypatch.setattr(torch, "compile", compile_with_backend)
    return compiled


@pytest.mark.slow  # compiles for seconds
@pytest.mark.parametrize("trainer", [False, True], ids=["accelerate-loop", "trainer"])
def test_txv_train_compile_gives_the_uncompiled_losses(tmp_path, monkeypatch, trainer):
    """`txv train --compile` (the Accelerate loop: its training losses) and `txv train --trainer --compile`
    (Trainer's `torch_compile`: the validation loss after training) compile the model and train it as the
    uncompiled run does (dropout 0: compiled dropout draws other masks)."""
    from hf_txvariants.training.trainer import train_with_trainer

    fields = dict(TINY_TRAINING, max_steps=3, dropout=0.0, save_model=False)

    def run(name, **extra):
        args = TrainArgs(**fields, output_dir=str(tmp_path / name), **extra)
        if trainer:
            return [train_with_trainer(args)["eval_loss"]]
        return [record["loss"] for record in train(args)["history"] if record["split"] == "train"]

    plain = run("plain")
    compiled_models = _compile_with("aot_eager", monkeypatch)
    compiled = run("compiled", compile=True)
    assert len(compiled_models) == 1  # the model (its call), once
    assert len(compiled) == len(plain) == (1 if trainer else 3)
    torch.testing.assert_close(compiled, plain, **AOT_EAGER_TOLERANCE)


@pytest.mark.slow  # compiles for seconds
def test_a_trainer_compile_run_leaves_the_next_run_in_the_process_uncompiled(tmp_path, monkeypatch):
    """Accelerate keeps Trainer's compile setting in process-wide state: after `--trainer --compile`, the next run in
    the same process (the Accelerate loop here) must neither compile its model nor save it under `_orig_mod.`."""
    from safetensors.torch import load_file

    from hf_txvariants.training.trainer import train_with_trainer

    _compile_with("aot_eager", monkeypatch)
    train_with_trainer(
        TrainArgs(
            **dict(TINY_TRAINING, max_steps=1, save_model=False), compile=True, output_dir=str(tmp_path / "trainer")
        )
    )
    compiled_models = _compile_with("aot_eager", monkeypatch)
    train(TrainArgs(**dict(TINY_TRAINING, max_steps=1), output_dir=str(tmp_path / "loop")))
    assert compiled_models == []
    saved = load_file(tmp_path / "loop" / "model" / "model.safetensors")
    assert not [name for name in saved if name.startswith("_orig_mod.")]


def test_compile_is_refused_with_fsdp_before_any_work(tmp_path, monkeypatch):
    from hf_txvariants.training.models import ModelError

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ModelError, match="--compile is not tested with FSDP"):
        train(TrainArgs(**TINY_TRAINING, compile=True, output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
