"""GTrXL as the memory of a PPO agent, against a memory-less baseline of the same size (Parisotto et al. 2019).

The task, `RememberCueEnv`, is a T-maze without the maze: the first observation shows a cue (left or right), then
`corridor_length` steps show nothing, and at the junction (flagged in the observation) the agent must pick the side
the cue showed: +1 if right, -1 if wrong. The decision comes more steps after the cue than one training segment holds
(`corridor_length >= segment_length`), so the agent can only succeed by reading the cue from its memory
(`cache`) across segments. A memory-less agent is at chance (50 %).

The agent is a `hf_txvariants.rl.MemoryPolicy` with a GTrXL body, trained by `hf_txvariants.rl.train_ppo` (the
project's one PPO): it acts one step at a time, carrying the GTrXL memory and marking episode starts (a per-row
reset); every `segment_length` steps it learns with PPO on the segment it just collected, re-run from the memory that
segment started with (the stored-memory scheme of the paper). The baseline is the very same network with
`mem_len=0`: every step attends only to itself.

    python examples/rl_gtrxl.py                      # 5 seeds of GTrXL and of the baseline, a few minutes on CPU
    python examples/rl_gtrxl.py --seeds 0 --iterations 150 --variants gtrxl trxl_i baseline
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import torch

from hf_txvariants.rl import MemoryPolicy, PPOSettings, train_ppo
from hf_txvariants.rl.evaluate import evaluate_policy


class RememberCueEnv(gym.Env):
    """Observation `[cue_left, cue_right, at_junction]`; actions 0 (left) / 1 (right), only the junction's counts.

    Step 0 shows the cue, steps 1..corridor_length-1 show zeros, step corridor_length is the junction; the episode
    ends there with reward +1 (the cue's side) or -1, and `info["success"]`."""

    metadata = {"render_modes": []}

    def __init__(self, corridor_length: int = 10):
        if corridor_length < 1:
            raise ValueError(f"corridor_length must be >= 1, got {corridor_length}")
        self.corridor_length = corridor_length
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.cue = 0
        self.time = 0

    def _observation(self) -> np.ndarray:
        observation = np.zeros(3, dtype=np.float32)
        if self.time == 0:
            observation[self.cue] = 1.0
        if self.time == self.corridor_length:
            observation[2] = 1.0
        return observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(2))
        self.time = 0
        return self._observation(), {}

    def step(self, action):
        if self.time < self.corridor_length:
            self.time += 1
            return self._observation(), 0.0, False, False, {}
        success = int(action) == self.cue
        return self._observation(), 1.0 if success else -1.0, True, False, {"success": success}


gym.register("RememberCue-v0", entry_point=RememberCueEnv)


@dataclass
class Settings:
    corridor_length: int = 10
    segment_length: int = 8
    mem_len: int = 16
    num_envs: int = 32
    iterations: int = 150
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    learning_rate: float = 1e-3
    epochs: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    max_grad_norm: float = 0.5
    eval_episodes: int = 256
    gate_bias: float = 2.0


# variant -> GTrXL config fields; "baseline" is GTrXL's own network with no memory (same parameters). Every gate of
# the paper is a variant (gtrxl = the GRU gate), and "gtrxl_span" composes the GRU gate with adaptive span.
VARIANTS = {
    "gtrxl": {"gate_type": "gru"},
    "trxl": {"gate_type": "trxl"},
    "trxl_i": {"gate_type": "trxl_i"},
    "input": {"gate_type": "input"},
    "output": {"gate_type": "output"},
    "highway": {"gate_type": "highway"},
    "sigmoid_tanh": {"gate_type": "sigmoid_tanh"},
    "gtrxl_span": {"gate_type": "gru", "adapt_span_enabled": True, "adapt_span_ramp": 4, "adapt_span_init": 1.0},
    "baseline": {"gate_type": "gru", "mem_len": 0},
}


