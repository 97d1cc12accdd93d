"""GTrXL as the memory of a TorchRL PPO agent: `hf_txvariants.rl.torchrl.MemoryModule` (TorchRL's recurrent-module
style: a tensordict in and out, `set_recurrent_mode` for learning on segments, a primer that adds the memory to the
env's specs) with TorchRL's `ParallelEnv`, `Collector` and `ClipPPOLoss`, at `train_ppo`'s PPO settings.

    pip install -e ".[torchrl]"
    python examples/rl_torchrl.py                                    # proof of memory, 50k frames, GTrXL
    python examples/rl_torchrl.py --task RepeatPreviousMedium --previous-action --mem-len 32 --total-steps 200000
    python examples/rl_torchrl.py --agent gru --save gru-pom          # MemoryPolicy's format

The loop (`train_clip_ppo`) is, in short:

    env = make_torchrl_env(task, num_envs=8, parallel=True)          # ParallelEnv of GymEnvs, with InitTracker
    module = MemoryModule.build("gtrxl", env, mem_len=32)            # make_policy's network
    env.append_transform(module.make_tensordict_primer())
    actor, critic = actor_critic(module, env)
    loss_module = ClipPPOLoss(actor, critic, ..., loss_critic_type="l2", normalize_advantage=True, functional=False)
    for data in Collector(env, actor, frames_per_batch=..., total_frames=...):
        memory_advantages(data, module, gamma, gae_lambda)            # train_ppo's GAE, values from acting
        module.train()
        with set_recurrent_mode(True):                               # each row: a segment from its stored memory
            for index in torch.randperm(len(rows := segments(data, 64))).chunk(minibatches):
                ... loss_module(rows[index]) ... backward, clip, step
        module.eval()

Prints the MMER (POPGym's: the best mean return of 100 consecutive training episodes) and the frames per second, then
the saved policy's greedy mean return (loaded back with `MemoryPolicy.from_pretrained`, run by
`hf_txvariants.rl.evaluate`).
"""

from __future__ import annotations

import argparse
import tempfile

import torch


def main(argv=None):
    from hf_txvariants.rl import MemoryPolicy, PPOSettings, make_vector_env
    from hf_txvariants.rl.evaluate import evaluate_policy
    from hf_txvariants.rl.torchrl import MemoryModule, make_torchrl_env, train_clip_ppo

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="txv/ProofOfMemory-v0")
    parser.add_argument("--previous-action", action="store_true", help="POPGym's previous-action observation")
    parser.add_argument("--agent", default="gtrxl", choices=["gtrxl", "trxl_i", "gru", "mlp"])
    parser.add_argument("--mem-len", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--serial", action="store_true", help="SerialEnv (one process) instead of ParallelEnv")
    parser.add_argument("--total-steps", type=int, default=50_000)
    parser.add_argument("--rollout-steps", type=int, default=128)
    parser.add_argument("--segment-length", type=int, default=64)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--return-window", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the benchmarks' setting: 1)")
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--save", help="a folder for the trained policy (MemoryPolicy's format)")
    parser.add_argument("--gtrxl-field", action="append", default=[], metavar="NAME=INT",
                        help="another GTrXL field, e.g. num_hidden_layers=1 (ints)")  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    fields = {"mem_len": args.mem_len, "hidden_size": args.hidden_size}
    for item in args.gtrxl_field:
        name, _, value = item.partition("=")
        fields[name] = int(value)
    settings = PPOSettings(
        total_steps=args.total_steps,
        rollout_steps=args.rollout_steps,
        segment_length=args.segment_length,
        minibatches=args.minibatches,
        epochs=args.epochs,
        return_window=args.return_window,
    )
    env = make_torchrl_env(args.task, args.num_envs, args.previous_action, parallel=not args.serial)
    torch.manual_seed(args.seed)
    module = MemoryModule.build(args.agent, env, **fields)
    env.append_transform(module.make_tensordict_primer())

    def log(history):
        if len(history.steps) % 10 == 0:
            mean = history.mean_returns[-1]
            print(f"{history.steps[-1]:>8} frames  mean return {'-' if mean is None else f'{mean:.3f}'}")

    history = train_clip_ppo(env, module, settings, seed=args.seed, log=log)  # (closes env)
    print(f"MMER {history.mmer:.3f}, {history.steps_per_second:.0f} frames/s, {history.episodes} episodes")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.save or tmp
        module.save_pretrained(folder)
        policy = MemoryPolicy.from_pretrained(folder)
        envs = make_vector_env(args.task, 8, seed=args.seed + 1, previous_action=args.previous_action)
        returns = evaluate_policy(policy, envs, episodes=args.eval_episodes, seed=args.seed + 1)
        print(f"saved policy (MemoryPolicy.from_pretrained), greedy: mean return {sum(returns) / len(returns):.3f}")
    return history


if __name__ == "__main__":
    main()
