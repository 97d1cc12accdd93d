"""Reinforcement learning with a memory: `MemoryPolicy` (GTrXL, TrXL-I, GRU or MLP body) for vectorised gymnasium
environments, a segment-based PPO loop (`train_ppo`) and memory tasks (`txv/ProofOfMemory-v0`, POPGym).
Needs gymnasium (`pip install 'hf-txvariants[rl]'`, which also brings popgym)."""

from . import envs as _envs
from . import policy as _policy
from . import ppo as _ppo
from .envs import *  # noqa: F403
from .policy import *  # noqa: F403
from .ppo import *  # noqa: F403

__all__ = [*_envs.__all__, *_policy.__all__, *_ppo.__all__]
