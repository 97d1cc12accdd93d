"""What a policy's memory reads: the observations, encoded (`ObservationEncoder`: one-hot codes for Discrete and
MultiDiscrete spaces, flattened floats for a Box, then one linear layer), and optionally the step within the episode
(`EpisodeClock`, off by default; `make_policy(..., episode_clock=True)`), added to them.

The clock is an absolute position, counted from the agent's own episode starts, as the episodic PPO-TrXL of Pleines et
al. (2023) gives its memory. GTrXL's attention knows only how far back a slot lies; a task whose answer lies at a
distance that depends on the step within the episode (POPGym's Autoencode: answer t, counting from 0, is the card shown
2t steps before, the cards read back in reverse) needs the clock to find it (benchmarks/RESULTS.md, issue 30).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def _space_size(space) -> int:
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    raise ValueError(
        f"observation_space must be Discrete, MultiDiscrete or Box, got {type(space).__name__}; wrap the environment "
        "(e.g. gymnasium.wrappers.FlattenObservation) to give it one of these"
    )


class ObservationEncoder(nn.Module):
    """Observations `[..., *observation_shape]` -> `[..., hidden_size]`: one-hot codes for Discrete and MultiDiscrete
    spaces, flattened floats for a Box, then one linear layer."""

    def __init__(self, observation_space, hidden_size: int):
        super().__init__()
        import gymnasium as gym

        self.observation_space = observation_space
        self.input_size = _space_size(observation_space)
        if isinstance(observation_space, gym.spaces.Discrete):
            self.event_dims, self.categories = 0, [int(observation_space.n)]
            self.offset = int(observation_space.start)
        elif isinstance(observation_space, gym.spaces.MultiDiscrete):
            if observation_space.nvec.ndim != 1:
                raise ValueError(
                    f"a MultiDiscrete observation_space must be one-dimensional, got nvec shape "
                    f"{observation_space.nvec.shape}"
                )
            self.event_dims, self.categories = 1, [int(n) for n in observation_space.nvec]
            self.offset = 0
        else:
            self.event_dims, self.categories = len(observation_space.shape), None
        self.projection = nn.Linear(self.input_size, hidden_size)

    def features(self, observations: torch.Tensor) -> torch.Tensor:
        batch_shape = observations.shape[: observations.dim() - self.event_dims]
        if self.categories is None:
            return observations.reshape(*batch_shape, self.input_size).float()
        codes = (observations.long() - self.offset).reshape(*batch_shape, len(self.categories))
        for i, n in enumerate(self.categories):
            outside = codes[..., i][(codes[..., i] < 0) | (codes[..., i] >= n)]
            if outside.numel():
                raise ValueError(
                    f"observations hold value {int(outside[0]) + self.offset} outside the observation "
                    f"space {self.observation_space}"
                )
        return torch.cat(
            [nn.functional.one_hot(codes[..., i], n) for i, n in enumerate(self.categories)], dim=-1
        ).float()

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.projection(self.features(observations))


# The clock's default periods (in steps): the powers of 2 from 4 to 512, so that sin / cos of the step tell apart the
# steps of an episode up to a few hundred steps, and the products of a query's and a key's features (what attention
# computes) can express a fixed relation between their two steps, e.g. Autoencode's key at step c - s for a query
# at step s.
EPISODE_CLOCK_PERIODS = tuple(2.0**k for k in range(2, 10))


class EpisodeClock(nn.Module):
    """The step within the episode (0 at its first step) as sin and cos of 2 pi step / period for each of `periods`,
    mapped to the hidden size by a learned linear layer (no bias), added to the encoded observations."""

    def __init__(self, periods, hidden_size: int):
        super().__init__()
        given = periods
        try:  # a string is iterable too: "48" would read as periods 4 and 8
            periods = None if isinstance(periods, (str, bytes)) else [float(p) for p in periods]
        except (TypeError, ValueError):
            periods = None
        if not periods or any(not math.isfinite(p) or p <= 0 for p in periods):
            raise ValueError(f"episode_clock periods must be positive finite numbers (a list of them), got {given!r}")
        self.periods = periods
        self.register_buffer(
            "angular_speeds", 2 * math.pi / torch.tensor(periods, dtype=torch.float64), persistent=False
        )
        self.projection = nn.Linear(2 * len(periods), hidden_size, bias=False)

    @staticmethod
    def episode_steps(episode_starts: torch.Tensor, steps_before: torch.Tensor) -> torch.Tensor:
        """The step within its episode of each position `[envs, steps]`: 0 where an episode starts, else one more
        than the position before; `steps_before [envs]` is the step the first position would have (the steps the
        env's episode had taken before this call)."""
        envs, steps = episode_starts.shape
        if steps == 1:  # acting: one position per env
            return torch.where(episode_starts[:, 0], 0, steps_before)[:, None]
        index = torch.arange(steps, device=episode_starts.device).expand(envs, steps)
        last_start = torch.where(episode_starts, index, -1).cummax(dim=1).values  # the latest start at or before
        return torch.where(last_start >= 0, index - last_start, steps_before[:, None] + index)

    def forward(self, episode_steps: torch.Tensor, dtype) -> torch.Tensor:
        # in float64, so that a step in the millions keeps its phase to well within a period
        angles = episode_steps.to(torch.float64)[..., None] * self.angular_speeds
        features = torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)
        return self.projection(features)


__all__ = ["EPISODE_CLOCK_PERIODS", "EpisodeClock", "ObservationEncoder"]
