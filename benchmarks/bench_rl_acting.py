"""Acting speed of the memory-RL policies (issue 30 item 3): `MemoryPolicy.act` calls/s of the benchmark's GTrXL
(GRU gate, 2 layers x 64, mem_len 64: `make_policy("gtrxl", ...)` of bench_memory_rl.py) against the parameter-matched
GRU policy, and the whole PPO loop (`train_ppo`: acting, environment, learning) steps/s of both on one POPGym task.

One process, one thread, 16 environments. Both policies are built once; the timed blocks alternate (GTrXL, GRU,
GRU, GTrXL, ...) so that both see the same load of a shared machine. Per block: act calls/s from the wall clock and
from the process CPU time (with one thread the CPU time depends less on other jobs); the ratios compare the best
block of each policy, and the median. Acting feeds each step the observation of a real environment step and the
episode starts the environment returned (RepeatPreviousEasy: episodes of 52 steps).

    python benchmarks/bench_rl_acting.py                      # about 2 minutes
    python benchmarks/bench_rl_acting.py --rounds 5 --ppo-updates 2 --task RepeatPreviousEasy
    python benchmarks/bench_rl_acting.py --no-ppo             # acting only
    python benchmarks/bench_rl_acting.py --task RepeatPreviousHard --mem-len 64 --segment-length 128

`--mem-len` (GTrXL's memory, default 64) and `--segment-length` (the learning segments of both policies, default 64)
measure the settings of a hard task of bench_memory_rl_hard.py: the GRU steps through a segment one time step at a
time, GTrXL takes it in one pass, so the PPO loop's ratio depends on the segment length. `--hoisted-gru` adds a
stronger GRU peer (`gru@hoisted`): the same GRU with a segment's input products out of its time loop.

`--before-package NAME` adds the GTrXL of an older checkout, measured in the same process, interleaved, with the same
weights: a copy of its `hf_txvariants` folder renamed NAME on the path (its imports are relative), e.g.
`git archive <rev> hf_txvariants | tar -x -C /tmp/old && mv /tmp/old/hf_txvariants /tmp/pkgs/hf_before`, then
`PYTHONPATH=/tmp/pkgs python benchmarks/bench_rl_acting.py --before-package hf_before`.

It also counts the floating-point operations of both policies (`torch.utils.flop_counter`: the matrix products, which
are nearly all of them): one act call, and one whole PPO update (acting, learning, the optimiser), with the PPO loop's
ratio that GTrXL would reach if it ran its operations at the GRU's rate.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

NUM_ENVS = 16


def timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of `fn()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def acting_block(policy, envs, steps: int, seed: int):
    """A closure that acts `steps` steps in `envs` (the environment stepped too, outside the timing of `act`), and
    returns the seconds spent inside `act` only: (wall, cpu)."""
    import numpy as np
    import torch

    observations, _ = envs.reset(seed=seed)
    state = policy.initial_state(envs.num_envs)
    starts = torch.ones(envs.num_envs, dtype=torch.bool)
    carried = {"observations": observations, "state": state, "starts": starts}

    def run() -> tuple[float, float]:
        wall = cpu = 0.0
        for _ in range(steps):
            w, c = time.perf_counter(), time.process_time()
            step = policy.act(carried["observations"], carried["state"], carried["starts"])
            wall += time.perf_counter() - w
            cpu += time.process_time() - c
            observations, _, terminated, truncated, _ = envs.step(policy.env_actions(step.actions))
            carried.update(
                observations=observations,
                state=step.state,
                starts=torch.as_tensor(np.logical_or(terminated, truncated)),
            )
        return wall, cpu

    return run


def hoisted_gru_forward(body, inputs, state, episode_starts):
    """`GRUBody.forward` with the input products of a whole segment taken out of the time loop (one product for all
    steps, as `nn.GRU` does inside): the same GRU maths, a stronger peer for the PPO loop's learning segments."""
    import torch
    from torch.nn import functional as F

    if inputs.shape[1] == 1:  # acting: the plain body's step
        return type(body).forward(body, inputs, state, episode_starts)
    gru = body.cell
    input_gates = F.linear(inputs, gru.weight_ih, gru.bias_ih)  # [envs, steps, 3 hidden]: r, z, n
    keep = (~episode_starts).to(state.dtype)
    outputs = []
    for t in range(inputs.shape[1]):
        state = state * keep[:, t, None]
        input_r, input_z, input_n = input_gates[:, t].chunk(3, dim=1)
        hidden_r, hidden_z, hidden_n = F.linear(state, gru.weight_hh, gru.bias_hh).chunk(3, dim=1)
        reset = torch.sigmoid(input_r + hidden_r)
        update = torch.sigmoid(input_z + hidden_z)
        candidate = torch.tanh(input_n + reset * hidden_n)
        state = candidate + update * (state - candidate)  # (1 - z) n + z h
        outputs.append(state)
    return torch.stack(outputs, dim=1), state


