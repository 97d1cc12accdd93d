"""Adaptive Computation Time (Graves 2016, "Adaptive Computation Time for Recurrent Neural Networks"), per position.

At ponder step n = 1, 2, ... every position t reads its step input x_t^n and emits a halting probability

    h_t^n = sigmoid(W_h x_t^n + b_h)

It halts at the first step whose cumulative halting probability reaches the threshold 1 - epsilon, or at
`max_steps`, whichever comes first:

    N(t) = min( max_steps, min{ n : sum_{n'=1..n} h_t^{n'} >= 1 - epsilon } )
    R(t) = 1 - sum_{n=1..N(t)-1} h_t^n                        (the remainder, used on the last step)
    p_t^n = h_t^n for n < N(t),  p_t^{N(t)} = R(t)             (the p_t^n sum to 1)

The output is the mean field of the step outputs, y_t = sum_n p_t^n y_t^n, and the ponder cost is
rho_t = N(t) + R(t) (only R(t) carries a gradient). A position that has halted is *copied* from then on: its state is
frozen at y_t (the mean field so far, which is final) while the other positions go on, so attention layers that read
all positions see the halted ones unchanged (Dehghani et al. 2019, section 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import ModelOutput

from .txv_compat import model_output


@dataclass
class ACTOutput:
    """output: `[batch, length, hidden]` the mean field y_t. ponder_cost: `[batch, length]` N(t) + R(t) (0 at padding).
    n_updates: `[batch, length]` N(t) (float). remainders: `[batch, length]` R(t). num_steps: steps the loop ran.
    step_states: with `return_step_states`, the state after every step (halted positions frozen)."""

    output: torch.Tensor
    ponder_cost: torch.Tensor
    n_updates: torch.Tensor
    remainders: torch.Tensor
    num_steps: int
    step_states: list[torch.Tensor] | None = None


def act_halting_step(
    halting: torch.Tensor,
    cumulative: torch.Tensor,
    running: torch.Tensor,
    threshold: float,
    is_last_step: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the halting arithmetic.

    halting: h^n `[...]`; cumulative: sum of the h of the previous steps of the still running positions;
    running: bool, positions that have not halted before this step.
    Returns `(p, new_cumulative, still_running, halts_now)`: p^n (0 for positions halted earlier; R for the positions
    halting now, with R = 1 - cumulative), the updated cumulative sum, the positions still running after this
    step, and the positions halting at this step."""
    reaches = cumulative + halting >= threshold
    halts_now = running & (reaches | is_last_step)
    still_running = running & ~halts_now
    remainder = 1.0 - cumulative
    p = torch.where(halts_now, remainder, torch.where(still_running, halting, torch.zeros_like(halting)))
    new_cumulative = torch.where(still_running, cumulative + halting, cumulative)
    return p, new_cumulative, still_running, halts_now


class HaltingUnit(nn.Linear):
    """The halting unit's affine map, W_h x + b_h (one output). Its own class so that a model's `_init_weights` can
    give the bias its configured start value `bias_init` before the generic Linear initialisation claims it."""

    def __init__(self, hidden_size: int, bias_init: float):
        super().__init__(hidden_size, 1)
        self.bias_init = bias_init


def init_halting_unit(module: nn.Module, std: float) -> bool:
    """Initialises `module` if it is a `HaltingUnit` (weight N(0, std), bias its `bias_init`) and says whether it was:
    a model's `_init_weights` calls it first, before a generic Linear rule that would claim the bias."""
    if not isinstance(module, HaltingUnit):
        return False
    init.normal_(module.weight, 0.0, std)
    init.constant_(module.bias, module.bias_init)
    return True


class AdaptiveComputationTime(nn.Module):
    """The halting unit and the settings of the ACT loop. The loop itself is the model's, written around its own step
    (see `PonderLoop`, which `start` gives): this block never calls back into the model.

    Args:
        hidden_size: size of the step input the halting unit reads.
        max_steps: the largest number of steps a position may take.
        threshold: 1 - epsilon.
        halting_bias_init: initial bias of the halting unit (tensor2tensor's `act_halting_bias_init`, 1.0).
    """

    def __init__(self, hidden_size: int, max_steps: int, threshold: float = 0.99, halting_bias_init: float = 1.0):
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold (1 - epsilon) must be in (0, 1], got {threshold}")
        self.max_steps = max_steps
        self.threshold = threshold
        self.halting_bias_init = halting_bias_init
        self.halting = HaltingUnit(hidden_size, halting_bias_init)

    def halting_probability(self, step_input: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.halting(step_input).squeeze(-1).float())

    def start(
        self, state: torch.Tensor, position_mask: torch.Tensor | None = None, return_step_states: bool = False
    ) -> PonderLoop:
        """The bookkeeping of one ACT loop over `state` (`[batch, length, hidden]`, the state before the first step);
        see `PonderLoop` for the loop a model writes around it."""
        return PonderLoop(self, state, position_mask, return_step_states)


