"""Each variant trains on its own objective (issue "Train as the papers train", item 1): `txv train` and
`MemoryTrainer` optimise `outputs.loss` (the next-token loss plus the span penalty, the ponder cost or Al-Rfou's
auxiliary losses), log the objective, its next-token part and every auxiliary term by name, carry the original
adaptive-span model's `SpanCache`, and resume exactly. The objective matters: on the same data and seed, a span
penalty ends with shorter spans and a ponder cost with fewer pondering steps than the same run with weight 0."""

from __future__ import annotations

import math

import pytest
import torch

from hf_txvariants.training import (
    TrainArgs,
    build_char_tokenizer,
    build_config,
    build_model,
    encode,
    read_metrics,
    segment_dataset,
    segment_stream,
    train,
)
from hf_txvariants.training.data import default_corpus
from hf_txvariants.training.models import init_memory, objective_forward
from tiny_configs import TINY_TRAINING

TINY = dict(TINY_TRAINING, dropout=0.0, save_model=False, seed=0)
SPAN = dict(attn_span=32, adapt_span_init=0.5, adapt_span_ramp=4)
# the objective's weights, by the name of the term they multiply
WEIGHTS = {
    "span_penalty": "adapt_span_loss",
    "ponder_cost": "act_loss_weight",
    "intermediate_loss": "intermediate_loss_weight",
    "future_loss": "future_target_loss_weight",
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _train_records(folder) -> list[dict]:
    return [m for m in read_metrics(folder) if m["split"] == "train"]


@pytest.mark.parametrize(
    "variant, extra, terms",
    [
        ("txv_adaptive_span", {**SPAN, "adapt_span_loss": 0.05}, {"span_penalty"}),
        ("txv_gtrxl", {**SPAN, "adapt_span_enabled": True, "adapt_span_loss": 0.05}, {"span_penalty"}),
        ("txv_adaptive_span_original", {**SPAN, "adapt_span_enabled": True, "adapt_span_loss": 0.05}, {"span_penalty"}),
        ("txv_universal", {"act_loss_weight": 0.05}, {"ponder_cost"}),
        ("txv_act_rnn", {"act_loss_weight": 0.05}, {"ponder_cost"}),
        (
            "txv_vanilla",
            {"intermediate_loss_weight": 0.5, "num_future_targets": 2, "future_target_loss_weight": 0.5},
            {"intermediate_loss", "future_loss"},
        ),
        ("txv_shaw", {}, set()),
    ],
)
def test_the_loop_optimises_and_logs_the_variants_objective(tmp_path, variant, extra, terms):
    """metrics.jsonl has `loss` = lm_loss + sum of weight x term over the terms the variant has, each term by name,
    and bpc / perplexity of the next-token part."""
    result = train(TrainArgs(output_dir=str(tmp_path), variant=variant, max_steps=3, extra_config=extra, **TINY))
    config = result["config"]
    for record in _train_records(tmp_path):
        logged = {name for name in WEIGHTS if name in record}
        # Al-Rfou's intermediate losses stop at progress 1/(2L) = 1/4: only the first step of three has them
        expected = terms - ({"intermediate_loss"} if record["step"] > 1 else set())
        assert logged == expected, record
        objective = record["lm_loss"] + sum(getattr(config, WEIGHTS[name]) * record[name] for name in logged)
        # the model adds the terms in float32; the log averages them separately: rounding only
        assert record["loss"] == pytest.approx(objective, rel=1e-5), record
        if terms:
            assert record["loss"] > record["lm_loss"]
        assert record["bpc"] == pytest.approx(record["lm_loss"] / math.log(2))
        assert record["perplexity"] == pytest.approx(math.exp(record["lm_loss"]))


def test_a_span_penalty_ends_with_shorter_spans_than_none(tmp_path):
    """The same data and seed, 30 steps: with the span penalty the learned spans end shorter than with weight 0,
    and shorter than they started (the objective reaches the span parameters)."""
    spans = {}
    for weight in (0.0, 0.05):
        result = train(
            TrainArgs(
                output_dir=str(tmp_path / str(weight)),
                variant="txv_adaptive_span",
                max_steps=30,
                extra_config={**SPAN, "adapt_span_loss": weight},
                **TINY,
            )
        )
        spans[weight] = float(result["model"].get_spans().mean())
    start = SPAN["adapt_span_init"] * SPAN["attn_span"]
    assert spans[0.05] < start - 1.0 and spans[0.05] < spans[0.0] - 1.0, spans


def test_a_ponder_cost_ends_with_fewer_pondering_steps_than_none(tmp_path):
    """The Universal Transformer with ACT, the same data and seed, 20 steps: with a ponder cost the model ponders
    fewer steps per position (N(t), on held-out text) than the same run with weight 0."""
    tokens = None
    steps = {}
    for weight in (0.0, 0.05):
        result = train(
            TrainArgs(
                output_dir=str(tmp_path / str(weight)),
                variant="txv_universal",
                max_steps=20,
                extra_config={"act_loss_weight": weight, "halting_bias_init": -1.0},
                **{**TINY, "n_layer": 4},
            )
        )
        model, tokenizer = result["model"].eval(), result["tokenizer"]
        if tokens is None:
            tokens = encode(tokenizer, default_corpus()[-4000:])[: 4 * 64].view(4, 64)
        with torch.no_grad():
            steps[weight] = float(model(input_ids=tokens).n_updates.float().mean())
    assert steps[0.05] < steps[0.0] - 0.25, steps


def test_the_original_adaptive_span_model_carries_its_span_cache(tmp_path):
    """`objective_forward` carries the `SpanCache` from one segment to the next: the returned cache holds the first
    segment's (non-zero) states, and the second segment's loss differs from that of a fresh (zero) cache (the same
    operations on the same inputs give the same bits, so any difference comes from the carried states)."""
    torch.manual_seed(0)
    model = build_model(
        build_config(
            "txv_adaptive_span_original",
            40,
            d_model=32,
            n_layer=2,
            n_head=2,
            seg_len=16,
            dropout=0.0,
            adapt_span_enabled=True,
            **SPAN,
        )
    )
    stream = segment_stream(torch.randint(0, 40, (400,)), 2, 16)
    memory = init_memory(model, 2)
    assert type(memory).__name__ == "SpanCache"
    _, memory = objective_forward(model, *stream.segment(0), memory)
    assert memory.seen_tokens == 16 and all(bool(state.abs().amax() > 0) for state in memory.states)
    carried, _ = objective_forward(model, *stream.segment(1), memory)
    fresh, _ = objective_forward(model, *stream.segment(1), init_memory(model, 2))
    assert float(carried.lm_loss.detach()) != float(fresh.lm_loss.detach())


def test_a_resumed_span_cache_run_gives_the_same_losses(tmp_path):
    """The original adaptive-span model's SpanCache is checkpointed with the run: a run stopped after step 3 and
    resumed from its step-2 checkpoint gives the losses of the run never interrupted, bit for bit."""

    class Stop(Exception):
        pass

    def stop_after_3(step):
        if step == 3:
            raise Stop

    settings = dict(
        variant="txv_adaptive_span_original",
        max_steps=5,
        save_every=2,
        extra_config={**SPAN, "adapt_span_enabled": True, "adapt_span_loss": 0.05},
        **TINY,
    )
    train(TrainArgs(output_dir=str(tmp_path / "whole"), **settings))
    with pytest.raises(Stop):
        train(TrainArgs(output_dir=str(tmp_path / "resumed"), **settings), on_step=stop_after_3)
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "step-2" / "memory_rank0.pt", weights_only=True)
    assert saved[0]["model_type"] == "txv_adaptive_span_original" and len(saved[0]["states"]) == 2  # SpanCache state
    train(TrainArgs(output_dir=str(tmp_path / "resumed"), resume="latest", **settings))
    whole, resumed = _train_records(tmp_path / "whole"), _train_records(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5]
    # the same operations on the same states: exact
    assert [(r["loss"], r["span_penalty"]) for r in resumed] == [(r["loss"], r["span_penalty"]) for r in whole]


