"""Trainer callbacks for hf_txvariants models (kept out of the modeling files, which ship in every Hub repo)."""

from __future__ import annotations

from transformers import TrainerCallback


class TrainingProgressCallback(TrainerCallback):
    """For transformers' Trainer: sets `model.set_training_progress(global_step / max_steps)` before every step, which
    drives Al-Rfou's intermediate-loss schedule of `VanillaForCausalLM`
    (`Trainer(..., callbacks=[TrainingProgressCallback()])`). Models without that method are left alone."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and hasattr(model, "set_training_progress") and state.max_steps:
            model.set_training_progress(min(1.0, state.global_step / state.max_steps))


class SpanClampCallback(TrainerCallback):
    """For transformers' Trainer: clamps the learned spans of an adaptive-span model into [0, attn_span] after every
    optimiser step (`clamp_spans_`, the original's `clamp_param`), as `txv train` does. Other models are left alone."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if model is not None:
            from .models import after_optimizer_step

            after_optimizer_step(model)


def add_objective_callbacks(trainer):
    """Gives a Trainer the callbacks the variants' objectives need (Al-Rfou's schedule, the span clamp), unless it has
    them; each leaves models without the matching method alone."""
    for callback_class in (TrainingProgressCallback, SpanClampCallback):
        if not any(isinstance(c, callback_class) for c in trainer.callback_handler.callbacks):
            trainer.add_callback(callback_class())


__all__ = ["SpanClampCallback", "TrainingProgressCallback", "add_objective_callbacks"]