def make_agent(variant: str, settings: Settings) -> MemoryPolicy:
    """A `MemoryPolicy` with the variant's GTrXL body (observations in as `inputs_embeds`, two actions)."""
    fields = dict(
        hidden_size=settings.hidden_size,
        num_attention_heads=settings.num_heads,
        intermediate_size=2 * settings.hidden_size,
        num_hidden_layers=settings.num_layers,
        mem_len=settings.mem_len,
        gate_bias=settings.gate_bias,
    )
    if VARIANTS[variant].get("adapt_span_enabled"):
        fields["attn_span"] = settings.mem_len + 1  # the largest span: every step the memory holds
    env = RememberCueEnv(settings.corridor_length)
    return MemoryPolicy.gtrxl(env.observation_space, env.action_space, **{**fields, **VARIANTS[variant]})


def make_envs(settings: Settings):
    """`num_envs` RememberCue envs that reset an ended episode within the step (what `train_ppo` expects)."""
    return gym.vector.SyncVectorEnv(
        [lambda: RememberCueEnv(settings.corridor_length) for _ in range(settings.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def ppo_settings(settings: Settings) -> PPOSettings:
    """One PPO update per segment: every env acts `segment_length` steps, then `epochs` full-batch steps on it."""
    return PPOSettings(
        total_steps=settings.iterations * settings.segment_length * settings.num_envs,
        rollout_steps=settings.segment_length,
        segment_length=settings.segment_length,
        epochs=settings.epochs,
        minibatches=1,
        learning_rate=settings.learning_rate,
        gamma=settings.gamma,
        gae_lambda=settings.gae_lambda,
        clip=settings.clip,
        value_coef=settings.value_coef,
        entropy_coef=settings.entropy_coef,
        max_grad_norm=settings.max_grad_norm,
        return_window=200,
    )


def evaluate(agent: MemoryPolicy, settings: Settings, seed: int) -> float:
    """Greedy success rate over `eval_episodes` fresh episodes (the reward is +1 on success, -1 otherwise)."""
    envs = make_envs(settings)
    returns = evaluate_policy(agent, envs, settings.eval_episodes, deterministic=True, seed=10_000 + seed * 1000)
    return float(np.mean(np.array(returns) > 0))


def train(variant: str, seed: int, settings: Settings, log_every: int = 0) -> dict:
    torch.manual_seed(seed)
    agent = make_agent(variant, settings)
    started = time.time()

    def log(history):
        if log_every and len(history.steps) % log_every == 0 and history.mean_returns[-1] is not None:
            print(
                f"  {variant} seed {seed} iteration {len(history.steps)}: training success (last 200 episodes) "
                f"{(history.mean_returns[-1] + 1) / 2:.2f}, {time.time() - started:.0f}s",
                flush=True,
            )

    history = train_ppo(agent, make_envs(settings), ppo_settings(settings), seed=seed * 1000, log=log)
    return {
        "variant": variant,
        "seed": seed,
        "success": evaluate(agent, settings, seed),
        "training_success_last_200": (history.final_mean_return + 1) / 2,  # nan until 200 episodes ended
        "parameters": agent.num_parameters,
        "seconds": round(time.time() - started, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=["gtrxl", "baseline"], choices=sorted(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    for field, value in asdict(Settings()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small models are fastest on one)")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--output", help="write every run's result to this JSON file")
    args = parser.parse_args(argv)
    settings = Settings(**{field: getattr(args, field) for field in asdict(Settings())})
    if settings.corridor_length < settings.segment_length:
        print("note: corridor_length < segment_length, the cue can be in the same segment as the decision")
    torch.set_num_threads(args.threads)
    results = []
    for variant in args.variants:
        for seed in args.seeds:
            result = train(variant, seed, settings, args.log_every)
            print(json.dumps(result), flush=True)
            results.append(result)
    print(
        f"\nRememberCue, decision {settings.corridor_length} steps after the cue, segments of "
        f"{settings.segment_length}, {settings.iterations} PPO iterations x {settings.num_envs} envs:"
    )
    print("| agent | parameters | greedy success per seed | mean |")
    print("|---|---|---|---|")
    for variant in args.variants:
        rows = [r for r in results if r["variant"] == variant]
        rates = " / ".join(f"{r['success']:.2f}" for r in rows)
        print(f"| {variant} | {rows[0]['parameters']} | {rates} | {np.mean([r['success'] for r in rows]):.2f} |")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"settings": asdict(settings), "results": results}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