def make_hoisted_gru(agent, observation_space, action_space, **fields):
    """`make_policy("gru", ...)` whose body learns through `hoisted_gru_forward`; checked against the plain body."""
    import functools

    import torch

    from hf_txvariants.rl import make_policy

    policy = make_policy(agent, observation_space, action_space, **fields)
    body = policy.body
    inputs = torch.randn(3, 9, body.hidden_size)
    starts = torch.rand(3, 9) < 0.2
    state = torch.randn(3, body.hidden_size)
    with torch.no_grad():
        expected = body(inputs, state, starts)[0]
        body.forward = functools.partial(hoisted_gru_forward, body)
        got = body(inputs, state, starts)[0]
    # float32 products summed in another order: equal within rounding
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    return policy


def ratio_pairs(agents) -> list[tuple[str, str]]:
    """(agent, peer) of each ratio printed: every GTrXL against every GRU, the hoisted GRU against the plain one."""
    peers = [agent for agent in agents if agent.split("@")[0] == "gru"]
    return [(agent, peer) for peer in peers for agent in agents if agent not in (peer, "gru")]


def flops(fn) -> int:
    """The floating-point operations `fn()` runs (matrix products; `torch.utils.flop_counter`)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def count_flops(agents, policies, envs, makers, settings_for_one_update, make):
    """Prints the FLOPs of one act call (16 envs) and of one PPO update of 2,048 steps per policy, and GTrXL / GRU
    (`make(maker, agent, observation_space, action_space)` builds a fresh policy as the run does)."""
    import torch

    from hf_txvariants.rl import train_ppo

    counted = {}
    for agent in agents:
        policy, env = policies[agent], envs[agent]
        observations, _ = env.reset(seed=0)
        state = policy.initial_state(NUM_ENVS)
        starts = torch.ones(NUM_ENVS, dtype=torch.bool)
        for _ in range(3):  # past the first step's set-up
            state, starts = policy.act(observations, state, starts).state, torch.zeros(NUM_ENVS, dtype=torch.bool)
        act = flops(lambda: policy.act(observations, state, starts))
        torch.manual_seed(0)
        fresh = make(makers[agent], agent.split("@")[0], env.single_observation_space, env.single_action_space)
        update = flops(lambda: train_ppo(fresh, env, settings_for_one_update, seed=0))
        counted[agent] = (act, update)
    print("\nFLOPs (matrix products)           act call     PPO update (2,048 steps)")
    for agent in agents:
        act, update = counted[agent]
        print(f"  {agent:<30} {act / 1e6:8.2f} M {update / 1e9:12.2f} G")
    act, update = (counted["gtrxl"][i] / counted["gru"][i] for i in (0, 1))
    print(
        f"  gtrxl / gru: act {act:.2f}x, PPO update {update:.2f}x: at the GRU's FLOP rate GTrXL's PPO loop would run"
        f" at {1 / update:.2f}x the GRU's steps/s (a little more with the environment's time, the same for both)"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="RepeatPreviousEasy")
    parser.add_argument("--rounds", type=int, default=5, help="timed blocks per policy (alternating)")
    parser.add_argument("--steps", type=int, default=200, help="act calls per timed block")
    parser.add_argument("--ppo-updates", type=int, default=2, help="PPO updates per timed train_ppo call")
    parser.add_argument("--ppo-rounds", type=int, default=2, help="timed train_ppo calls per policy (alternating)")
    parser.add_argument("--no-ppo", action="store_true")
    parser.add_argument("--before-package", help="an older hf_txvariants copy, importable under this name")
    parser.add_argument(
        "--mem-len", type=int, help="GTrXL's memory (default: make_policy's, 64); the GRU's size does not depend on it"
    )
    parser.add_argument(
        "--segment-length",
        type=int,
        help="PPOSettings.segment_length of the timed train_ppo calls (default: PPOSettings', 64; 16 before)",
    )
    parser.add_argument(
        "--hoisted-gru",
        action="store_true",
        help="also the GRU with a segment's input products out of its time loop (gru@hoisted)",
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from hf_txvariants.rl import PPOSettings, make_policy, make_vector_env, train_ppo

    agents = ("gtrxl", "gru")
    envs = {agent: make_vector_env(args.task, NUM_ENVS, seed=0) for agent in agents}
    torch.manual_seed(0)
    sizes = {} if args.mem_len is None else {"mem_len": args.mem_len}

    def make(maker, agent, observation_space, action_space):
        """`agent`'s policy from `maker` (a `make_policy`), GTrXL with this run's memory length."""
        return maker(agent, observation_space, action_space, **(sizes if agent == "gtrxl" else {}))

    policies = {
        agent: make(make_policy, agent, envs[agent].single_observation_space, envs[agent].single_action_space).eval()
        for agent in agents
    }
    makers = {agent: make_policy for agent in agents}
    if args.before_package:
        import importlib

        before = "gtrxl@before"
        makers[before] = importlib.import_module(f"{args.before_package}.rl").make_policy
        envs[before] = make_vector_env(args.task, NUM_ENVS, seed=0)
        policies[before] = make(
            makers[before], "gtrxl", envs[before].single_observation_space, envs[before].single_action_space
        ).eval()
        policies[before].load_state_dict(policies["gtrxl"].state_dict())
        agents = ("gtrxl", before, "gru")
    if args.hoisted_gru:
        hoisted = "gru@hoisted"
        makers[hoisted] = make_hoisted_gru
        envs[hoisted] = make_vector_env(args.task, NUM_ENVS, seed=0)
        policies[hoisted] = make(
            makers[hoisted], "gru", envs[hoisted].single_observation_space, envs[hoisted].single_action_space
        ).eval()
        policies[hoisted].load_state_dict(policies["gru"].state_dict())
        agents = (*agents, hoisted)
    print(
        f"{args.task}, {NUM_ENVS} envs, 1 thread; parameters: "
        + ", ".join(f"{a} {policies[a].num_parameters:,}" for a in agents)
    )
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load {os.getloadavg()}")
    segments = {} if args.segment_length is None else {"segment_length": args.segment_length}
    print(
        f"GTrXL mem_len {policies['gtrxl'].body.mem_len}; train_ppo segment_length "
        f"{PPOSettings(**segments).segment_length}"
    )

    count_flops(agents, policies, envs, makers, PPOSettings(total_steps=128 * NUM_ENVS, **segments), make)
    blocks = {agent: acting_block(policies[agent], envs[agent], args.steps, seed=0) for agent in agents}
    for agent in agents:  # warm-up: one block each, untimed (fills the memory, first-call costs)
        blocks[agent]()
    calls = {agent: {"wall": [], "cpu": []} for agent in agents}
    for round_ in range(args.rounds):
        for agent in agents if round_ % 2 == 0 else reversed(agents):
            wall, cpu = blocks[agent]()
            calls[agent]["wall"].append(args.steps / wall)
            calls[agent]["cpu"].append(args.steps / cpu)
    print("\nact calls/s (16 envs per call)   best wall   median wall   best CPU   median CPU")
    for agent in agents:
        c = calls[agent]
        print(
            f"  {agent:<30} {max(c['wall']):9.1f} {statistics.median(c['wall']):13.1f} "
            f"{max(c['cpu']):10.1f} {statistics.median(c['cpu']):12.1f}"
        )
    for agent, peer in ratio_pairs(agents):
        g, r = calls[agent], calls[peer]
        print(
            f"  {agent} / {peer}: best wall {max(g['wall']) / max(r['wall']):.3f}x, median wall "
            f"{statistics.median(g['wall']) / statistics.median(r['wall']):.3f}x, best CPU "
            f"{max(g['cpu']) / max(r['cpu']):.3f}x, median CPU "
            f"{statistics.median(g['cpu']) / statistics.median(r['cpu']):.3f}x"
        )

    if args.no_ppo:
        return
    settings = PPOSettings(total_steps=args.ppo_updates * 128 * NUM_ENVS, **segments)
    rates = {agent: {"wall": [], "cpu": []} for agent in agents}
    for round_ in range(args.ppo_rounds):
        for agent in agents if round_ % 2 == 0 else reversed(agents):
            torch.manual_seed(round_)
            spaces = envs[agent].single_observation_space, envs[agent].single_action_space
            policy = make(makers[agent], agent.split("@")[0], *spaces)
            wall, cpu = timed(lambda: train_ppo(policy, envs[agent], settings, seed=round_))
            rates[agent]["wall"].append(settings.total_steps / wall)
            rates[agent]["cpu"].append(settings.total_steps / cpu)
    print(f"\ntrain_ppo steps/s ({settings.total_steps} env steps per call)   best wall   best CPU")
    for agent in agents:
        print(f"  {agent:<30} {max(rates[agent]['wall']):9.1f} {max(rates[agent]['cpu']):10.1f}")
    for agent, peer in ratio_pairs(agents):
        g, r = rates[agent], rates[peer]
        print(
            f"  {agent} / {peer}: best wall {max(g['wall']) / max(r['wall']):.3f}x, "
            f"best CPU {max(g['cpu']) / max(r['cpu']):.3f}x"
        )
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
