"""GTrXL (and TrXL-I, and the GRU to compare with) as the memory of an RLlib PPO agent, on RLlib's current API stack
(RLModule, Learner, EnvRunner). Needs Ray: `pip install "hf-txvariants[rllib]"`.

    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env
    from hf_txvariants.rl import PPOSettings, make_env
    from hf_txvariants.rl.rllib import EpisodeReturns, memory_module_spec, ppo_training_settings

    register_env("rpm", lambda _: make_env("RepeatPreviousMedium", previous_action=True))
    env = make_env("RepeatPreviousMedium", previous_action=True)  # for its spaces
    config = (
        PPOConfig()
        .environment("rpm")
        .env_runners(num_env_runners=2, num_envs_per_env_runner=8)
        .training(**ppo_training_settings(PPOSettings(), num_envs=16))  # train_ppo's PPO settings
        .rl_module(rl_module_spec=memory_module_spec("gtrxl", env.observation_space, env.action_space, mem_len=32))
        .callbacks(EpisodeReturns)  # every finished episode's return: POPGym's MMER
    )
    algo = config.build_algo()
    algo.train()
    algo.get_module().save_pretrained("policy")  # MemoryPolicy's format: MemoryPolicy.from_pretrained("policy")

`MemoryRLModule` holds a `MemoryPolicy` (`make_policy`'s, the same network `train_ppo` trains) and gives RLlib its
memory as the module's state: the env runners carry it per environment from step to step and start every episode from
`get_initial_state()` (an empty memory: what an episode start gives `MemoryPolicy`); the Learner re-runs each stored
segment of at most `max_seq_len` steps from the memory stored when acting reached its start, as `train_ppo` learns
(truncated back-propagation from the memory computed while acting). RLlib cuts its segments at episode ends (zero
padding the last one, masked out of the loss), where `train_ppo`'s run across them with `episode_starts`: with short
episodes, a `max_seq_len` near their length keeps the padding small (benchmarks/results/rllib.md).

The actor and the critic share the memory body, as in `train_ppo`; PPO's `vf_share_layers` (which PPOConfig always
passes) is not read. Any other `model_config` key the module does not read is refused by name, as are the spaces it
cannot take (`check_rllib_spaces`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..configuration_gtrxl import GTrXLConfig
from .policy import make_policy
from .ppo import PPOSettings

try:
    from ray.rllib.callbacks.callbacks import RLlibCallback
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.core.rl_module.torch import TorchRLModule
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError('hf_txvariants.rl.rllib needs Ray RLlib: pip install "hf-txvariants[rllib]"') from error

RLLIB_BODIES = ("gtrxl", "trxl_i", "gru")
# What PPOConfig passes into every module's model_config by itself (`PPOConfig._model_config_auto_includes`)
RLLIB_AUTO_KEYS = frozenset({"vf_share_layers"})
# RLlib's default-model settings a user might reach for, and what sets the same thing here
RLLIB_DEFAULT_MODEL_KEYS = {
    "use_lstm": "body",
    "use_attention": "body",
    "lstm_cell_size": "hidden_size",
    "attention_dim": "hidden_size",
    "attention_num_transformer_units": "num_hidden_layers",
    "attention_num_heads": "num_attention_heads",
    "attention_memory_inference": "mem_len",
    "attention_memory_training": "mem_len",
    "fcnet_hiddens": "hidden_size / intermediate_size",
}


def gtrxl_fields() -> frozenset[str]:
    """The `GTrXLConfig` fields a body may be given (not transformers' generic config fields, not `vocab_size`:
    observations come in as embeddings)."""
    from transformers import PretrainedConfig

    generic = {field.name for field in dataclasses.fields(PretrainedConfig)}
    return frozenset(f.name for f in dataclasses.fields(GTrXLConfig) if f.name not in generic) - {"vocab_size"}


MODULE_KEYS = frozenset({"body", "episode_clock", "max_seq_len"})


def check_model_config(model_config: dict) -> dict:
    """The module's settings from `model_config`: refuses, by name, a key the module would not read and a body it
    does not know. Returns {"body", "episode_clock", "max_seq_len", "fields"}."""
    known = MODULE_KEYS | gtrxl_fields()
    for key in model_config:
        if key in known or key in RLLIB_AUTO_KEYS:
            continue
        hint = RLLIB_DEFAULT_MODEL_KEYS.get(key)
        instead = f" (RLlib's default model reads it; here set {hint})" if hint else ""
        raise ValueError(
            f"model_config key {key!r} is not read by MemoryRLModule{instead}; it reads body, episode_clock, "
            "max_seq_len and GTrXLConfig's fields (hidden_size, num_hidden_layers, mem_len, gate_bias, ...)"
        )
    body = model_config.get("body")
    if body not in RLLIB_BODIES:
        raise ValueError(f"model_config body must be one of {', '.join(RLLIB_BODIES)}, got {body!r}")
    max_seq_len = model_config.get("max_seq_len", PPOSettings().segment_length)
    if not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool) or max_seq_len < 1:
        raise ValueError(f"model_config max_seq_len must be a positive int, got {max_seq_len!r}")
    fields = {key: value for key, value in model_config.items() if key not in MODULE_KEYS | RLLIB_AUTO_KEYS}
    return {
        "body": body,
        "episode_clock": model_config.get("episode_clock"),
        "max_seq_len": max_seq_len,
        "fields": fields,
    }


def check_rllib_spaces(observation_space, action_space):
    """Refuses, naming it, an action space the module cannot take through RLlib (the observation spaces are those
    `MemoryPolicy` takes, which `make_policy` checks): a Discrete or MultiDiscrete not counted from 0 (RLlib's
    categorical distributions sample codes from 0), and a Box: RLlib's env runners rescale a Box's actions from
    [-1, 1] to its bounds by default (`normalize_actions`), where MemoryPolicy's Gaussian is in the space's own units,
    so a policy trained through RLlib would act otherwise once saved."""
    import gymnasium as gym

    if isinstance(action_space, gym.spaces.Box):
        raise ValueError(
            f"action_space {action_space}: Box actions are not taken through RLlib (its env runners rescale them from "
            "[-1, 1] unless normalize_actions=False, while MemoryPolicy's Gaussian is in the space's units); train "
            "them with train_ppo"
        )
    if isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(action_space.start):
        raise ValueError(
            f"action_space {action_space} does not start at 0: RLlib's categorical distributions sample codes "
            "from 0; shift the actions with an ActionWrapper"
        )


def _rllib_action_distribution(action_space):
    import gymnasium as gym
    from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical, TorchMultiCategorical

    if isinstance(action_space, gym.spaces.Discrete):
        return TorchCategorical
    return TorchMultiCategorical.get_partial_dist_cls(space=action_space, input_lens=list(action_space.nvec))


# The memory as the module's state (RLlib's STATE_IN / STATE_OUT): the policy's snapshot, batch first. These two are
# the only places that read or write a policy's memory.
def _memory_to_state(policy, memory) -> dict[str, torch.Tensor]:
    return policy.snapshot(memory)


def _memory_from_state(policy, state: dict[str, torch.Tensor]):
    return policy.restore(dict(state))


def _build_policy(model_config: dict, observation_space, action_space):
    """`make_policy`'s policy for `model_config`, refusing by name what the module cannot take."""
    settings = check_model_config(model_config)
    check_rllib_spaces(observation_space, action_space)
    return make_policy(
        settings["body"], observation_space, action_space, episode_clock=settings["episode_clock"], **settings["fields"]
    )


