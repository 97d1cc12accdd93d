"""The optimisers `txv train --optimizer` offers and their learning-rate schedules."""

from __future__ import annotations

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


def build_schedule(name: str, optimizer, warmup_steps: int, max_steps: int):
    """`cosine`: linear warm-up, then cosine decay to 0 at `max_steps`; `constant`: linear warm-up, then constant."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    if name == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup_steps)
    return get_cosine_schedule_with_warmup(optimizer, warmup_steps, max_steps)
