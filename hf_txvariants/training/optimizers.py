"""The optimisers `txv train --optimizer` offers and their learning-rate schedules."""

from __future__ import annotations

import math

import torch


class PerParameterClippedAdagrad(torch.optim.Optimizer):
    """Adagrad as facebookresearch/adaptive-span trains (its adagrad_with_grad_clip.py): each parameter tensor whose
    gradient norm exceeds `grad_clip` takes a step scaled by `grad_clip / norm` (its accumulator still adds the
    whole squared gradient); no learning-rate decay, no weight decay, accumulators start at zero."""

    def __init__(self, params, lr: float, grad_clip: float = 0.0, eps: float = 1e-10):
        super().__init__(params, dict(lr=lr, grad_clip=grad_clip, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                state = self.state[param]
                if not state:
                    state["sum"] = torch.zeros_like(param)
                step_size = group["lr"]
                if group["grad_clip"] > 0:
                    norm = float(grad.norm(2))
                    if norm > group["grad_clip"]:
                        step_size *= group["grad_clip"] / (norm + group["eps"])
                state["sum"].addcmul_(grad, grad)
                param.addcdiv_(grad, state["sum"].sqrt().add_(group["eps"]), value=-step_size)
        return loss


def build_optimizer(name: str, model, lr: float, weight_decay: float, clip_norm: float):
    """`adamw`: AdamW, weight decay on the matrices only (with weight decay 0 it is Adam); `adagrad`: the
    adaptive-span authors' Adagrad, which clips each parameter's gradient at `clip_norm` itself."""
    if name == "adagrad":
        return PerParameterClippedAdagrad(model.parameters(), lr=lr, grad_clip=clip_norm)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )


# The learning-rate schedules of `txv train --lr-schedule`, as the rate of optimiser step k + 1 (k steps taken) over
# --lr. The originals' are reproduced as their scripts step them (kimiyoung/transformer-xl pytorch/train.py sets the
# warm-up rate after each step and steps its scheduler with `train_step`; facebookresearch/adaptive-span's trainer.py
# steps its LambdaLR before each optimiser step), so each step runs at the rate the original gave it.
LR_SCHEDULES = {
    "cosine": "linear warm-up (step k + 1 at k / W), then cosine decay from the end of the warm-up to --eta-min at "
    "--max-steps",
    "constant": "linear warm-up (step k + 1 at k / W), then constant",
    "transformer-xl": "kimiyoung/transformer-xl train.py --scheduler cosine: the first step at --lr, step k + 1 at "
    "k / W during the warm-up, then CosineAnnealingLR counted from step 0 to --max-steps, down to --eta-min",
    "transformer-xl-inv-sqrt": "train.py --scheduler inv_sqrt: step k + 1 at k / W^1.5 up to W, then 1 / sqrt(k) "
    "(the first step at --lr when W is 0)",
    "transformer-xl-constant": "train.py --scheduler constant: the first step at --lr, step k + 1 at k / W during the "
    "warm-up, then the last warm-up rate, (W - 1) / W (train.py never sets --lr again)",
    "adaptive-span": "facebookresearch/adaptive-span: step k at min(1, k / W) (its LambdaLR is stepped before the "
    "optimiser), then constant",
}
SCHEDULES_WITH_FLOOR = ("cosine", "transformer-xl")  # those --eta-min applies to


def lr_factor(name: str, warmup_steps: int, max_steps: int, floor: float = 0.0):
    """The schedule `name` (LR_SCHEDULES) as a function of the optimiser steps taken, k, giving the rate of the next
    step over the peak rate; `floor` is --eta-min over the peak rate."""
    if name not in LR_SCHEDULES:
        raise ValueError(f"unknown learning-rate schedule {name!r}; known: {', '.join(LR_SCHEDULES)}")
    if floor and name not in SCHEDULES_WITH_FLOOR:
        raise ValueError(
            f"a learning-rate floor (--eta-min) applies to {' and '.join(SCHEDULES_WITH_FLOOR)}, not {name}"
        )
    warmup = warmup_steps

    def cosine(progress: float) -> float:
        return floor + (1.0 - floor) * (0.5 * (1.0 + math.cos(math.pi * progress)))

    def factor(k: int) -> float:
        if name in ("cosine", "constant"):  # transformers' get_cosine / get_constant_schedule_with_warmup
            if k < warmup:
                return float(k) / float(max(1, warmup))
            if name == "constant":
                return 1.0
            return max(0.0, cosine(float(k - warmup) / float(max(1, max_steps - warmup))))
        if name == "adaptive-span":
            return min(1.0, (k + 1) / warmup) if warmup > 0 else 1.0
        if name == "transformer-xl-inv-sqrt":
            if k == 0 and warmup == 0:
                return 1.0
            return 1.0 / (k**0.5) if k > warmup else k / (warmup**1.5)
        # train.py's cosine and constant: the optimiser starts at --lr; after step k, a warm-up rate is set if k < W
        if k == 0:
            return 1.0
        if k < warmup:
            return k / warmup
        if name == "transformer-xl-constant":
            return (warmup - 1) / warmup if warmup > 1 else 1.0
        return cosine(k / max_steps)

    return factor


def build_schedule(name: str, optimizer, warmup_steps: int, max_steps: int, eta_min: float = 0.0):
    """The schedule `name` (LR_SCHEDULES) of `optimizer`, stepped once after each optimiser step; `eta_min` is the
    cosine schedules' floor, in learning-rate units."""
    peak = optimizer.param_groups[0]["lr"]
    factor = lr_factor(name, warmup_steps, max_steps, eta_min / peak if eta_min else 0.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
