"""What the memory agents can learn of POPGym's AutoencodeEasy when every answer is given as a label (cross-entropy, no
RL), with and without an episode clock (`EpisodeClock`): is PPO's failure there the signal or the architecture?
(issue 30)

AutoencodeEasy shows 52 cards (their suits), then asks for them back in reverse: answer t (from 0) is the suit shown 2t
steps before. Episodes are played with random actions (the previous action is in the observation, as in the
benchmark); the policy's logits at the 52 answer steps learn the right suits by cross-entropy, 16 episodes per Adam
step (learning rate 5e-4, as PPO's), the agents of `bench_memory_rl_hard.py` (`make_policy`, mem_len 112). The score
printed is what those answers would earn in the game, 2 x accuracy - 1 (chance: -0.5), on the last batch of training
episodes, each of which the policy had not seen before it scored them.

    python benchmarks/bench_autoencode_labels.py --agents gtrxl gru --clock both --updates 600
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

EPISODE_STEPS = 103  # 52 cards shown (the last one is also the first answer's step), then 51 more answers
ANSWERS = 52
# the observation: the phase (2, one-hot), the suit (4), the previous action (4), the first-step flag (2)
SUIT_COLUMNS = slice(2, 6)


def labelled_episodes(envs, rng, num_envs):
    """Observations `[envs, 103, features]` of fresh episodes under random actions, and the answers `[envs, 52]`."""
    observations, _ = envs.reset(seed=int(rng.integers(1 << 30)))
    sequence = [observations]
    for _ in range(EPISODE_STEPS - 1):
        observations, _, _, _, _ = envs.step(rng.integers(0, 4, num_envs))
        sequence.append(observations)
    sequence = np.stack(sequence, 1)
    suits = sequence[:, :ANSWERS, SUIT_COLUMNS].argmax(-1)
    return torch.as_tensor(sequence), torch.as_tensor(suits[:, ::-1].copy())  # answer t: the suit shown 2t steps back


def train(agent: str, clock: bool, updates: int, seed: int, num_envs: int = 16, log_every: int = 100) -> float:
    from hf_txvariants.rl import make_policy, make_vector_env

    envs = make_vector_env("AutoencodeEasy", num_envs, seed=seed, previous_action=True)
    torch.manual_seed(seed)
    spaces = envs.single_observation_space, envs.single_action_space
    policy = make_policy(agent, *spaces, episode_clock=clock, mem_len=112)
    optimizer = torch.optim.Adam(policy.parameters(), lr=5e-4)
    rng = np.random.default_rng(seed)
    starts = torch.zeros(num_envs, EPISODE_STEPS, dtype=torch.bool)
    starts[:, 0] = True
    started = time.perf_counter()
    for update in range(1, updates + 1):
        observations, answers = labelled_episodes(envs, rng, num_envs)
        logits = policy(observations, policy.initial_state(num_envs), starts).logits[:, EPISODE_STEPS - ANSWERS :]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 4), answers.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        score = 2 * (logits.argmax(-1) == answers).float().mean().item() - 1  # scored before this batch's step
        if update % log_every == 0 or update == updates:
            print(
                f"  {agent}{' +clock' if clock else ''} seed {seed}: update {update} "
                f"({update * num_envs * EPISODE_STEPS / 1e6:.2f}M steps of episodes), loss {loss.item():.3f}, "
                f"score {score:.3f}, {time.perf_counter() - started:.0f} s",
                flush=True,
            )
    envs.close()
    return score


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", nargs="+", default=["gtrxl", "trxl_i", "gru"], choices=["gtrxl", "trxl_i", "gru"])
    parser.add_argument("--clock", choices=["on", "off", "both"], default="both")
    parser.add_argument("--updates", type=int, default=600, help="Adam steps of 16 episodes (600: ~1M steps)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, one thread")
    clocks = {"on": [True], "off": [False], "both": [False, True]}[args.clock]
    rows = []
    for agent in args.agents:
        for clock in clocks:
            for seed in args.seeds:
                rows.append((agent, clock, seed, train(agent, clock, args.updates, seed)))
    print("\n| agent | episode clock | seed | score after the last update (chance -0.5) |\n|---|---|---|---|")
    for agent, clock, seed, score in rows:
        print(f"| {agent} | {'yes' if clock else 'no'} | {seed} | {score:.3f} |")


if __name__ == "__main__":
    main()
