"""The learning-rate schedules of `txv train --lr-schedule`: each step runs at the rate the original trainer gives it.
The references are the originals' own scheduling code, written out here from kimiyoung/transformer-xl
pytorch/train.py (its warm-up and `scheduler.step(train_step)` after each optimiser step) and
facebookresearch/adaptive-span trainer.py / utils.py (its LambdaLR stepped before each optimiser step), driving
torch's own schedulers as they do."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_txvariants.training import TrainArgs
from hf_txvariants.training.data import DataError
from hf_txvariants.training.optimizers import LR_SCHEDULES, build_schedule


def _txv_rates(name: str, lr: float, warmup: int, max_steps: int, eta_min: float = 0.0) -> list[float]:
    """The rate of each of `max_steps` optimiser steps under `build_schedule`, stepped as the loop steps it."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    schedule = build_schedule(name, optimizer, warmup, max_steps, eta_min)
    rates = []
    for _ in range(max_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def _train_py_rates(scheduler: str, lr: float, warmup_step: int, max_step: int, eta_min: float = 0.0) -> list[float]:
    """kimiyoung's train.py: the optimiser starts at --lr; after each step `train_step += 1`, then for cosine and
    constant a warm-up rate `lr * train_step / warmup_step` while train_step < warmup_step, else (cosine)
    `CosineAnnealingLR(optimizer, max_step, eta_min).step(train_step)`; inv_sqrt is a LambdaLR stepped with
    train_step."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    if scheduler == "cosine":
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max_step, eta_min=eta_min)
    elif scheduler == "inv_sqrt":

        def lr_lambda(step):
            if step == 0 and warmup_step == 0:
                return 1.0
            return 1.0 / (step**0.5) if step > warmup_step else step / (warmup_step**1.5)

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_lambda)
    rates, train_step = [], 0
    with warnings.catch_warnings():  # step(epoch) is deprecated; train.py uses it
        warnings.simplefilter("ignore")
        for _ in range(max_step):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            train_step += 1
            if scheduler in ("cosine", "constant"):
                if train_step < warmup_step:
                    optimizer.param_groups[0]["lr"] = lr * train_step / warmup_step
                elif scheduler == "cosine":
                    schedule.step(train_step)
            else:
                schedule.step(train_step)
    return rates


def _adaptive_span_rates(lr: float, lr_warmup: int, steps: int) -> list[float]:
    """facebookresearch/adaptive-span: `LambdaLR(optimizer, lambda ep: min(1, ep / lr_warmup))` (utils.py), stepped
    before each optimiser step (trainer.py `_train_batch`)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda ep: min(1, ep / lr_warmup)) if lr_warmup else None
    rates = []
    with warnings.catch_warnings():  # the scheduler before the optimiser, as the original
        warnings.simplefilter("ignore")
        for _ in range(steps):
            if schedule is not None:
                schedule.step()
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
    return rates


@pytest.mark.parametrize("warmup, eta_min", [(0, 0.0), (1, 0.0), (7, 0.0), (7, 1e-5), (0, 2e-5)])
def test_transformer_xl_schedule_gives_each_step_train_pys_cosine_rate(warmup, eta_min):
    # rtol 1e-15: the same formula, the floor folded into a factor of --lr (a rounding or two of float64)
    expected = _train_py_rates("cosine", 2.5e-4, warmup, 40, eta_min)
    assert _txv_rates("transformer-xl", 2.5e-4, warmup, 40, eta_min) == pytest.approx(expected, rel=1e-15, abs=0)


@pytest.mark.parametrize("warmup", [0, 1, 2, 9])
def test_transformer_xl_constant_and_inv_sqrt_give_train_pys_rates(warmup):
    for ours, theirs in (("transformer-xl-constant", "constant"), ("transformer-xl-inv-sqrt", "inv_sqrt")):
        expected = _train_py_rates(theirs, 0.01, warmup, 30)
        assert _txv_rates(ours, 0.01, warmup, 30) == pytest.approx(expected, rel=1e-15, abs=0)


@pytest.mark.parametrize("warmup", [0, 1, 5])
def test_adaptive_span_schedule_gives_each_step_the_originals_rate(warmup):
    expected = _adaptive_span_rates(0.07, warmup, 12)
    assert _txv_rates("adaptive-span", 0.07, warmup, 12) == pytest.approx(expected, rel=1e-15, abs=0)


def test_cosine_and_constant_are_transformers_warmup_schedules():
    """The txv schedules: transformers' get_cosine_schedule_with_warmup / get_constant_schedule_with_warmup (the
    --eta-min floor 0), unchanged from before the originals' schedules were added."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    for name, make in (("cosine", get_cosine_schedule_with_warmup), ("constant", get_constant_schedule_with_warmup)):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        schedule = make(optimizer, 5, 30) if name == "cosine" else make(optimizer, 5)
        expected = []
        for _ in range(30):
            expected.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
        assert _txv_rates(name, 1e-3, 5, 30) == expected


def test_cosine_with_a_floor_ends_at_the_floor():
    rates = _txv_rates("cosine", 1e-3, 2, 101, eta_min=1e-4)
    # the last step runs at progress 98 / 99 of the decay: within 0.3 % of the floor, never below it
    assert rates[2] == pytest.approx(1e-3) and rates[-1] == pytest.approx(1e-4, rel=3e-3) and min(rates[2:]) >= 1e-4


def test_every_schedule_is_a_flag_choice_and_a_floor_is_refused_where_it_means_nothing():
    import typing

    assert set(typing.get_args(typing.get_type_hints(TrainArgs)["lr_schedule"])) == set(LR_SCHEDULES)
    with pytest.raises(DataError, match="--eta-min 1e-05 applies to --lr-schedule cosine or transformer-xl"):
        TrainArgs(lr_schedule="adaptive-span", eta_min=1e-5)
    with pytest.raises(DataError, match="--eta-min 0.1 is above --lr 0.001"):
        TrainArgs(lr=1e-3, eta_min=0.1)
    with pytest.raises(DataError, match="--lr-schedule must be one of cosine, constant, transformer-xl"):
        TrainArgs(lr_schedule="inv_sqrt")