def test_memory_trainer_optimises_the_objective_and_logs_its_parts(tmp_path):
    """MemoryTrainer trains the Universal Transformer on loss = lm_loss + act_loss_weight * ponder_cost: its training
    logs name lm_loss and ponder_cost, and its evaluation loss is the next-token part (no ponder cost)."""
    from transformers import TrainingArguments

    from hf_txvariants.training.trainer import MemoryTrainer

    tokenizer = build_char_tokenizer(default_corpus()[:5000])
    tokens = encode(tokenizer, default_corpus()[:5000])
    torch.manual_seed(0)
    model = build_model(
        build_config(
            "txv_universal",
            len(tokenizer),
            d_model=32,
            n_layer=3,
            n_head=2,
            seg_len=16,
            dropout=0.0,
            act_loss_weight=0.05,
        )
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=3e-3,
        max_steps=3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = MemoryTrainer(
        model=model,
        args=args,
        train_dataset=segment_dataset(tokens[:3000], 4, 16),
        eval_dataset=segment_dataset(tokens[3000:], 4, 16),
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry and "lm_loss" in entry]
    assert len(logs) == 3
    for entry in logs:
        # Trainer rounds the logged loss to 4 digits
        expected = entry["lm_loss"] + 0.05 * entry["ponder_cost"]
        assert entry["loss"] == pytest.approx(expected, abs=1e-4), entry
    metrics = trainer.evaluate()
    model.eval()
    lm_losses, losses = [], []
    with torch.no_grad():
        for batch in trainer.get_eval_dataloader():
            output = model(input_ids=batch["input_ids"], shift_labels=batch["shift_labels"])
            lm_losses.append(float(output.lm_loss))
            losses.append(float(output.loss))
    # the mean of the batches' next-token parts (equal batches), not of their objectives
    assert metrics["eval_loss"] == pytest.approx(sum(lm_losses) / len(lm_losses), rel=1e-5)
    assert sum(losses) / len(losses) > metrics["eval_loss"] + 0.01
    assert metrics["eval_bpc"] == pytest.approx(metrics["eval_loss"] / math.log(2))


def test_memory_trainer_carries_the_span_cache_and_clamps_the_spans(tmp_path):
    """MemoryTrainer passes the original adaptive-span model the SpanCache returned by the step before, and clamps
    every span into [0, 1] of attn_span after each optimiser step (the original's clamp_param): a strong span penalty
    and a large learning rate would otherwise push the spans below 0."""
    from transformers import TrainingArguments

    from hf_txvariants.training.trainer import MemoryTrainer
    from hf_txvariants.txv_adaptive_span import AdaptiveSpan

    tokenizer = build_char_tokenizer(default_corpus()[:3000])
    tokens = encode(tokenizer, default_corpus()[:3000])
    torch.manual_seed(0)
    model = build_model(
        build_config(
            "txv_adaptive_span_original",
            len(tokenizer),
            d_model=32,
            n_layer=2,
            n_head=2,
            seg_len=16,
            dropout=0.0,
            attn_span=32,
            adapt_span_enabled=True,
            adapt_span_init=0.01,
            adapt_span_ramp=4,
            adapt_span_loss=1.0,
        )
    )
    received = []
    original_forward = model.forward

    def forward(*args, **kwargs):
        cache = kwargs.get("cache")
        received.append(None if cache is None else cache.seen_tokens)
        return original_forward(*args, **kwargs)

    model.forward = forward
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        learning_rate=0.5,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        lr_scheduler_type="constant",
        remove_unused_columns=False,
    )
    MemoryTrainer(model=model, args=args, train_dataset=segment_dataset(tokens, 2, 16)).train()
    assert received == [0, 16, 32]  # a zero cache first, then the states of the segments before
    values = torch.cat([m.current_val.detach().flatten() for m in model.modules() if isinstance(m, AdaptiveSpan)])
    assert float(values.min()) >= 0.0 and float(values.max()) <= 1.0, values