class PonderLoop:
    """The running sums of one ACT loop. The model writes the loop itself, around its own step:

        ponder = act.start(state, position_mask)
        for step in range(act.max_steps):
            step_input, step_output = <the model's step n = step + 1 on ponder.state>
            ponder.update(step_input, step_output)
            if ponder.halted:
                break
        result = ponder.result()

    step_input is what the halting unit reads (e.g. the state plus the step's coordinate embedding), step_output the
    transformed state y^n. position_mask: `[batch, length]` bool, True for real positions; padding positions halt at
    the first step and their ponder cost is 0. `state` is the next step's state: the running positions carry y^n, the
    halted ones are frozen at their (final) mean field."""

    def __init__(
        self,
        act: AdaptiveComputationTime,
        state: torch.Tensor,
        position_mask: torch.Tensor | None = None,
        return_step_states: bool = False,
    ):
        batch, length = state.shape[:2]
        self.act = act
        self.position_mask = position_mask
        self.state = state
        self.cumulative = torch.zeros(batch, length, device=state.device, dtype=torch.float32)
        self.running = torch.ones(batch, length, device=state.device, dtype=torch.bool)
        self.remainders = torch.zeros_like(self.cumulative)
        self.n_updates = torch.zeros_like(self.cumulative)
        self.output = torch.zeros_like(state)
        self.step_states = [] if return_step_states else None
        self.num_steps = 0

    def update(self, step_input: torch.Tensor, step_output: torch.Tensor) -> torch.Tensor:
        """Takes one step's `step_input` and `step_output` (step n = `num_steps` + 1); returns the next `state`."""
        act, step = self.act, self.num_steps
        halting = act.halting_probability(step_input)
        was_running = self.running
        p, self.cumulative, running, halts_now = act_halting_step(
            halting, self.cumulative, self.running, act.threshold, step == act.max_steps - 1
        )
        if self.position_mask is not None and step == 0:
            # padding positions halt at once with p = 1: no gradient, no influence
            pad = ~self.position_mask.to(torch.bool)
            halts_now = halts_now | (pad & running)
            running = running & ~pad
            p = torch.where(pad, torch.ones_like(p), p)
        self.running = running
        self.remainders = torch.where(halts_now, p, self.remainders)
        self.n_updates = self.n_updates + was_running.to(self.n_updates.dtype)
        # mean-field update: y = sum_n p^n y^n; positions halted earlier have p = 0 and are left as they were
        self.output = self.output + p.to(self.state.dtype).unsqueeze(-1) * step_output
        # the next step's state: running positions carry y^n, halted ones are frozen at their (final) mean field
        self.state = torch.where(running.unsqueeze(-1), step_output, self.output)
        self.num_steps = step + 1
        if self.step_states is not None:
            self.step_states.append(self.state)
        return self.state

    @property
    def halted(self) -> bool:
        """Whether every position has halted, so the loop may stop. A compiled / exported graph cannot branch on
        that value, so while compiling this is False and the loop runs all `max_steps` (the extra steps change
        nothing: every p is 0 and every state is frozen)."""
        return not torch.compiler.is_compiling() and not bool(self.running.any())

    def result(self) -> ACTOutput:
        ponder_cost = self.n_updates + self.remainders
        if self.position_mask is not None:
            ponder_cost = ponder_cost * self.position_mask.to(ponder_cost.dtype)
        return ACTOutput(
            output=self.output,
            ponder_cost=ponder_cost,
            n_updates=self.n_updates,
            remainders=self.remainders,
            num_steps=self.num_steps,
            step_states=self.step_states,
        )


def mean_ponder_cost(ponder_cost: torch.Tensor, position_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The scalar ponder term of a loss: the mean of rho_t = N(t) + R(t) over the real positions (`position_mask`
    True; every position when None) of `ponder_cost [batch, length]`."""
    if position_mask is None:
        return ponder_cost.mean()
    weights = position_mask.to(device=ponder_cost.device, dtype=ponder_cost.dtype)
    return (ponder_cost * weights).sum() / weights.sum().clamp(min=1)


def add_ponder_cost(loss, ponder_cost, weight: float, attention_mask=None):
    """`loss + weight * mean_ponder_cost` over the real positions of this pass (`attention_mask` `[batch, >= length]`,
    1 = real, may also cover earlier positions); `loss` unchanged when it or `ponder_cost` is None."""
    if loss is None or ponder_cost is None:
        return loss
    real = None if attention_mask is None else attention_mask[:, -ponder_cost.shape[1] :]
    return loss + weight * mean_ponder_cost(ponder_cost, real)


@model_output
class ACTModelOutput(ModelOutput):
    """The base model output of a pondering model. ponder_cost: `[batch, length]` rho_t = N(t) + R(t) (0 at padding);
    the loss adds its mean over the real positions. n_updates: `[batch, length]` N(t)."""

    last_hidden_state: torch.FloatTensor | None = None
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


@model_output
class ACTCausalLMOutput(ModelOutput):
    """loss = lm_loss + act_loss_weight * (mean of ponder_cost over the real positions)."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    ponder_cost: torch.FloatTensor | None = None
    n_updates: torch.FloatTensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


__all__ = [
    "init_halting_unit",
    "ACTOutput",
    "ACTModelOutput",
    "ACTCausalLMOutput",
    "add_ponder_cost",
    "AdaptiveComputationTime",
    "PonderLoop",
    "HaltingUnit",
    "act_halting_step",
    "mean_ponder_cost",
]