class CarriedMemory:
    """The memory an acting call left, kept for the next call. RLlib passes a memory between calls as arrays: the
    STATE_OUT of a call becomes, per episode, the STATE_IN of the next (a new episode's: `get_initial_state()`).
    Rebuilding GTrXL's one-step memory from arrays on every step (its buffers, and the keys and values of every slot)
    costs more than the step, so a call whose STATE_IN rows are, by value, either the STATE_OUT rows of the last call
    or the initial state continues from the memory itself, with an episode start at the latter rows (what
    `train_ppo`'s acting does). Any other STATE_IN (other episodes, another batch size) is rebuilt from its arrays."""

    def __init__(self):
        self.memory, self.state_out = None, None

    def keep(self, memory, state_out: dict[str, torch.Tensor]):
        self.memory, self.state_out = memory, state_out

    def resume(self, state_in: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]):
        """(memory, episode starts `[rows]`) to act on from `state_in`, or None where it must be rebuilt."""
        if self.memory is None or set(state_in) != set(self.state_out):
            return None
        continuing = starting = None
        for name, value in state_in.items():
            last = self.state_out[name]
            if value.shape != last.shape or value.dtype != last.dtype:
                return None
            same = (value == last).reshape(len(value), -1).all(1)
            fresh = (value == initial[name].to(value.device)).reshape(len(value), -1).all(1)
            continuing = same if continuing is None else continuing & same
            starting = fresh if starting is None else starting & fresh
        if not bool((continuing | starting).all()):
            return None
        return self.memory, starting & ~continuing


