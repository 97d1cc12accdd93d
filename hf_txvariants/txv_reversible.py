"""Reversible residual layers (Gomez et al. 2017, as used by Reformer) and chunked feed-forward.

A reversible block maps two streams (x1, x2) to

    y1 = x1 + F(x2)        y2 = x2 + G(y1)

and is inverted exactly by x2 = y2 - G(y1), x1 = y1 - F(x2). `reversible_sequence` runs the blocks without keeping
any activation (only the final (y1, y2) is stored), and its backward pass walks the blocks from the last one,
recomputing each block's inputs from its outputs and back-propagating through F and G one block at a time: memory
is flat in depth. Dropout and any other randomness inside F and G (e.g. LSH's random rotations) are replayed exactly:
the random state before each F and G call is saved in the forward pass and restored when it is recomputed, so the
gradients equal those of the ordinary (stored-activation) computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _random_state(device: torch.device):
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _run_with_state(function: Callable, state, device: torch.device, *args):
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=True):
        torch.set_rng_state(state["cpu"])
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], device)
        return function(*args)


class _ReversibleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x1, x2, blocks, *parameters):
        ctx.blocks = blocks
        ctx.parameters = parameters
        ctx.states = []
        with torch.no_grad():
            for f, g in blocks:
                f_state = _random_state(x2.device)
                x1 = x1 + f(x2)
                g_state = _random_state(x1.device)
                x2 = x2 + g(x1)
                ctx.states.append((f_state, g_state))
        ctx.save_for_backward(x1.detach(), x2.detach())
        return x1, x2

    @staticmethod
    def backward(ctx, grad_y1, grad_y2):
        y1, y2 = ctx.saved_tensors
        parameters = ctx.parameters
        grads = [torch.zeros_like(p) if p.requires_grad else None for p in parameters]
        trainable = [p for p in parameters if p.requires_grad]
        for (f, g), (f_state, g_state) in zip(reversed(ctx.blocks), reversed(ctx.states)):
            # y2 = x2 + G(y1): gradient through G, then x2 = y2 - G(y1).
            grad_through_g, x2 = _undo_residual(g, g_state, y1, y2, grad_y2, parameters, trainable, grads)
            grad_y1 = grad_y1 + grad_through_g
            # y1 = x1 + F(x2): gradient through F, then x1 = y1 - F(x2).
            grad_through_f, x1 = _undo_residual(f, f_state, x2, y1, grad_y1, parameters, trainable, grads)
            grad_y2 = grad_y2 + grad_through_f
            y1, y2 = x1, x2
        return (grad_y1, grad_y2, None, *grads)


def _undo_residual(function, rng_state, input, output, grad_output, parameters, trainable, grads):
    """For `output = other + function(input)`: recomputes `function(input)` (with the random state of the forward
    call), adds the gradients of `grad_output` through it to the parameters' `grads`, and returns
    `(the gradient w.r.t. input through function, other = output - function(input))`."""
    with torch.enable_grad():
        input = input.detach().requires_grad_(True)
        function_output = _run_with_state(function, rng_state, input.device, input)
        function_grads = torch.autograd.grad(function_output, [input] + trainable, grad_output, allow_unused=True)
    _accumulate(grads, parameters, function_grads[1:])
    with torch.no_grad():
        other = output - function_output
    return function_grads[0], other


def _accumulate(grads, parameters, new_grads):
    iterator = iter(new_grads)
    for i, parameter in enumerate(parameters):
        if parameter.requires_grad:
            value = next(iterator)
            if value is not None:
                grads[i] = grads[i] + value


def reversible_sequence(
    x1: torch.Tensor,
    x2: torch.Tensor,
    blocks: Sequence[tuple[Callable, Callable]],
    parameters: Sequence[torch.nn.Parameter],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs `y1 = x1 + F(x2); y2 = x2 + G(y1)` for every `(F, G)` in `blocks`, storing no activation when gradients
    are needed. `parameters`: every parameter F and G use (their gradients come from the recomputation; they are
    returned through autograd, so optimisers, hooks and gradient accumulation work as usual)."""
    if not torch.is_grad_enabled() or not (
        x1.requires_grad or x2.requires_grad or any(p.requires_grad for p in parameters)
    ):
        for f, g in blocks:
            x1 = x1 + f(x2)
            x2 = x2 + g(x1)
        return x1, x2
    return _ReversibleFunction.apply(x1, x2, list(blocks), *parameters)


def chunked_feed_forward(function: Callable, chunk_size: int, hidden_states: torch.Tensor) -> torch.Tensor:
    """`function` applied to `chunk_size` positions at a time along dim 1 (0: all at once); equal to one call for a
    position-wise function, with peak activation memory O(chunk_size) instead of O(L)."""
    if chunk_size <= 0 or hidden_states.shape[1] <= chunk_size:
        return function(hidden_states)
    return torch.cat([function(chunk) for chunk in hidden_states.split(chunk_size, dim=1)], dim=1)
