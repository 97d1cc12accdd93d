"""Memory tasks for `MemoryPolicy`, as vectorised gymnasium environments.

- `ProofOfMemoryEnv` (`txv/ProofOfMemory-v0`): the proof-of-memory task CleanRL's `ppo_trxl` is first shown on,
  written here from its description. The agent stands in the middle of a line with a goal at each end. For the first
  `cue_steps` steps it cannot move and sees which end is the goal; then the cue is gone. It moves left or right
  (`1 / steps_to_end` per step): reaching the goal ends the episode with +1, the other end with -1, and
  `max_steps` steps without reaching either with 0. Observation `[goal_is_left, position, goal_is_right]`. A
  memoryless agent walks to one end whatever the cue: mean return 0; remembering the cue gives 1.
- POPGym (Morad et al. 2023) through `popgym_env(name)`: the environment class with POPGym's `Antialias` wrapper
  (a flag on the first step), flattened to one vector of one-hot codes; POPGym's baselines also add the previous
  action, which is optional here (`previous_action`) and off by default: it makes RepeatFirst memoryless.
  `POPGYM_TASKS` holds RepeatFirst and RepeatPrevious (Easy / Medium / Hard: POPGym's k = 4 / 32 / 64, the current
  card counting as 1 back, so the card shown 3 / 31 / 63 steps before; 52 / 104 / 156 cards), Autoencode Easy /
  Medium (watch 52 / 104 suits, then say them in reverse order) and CountRecall Easy / Medium (at every step, say how
  many cards of the queried colour / suit were dealt so far, the one shown now included).

`make_vector_env` builds a `gymnasium.vector.SyncVectorEnv` that resets an ended episode within the same step
(`AutoresetMode.SAME_STEP`, what `train_ppo` expects): the observation returned with `terminated | truncated` is
already the new episode's first.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

POPGYM_TASKS = {
    "RepeatPreviousEasy": "popgym.envs.repeat_previous",
    "RepeatPreviousMedium": "popgym.envs.repeat_previous",
    "RepeatPreviousHard": "popgym.envs.repeat_previous",
    "RepeatFirstEasy": "popgym.envs.repeat_first",
    "RepeatFirstMedium": "popgym.envs.repeat_first",
    "RepeatFirstHard": "popgym.envs.repeat_first",
    "AutoencodeEasy": "popgym.envs.autoencode",
    "AutoencodeMedium": "popgym.envs.autoencode",
    "CountRecallEasy": "popgym.envs.count_recall",
    "CountRecallMedium": "popgym.envs.count_recall",
}


class ProofOfMemoryEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, cue_steps: int = 2, steps_to_end: int = 4, max_steps: int = 16):
        for name, value, least in (("cue_steps", cue_steps, 1), ("steps_to_end", steps_to_end, 1)):
            if value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        if max_steps < cue_steps + steps_to_end:
            raise ValueError(
                f"max_steps ({max_steps}) must leave time to reach a goal: at least cue_steps + "
                f"steps_to_end = {cue_steps + steps_to_end}"
            )
        self.cue_steps, self.steps_to_end, self.max_steps = cue_steps, steps_to_end, max_steps
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self.goal_is_right = False
        self.position = 0  # in steps, -steps_to_end .. steps_to_end
        self.time = 0

    def _observation(self) -> np.ndarray:
        cue_visible = self.time < self.cue_steps
        return np.array(
            [
                cue_visible and not self.goal_is_right,
                self.position / self.steps_to_end,
                cue_visible and self.goal_is_right,
            ],
            dtype=np.float32,
        )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.goal_is_right = bool(self.np_random.integers(2))
        self.position, self.time = 0, 0
        return self._observation(), {}

    def step(self, action):
        if self.time >= self.cue_steps:  # frozen while the cue is shown
            self.position += 1 if int(action) == 1 else -1
        self.time += 1
        reward, terminated = 0.0, False
        if abs(self.position) == self.steps_to_end:
            terminated = True
            reward = 1.0 if (self.position > 0) == self.goal_is_right else -1.0
        truncated = not terminated and self.time >= self.max_steps
        return self._observation(), reward, terminated, truncated, {}


gym.register("txv/ProofOfMemory-v0", entry_point=ProofOfMemoryEnv)


def popgym_env(name: str, previous_action: bool = False) -> gym.Env:
    """A POPGym environment (`POPGYM_TASKS`) with POPGym's `Antialias` wrapper (a flag on the first observation),
    flattened to a Box of one-hot codes.

    previous_action: also show the previous action (POPGym's `PreviousAction` wrapper, which its own baselines use).
    Off by default: with it, RepeatFirst needs no memory at all, since "answer the first card's suit, then repeat
    your previous action" scores the maximum 1.0 (`tests/test_rl_policy.py`). RepeatPrevious, Autoencode and
    CountRecall stay memory tasks with it: the previous action is the agent's own answer about an earlier card, not
    the one asked now (repeating it scores chance, `tests/test_rl_hard_tasks.py`). POPGym's order is kept:
    `Antialias(PreviousAction(env))`, so the flattened vector is [observation, previous action, first-step flag]."""
    if name not in POPGYM_TASKS:
        raise ValueError(f"unknown POPGym task {name!r}; known: {', '.join(POPGYM_TASKS)}")
    try:
        import importlib

        module = importlib.import_module(POPGYM_TASKS[name])
        from popgym.wrappers import Antialias, PreviousAction
    except ImportError as error:
        raise ImportError("the POPGym tasks need popgym: pip install 'hf-txvariants[rl]'") from error
    env = getattr(module, name)()
    if previous_action:
        env = PreviousAction(env)
    return gym.wrappers.FlattenObservation(Antialias(env))


def make_env(task: str, previous_action: bool = False) -> gym.Env:
    """`task`: a POPGym task name (`POPGYM_TASKS`) or a gymnasium id (e.g. `txv/ProofOfMemory-v0`).
    previous_action: show the previous action too (POPGym tasks only, see `popgym_env`)."""
    if task in POPGYM_TASKS:
        return popgym_env(task, previous_action=previous_action)
    if previous_action:
        raise ValueError(f"previous_action is for the POPGym tasks ({', '.join(POPGYM_TASKS)}), not {task!r}")
    return gym.make(task)


def make_vector_env(
    task: str, num_envs: int, seed: int | None = None, previous_action: bool = False
) -> gym.vector.SyncVectorEnv:
    """`num_envs` copies of `make_env(task, previous_action)` in one `SyncVectorEnv` that resets ended episodes
    within the step."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    make_env(task, previous_action).close()  # refuse a bad task or option here, by name, not inside the vector env
    envs = gym.vector.SyncVectorEnv(
        [lambda: make_env(task, previous_action) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    envs.action_space.seed(seed)
    return envs


__all__ = ["POPGYM_TASKS", "ProofOfMemoryEnv", "make_env", "make_vector_env", "popgym_env"]