class MemoryRLModule(TorchRLModule, ValueFunctionAPI):
    """An RLlib RLModule for PPO around a `MemoryPolicy` (`self.policy`), built from `model_config` (see
    `memory_module_spec`)."""

    def setup(self):
        self.policy = _build_policy(dict(self.model_config or {}), self.observation_space, self.action_space)
        # RLlib's Learner connector cuts the learning segments at model_config["max_seq_len"]
        self.model_config.setdefault("max_seq_len", PPOSettings().segment_length)
        self.action_dist_cls = _rllib_action_distribution(self.action_space)
        self.eval()  # (see `forward_exploration`); `forward_train` switches a Learner's module to training mode
        self.carried = CarriedMemory()
        self.initial_state_tensors = {name: torch.as_tensor(value) for name, value in self.get_initial_state().items()}

    # the memory -----------------------------------------------------------------------------------------------------
    def get_initial_state(self) -> dict[str, np.ndarray]:
        state = _memory_to_state(self.policy, self.policy.initial_state(1))
        return {name: value[0].cpu().numpy() for name, value in state.items()}

    # the passes -----------------------------------------------------------------------------------------------------
    # TorchRLModule's acting calls switch the module to eval mode and back on every call; a switch makes GTrXL drop
    # the folded weights of its one-step path (`txv_xl_step`), which it would then build again on every step. A module
    # already in eval mode (an env runner's: they start so) acts without switching.
    def forward_exploration(self, batch, **kwargs):
        if self.training:
            return super().forward_exploration(batch, **kwargs)
        return self._forward_exploration(batch, **kwargs)

    def forward_inference(self, batch, **kwargs):
        if self.training:
            return super().forward_inference(batch, **kwargs)
        return self._forward_inference(batch, **kwargs)

    def _run(self, batch):
        """The policy over `batch[OBS] [B, T, ...]` from `batch[STATE_IN]`, no episode starting inside (RLlib starts
        every episode from `get_initial_state`, and cuts its learning segments at episode ends)."""
        observations = batch[Columns.OBS]
        mask = batch.get(Columns.LOSS_MASK)
        if mask is not None:  # RLlib's zero padding: repeat a real observation there (zeros may lie outside the space)
            shape = mask.shape + (1,) * (observations.dim() - mask.dim())
            observations = torch.where(mask.reshape(shape), observations, observations[:, :1])
        memory = _memory_from_state(self.policy, batch[Columns.STATE_IN])
        starts = torch.zeros(observations.shape[:2], dtype=torch.bool, device=observations.device)
        return self.policy(observations, memory, starts)

    def _act(self, batch):
        """One step per row (`batch[OBS] [B, 1, ...]`), continuing the carried memory where STATE_IN is what it
        holds (`CarriedMemory`)."""
        resumed = self.carried.resume(batch[Columns.STATE_IN], self.initial_state_tensors)
        if resumed is None:
            return self._run(batch)
        memory, starting = resumed
        return self.policy(batch[Columns.OBS], memory, starting[:, None])

    def _forward(self, batch, **kwargs):
        out = self._act(batch)
        state_out = _memory_to_state(self.policy, out.state)
        self.carried.keep(out.state, state_out)
        return {Columns.ACTION_DIST_INPUTS: out.logits, Columns.STATE_OUT: state_out}

    def _forward_train(self, batch, **kwargs):
        out = self._run(batch)
        # the values, handed to `compute_values` as the "embeddings" RLlib passes it back
        return {Columns.ACTION_DIST_INPUTS: out.logits, Columns.EMBEDDINGS: out.values}

    def compute_values(self, batch, embeddings=None):
        if embeddings is not None:
            return embeddings
        return self._run(batch).values

    # sharing ------------------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory):
        """`MemoryPolicy.save_pretrained` of the module's policy: loads with `MemoryPolicy.from_pretrained`, runs with
        `python -m hf_txvariants.rl.evaluate`, shares with `push_to_hub`."""
        return self.policy.save_pretrained(save_directory)


