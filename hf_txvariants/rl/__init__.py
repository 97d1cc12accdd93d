"""Reinforcement learning with a memory: `MemoryPolicy` (GTrXL, TrXL-I, GRU or MLP body, optionally an episode clock;
Discrete, MultiDiscrete or Box actions) for vectorised gymnasium environments, a segment-based PPO loop
(`train_ppo`) and memory tasks (`txv/ProofOfMemory-v0`, POPGym). A policy saves, loads and shares with
`save_pretrained` / `from_pretrained` / `push_to_hub`, acts step by step from numpy with `predict`, and
`python -m hf_txvariants.rl.evaluate` runs a saved one (`evaluate_policy` in `hf_txvariants.rl.evaluate`).
Needs gymnasium (`pip install 'hf-txvariants[rl]'`, which also brings popgym).

Files by idea: `encoder` (observations and the episode clock), `bodies` (the memories), `policy` (the policy, its
action distributions, the benchmark's agents), `sharing` (saving, loading, the Hub), `ppo`, `envs`, `spaces`."""

from . import bodies as _bodies
from . import encoder as _encoder
from . import envs as _envs
from . import policy as _policy
from . import ppo as _ppo
from . import spaces as _spaces
from .bodies import *  # noqa: F403
from .encoder import *  # noqa: F403
from .envs import *  # noqa: F403
from .policy import *  # noqa: F403
from .ppo import *  # noqa: F403
from .spaces import *  # noqa: F403

__all__ = [*_envs.__all__, *_encoder.__all__, *_bodies.__all__, *_policy.__all__, *_ppo.__all__, *_spaces.__all__]