def memory_module_spec(body: str, observation_space, action_space, **config) -> RLModuleSpec:
    """The `RLModuleSpec` of a `MemoryRLModule` for `PPOConfig().rl_module(rl_module_spec=...)`.

    body: "gtrxl" (GRU-gated GTrXL, `make_policy`'s), "trxl_i" (identity map reordering, no gates) or "gru" (the GRU
    of the same parameter count). config: `make_policy`'s GTrXL fields (hidden_size, num_hidden_layers,
    num_attention_heads, intermediate_size, mem_len, gate_bias, ...; the GRU is matched to the GTrXL they describe),
    `episode_clock`, and `max_seq_len` (the learning segments, `PPOSettings.segment_length`'s counterpart; default
    its default). A key the module would not read, or a space it cannot take, is refused here by name."""
    model_config = {"body": body, "max_seq_len": PPOSettings().segment_length, **config}
    _build_policy(model_config, observation_space, action_space)  # refuses here what the module would refuse
    return RLModuleSpec(
        module_class=MemoryRLModule,
        observation_space=observation_space,
        action_space=action_space,
        model_config=model_config,
    )


# where `EpisodeReturns` logs: `result["env_runners"][EPISODE_RETURNS]`
EPISODE_RETURNS = "txv_episode_returns"


class EpisodeReturns(RLlibCallback):
    """Logs the return of every episode that ends, whole (RLlib hands an episode cut by its sample calls over in
    chunks), so that `result["env_runners"][EPISODE_RETURNS]` lists those of the iteration, from every env runner:
    what POPGym's MMER (`TrainingHistory.mmer`) is computed from. `PPOConfig().callbacks(EpisodeReturns)`."""

    def on_episode_end(self, *, episode, prev_episode_chunks=None, metrics_logger=None, **kwargs):
        episode_return = episode.get_return() + sum(chunk.get_return() for chunk in prev_episode_chunks or ())
        metrics_logger.log_value(EPISODE_RETURNS, float(episode_return), reduce="item_series")


def ppo_training_settings(settings: PPOSettings, num_envs: int) -> dict:
    """`PPOConfig.training(**...)` arguments for the PPO of `settings` (`train_ppo`'s) with `num_envs` environments
    in all: the same batch (`rollout_steps x num_envs` steps), epochs, minibatches, learning rate and entropy
    (annealed when `settings` anneals them), discount, GAE lambda, clip, value weight (unclipped value loss, as
    `train_ppo`), gradient norm, and no KL penalty. The learning segments are the module's `max_seq_len`."""
    settings.check(num_envs)
    if settings.target_kl is not None:
        raise ValueError(
            f"PPOSettings.target_kl ({settings.target_kl}) has no counterpart in RLlib's PPO (its KL term is a "
            "penalty, not a stop); leave it None"
        )
    batch = settings.rollout_steps * num_envs

    def schedule(start, final):
        return start if final is None else [[0, start], [settings.total_steps, final]]

    return {
        "train_batch_size_per_learner": batch,
        "minibatch_size": batch // settings.minibatches,
        "num_epochs": settings.epochs,
        "lr": schedule(settings.learning_rate, settings.final_learning_rate),
        "gamma": settings.gamma,
        "lambda_": settings.gae_lambda,
        "clip_param": settings.clip,
        "vf_loss_coeff": settings.value_coef,
        "vf_clip_param": float("inf"),
        "entropy_coeff": schedule(settings.entropy_coef, settings.final_entropy_coef),
        "grad_clip": settings.max_grad_norm,
        "grad_clip_by": "global_norm",
        "use_kl_loss": False,
    }


__all__ = [
    "EPISODE_RETURNS",
    "RLLIB_BODIES",
    "CarriedMemory",
    "EpisodeReturns",
    "MemoryRLModule",
    "check_model_config",
    "check_rllib_spaces",
    "memory_module_spec",
    "ppo_training_settings",
]
