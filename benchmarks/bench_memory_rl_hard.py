"""GTrXL on POPGym's hard memory tasks, where POPGym's recurrent models fail (issue 30): RepeatPrevious Medium / Hard,
Autoencode Easy / Medium, CountRecall Easy / Medium, against TrXL-I (GTrXL without gates), a GRU of GTrXL's parameter
count and a GRU of POPGym's memory width (256), at equal environment steps per task, PPO from scratch
(`hf_txvariants.rl.train_ppo`), with POPGym's `PreviousAction` wrapper as POPGym's baselines use it (it does not give
these tasks away: `tests/test_rl_hard_tasks.py`).

Per-task settings (`TASKS`): the memory must reach the step that holds the answer, and every segment of truncated
back-propagation must hold the cue and the answer for the GRU to learn the dependency (the transformers attend to a
memory without gradient, so for them the segment is a cost, not a reach):
- RepeatPreviousMedium: the answer was shown 31 steps before: mem_len 32, segments of 64 (400k steps: the budget the
  issue's TrXL-I solves it in).
- RepeatPreviousHard: 63 steps before: mem_len 64, segments of 128.
- AutoencodeEasy / Medium: the first card seen is recalled last, 103 / 207 steps later: mem_len 112 / 208, segments 128.
- CountRecallEasy / Medium: a count over the whole episode (51 / 103 steps): mem_len 64 / 112, segments 64 / 128.
  CountRecall Easy and Medium learn with a discount factor of 0 (`gamma`, 0.99 elsewhere). In these card tasks an
  action's reward is the whole of its consequence: the next cards do not depend on it, so the later rewards in a
  return are other actions' and only add noise to each advantage. (The answer shown back by `PreviousAction` is
  information, not a cause of later rewards.) With 0.99, GTrXL stood at -0.28 after 655k steps of CountRecallEasy;
  with 0, at 0.33. On CountRecallMedium (seed 0) it ended at -0.16 with 0, against -0.80 with 0.99.
  Autoencode Easy and Medium learn with 0 too, for the same reason (GTrXL with the episode clock below learned
  AutoencodeEasy at 0; a probe with the same clock given by the environment left it at chance at 0.99).
  Runs at another discount factor are kept and reported apart ("earlier"), as those at another mem_len are.
- Agents "+clock" add the step within the episode to the observations' encoding (`EpisodeClock`, its default periods
  4 to 512). Autoencode's answer t (from 0) is the card shown 2t steps before: a distance that relative positions
  alone cannot pick out without the step count. CountRecall's answer is a count, for which an average over the
  attended slots needs the number of steps. With every answer given as a label (`bench_autoencode_labels.py`:
  cross-entropy, ~1M steps of episodes, one seed) AutoencodeEasy scored -0.34 (GTrXL), -0.30 (TrXL-I) and -0.26 (GRU)
  without the clock; with it 1.00, 1.00 and -0.19. The GRU agents "+clock" get the same clock, their width matched to
  the clocked GTrXL's parameters.
The first runs of RepeatPreviousMedium / Hard used mem_len 64 / 96; they are kept and reported apart ("earlier"): a
window longer than the lag only adds slots that dilute the attention at initialisation, and at mem_len 64 every
transformer solved RepeatPreviousHard on every seed, against 1 to 3 of 3 at 96.
No learning-rate or entropy annealing unless `--anneal` (to 0, linearly; its runs go to another `--output`).

Each finished run is stored at once (`--output`, rewritten atomically) and skipped when the benchmark is started again,
so it can span sessions and run in the background:

    nohup nice -n 10 python benchmarks/bench_memory_rl_hard.py --tasks RepeatPreviousMedium --seeds 0 1 2 &
    python benchmarks/bench_memory_rl_hard.py --report      # the RESULTS table and the PNG from the stored runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_memory_rl import plot_curves, steps_to_reach, write_json_atomically  # noqa: E402

NUM_ENVS = 16
ROLLOUT_STEPS = 128
# gtrxl: GTrXL at the paper's b_g = 2; gtrxl_bg0: b_g = 0 (gates half open at init, `make_policy`'s default now).
# "+clock": the same agent with an episode clock (`make_policy(..., episode_clock=True)`; the GRU's width matched to
# the clocked GTrXL's parameters).
CLOCK = "+clock"
AGENTS = [
    "gtrxl",
    "gtrxl_bg0",
    "trxl_i",
    "gru",
    "gru256",
    "gtrxl_bg0" + CLOCK,
    "trxl_i" + CLOCK,
    "gru" + CLOCK,
]
TASKS = {
    "RepeatPreviousMedium": dict(total_steps=400_000, mem_len=32, segment_length=64),
    "RepeatPreviousHard": dict(total_steps=1_000_000, mem_len=64, segment_length=128),
    "AutoencodeEasy": dict(total_steps=1_000_000, mem_len=112, segment_length=128, gamma=0.0),
    "AutoencodeMedium": dict(total_steps=1_000_000, mem_len=208, segment_length=128, gamma=0.0),
    "CountRecallEasy": dict(total_steps=1_000_000, mem_len=64, segment_length=64, gamma=0.0),
    "CountRecallMedium": dict(total_steps=1_000_000, mem_len=112, segment_length=128, gamma=0.0),
}
# POPGym's published MMER (Morad et al., ICLR 2023, appendix table; RLlib PPO, 15M steps, 3 trials) as transcribed in
# issue 30, NOT checked against the paper here: (GRU, best of the 13 models and which).
POPGYM_PUBLISHED = {
    "RepeatPreviousMedium": (-0.315, 0.789, "LMU"),
    "RepeatPreviousHard": (-0.428, 0.191, "LMU"),
    "AutoencodeEasy": (-0.283, -0.283, "GRU"),
    "CountRecallEasy": (None, 0.509, "LSTM"),
}


def build_policy(agent: str, envs, mem_len: int):
    from hf_txvariants.rl import MemoryPolicy, make_policy

    spaces = envs.single_observation_space, envs.single_action_space
    if agent == "gru256":  # POPGym's memory width
        return MemoryPolicy.gru(*spaces, 256)
    clock = agent.endswith(CLOCK)
    agent = agent.removesuffix(CLOCK)
    if agent in ("gtrxl", "gtrxl_bg0"):  # the paper's b_g and 0 (make_policy's default since these runs)
        gate_bias = 0.0 if agent == "gtrxl_bg0" else 2.0
        return make_policy("gtrxl", *spaces, episode_clock=clock, mem_len=mem_len, gate_bias=gate_bias)
    return make_policy(agent, *spaces, episode_clock=clock, mem_len=mem_len)


FROZEN_EPISODES = 64  # episodes of the final policy, frozen, greedy and sampled


# the GRU bodies have no memory window: mem_len is unused
TRANSFORMER_AGENTS = ("gtrxl", "gtrxl_bg0", "trxl_i", "gtrxl_bg0" + CLOCK, "trxl_i" + CLOCK)
DEFAULT_GAMMA = 0.99  # PPOSettings' discount factor, for the tasks whose `TASKS` entry names none


def task_gamma(task: str) -> float:
    return TASKS[task].get("gamma", DEFAULT_GAMMA)


def run_setting(run: dict) -> tuple:
    """What makes two stored runs the same run: the GRU's ignore mem_len, so changing it keeps their runs."""
    mem_len = run["mem_len"] if run["agent"] in TRANSFORMER_AGENTS else None
    return (run["task"], run["agent"], run["seed"], run["previous_action"], mem_len, run["settings"]["gamma"])


def is_current_setting(task: str, mem_len: int | None, gamma: float) -> bool:
    """Whether a run setting (`run_setting`'s mem_len, None for a GRU, and discount factor) is today's in `TASKS`."""
    return gamma == task_gamma(task) and mem_len in (None, TASKS[task]["mem_len"])


def is_current(run: dict) -> bool:
    """Whether a stored run used today's `TASKS` settings (earlier settings are kept and reported apart)."""
    task, _, _, _, mem_len, gamma = run_setting(run)
    return is_current_setting(task, mem_len, gamma)


def run_one(task: str, agent: str, seed: int, previous_action: bool, anneal: bool = False, log_every: int = 40) -> dict:
    import torch

    torch.set_num_threads(1)
    from hf_txvariants.rl import PPOSettings, make_vector_env, train_ppo

    setting = TASKS[task]
    envs = make_vector_env(task, NUM_ENVS, seed=seed, previous_action=previous_action)
    torch.manual_seed(seed)
    policy = build_policy(agent, envs, setting["mem_len"])
    annealing = dict(final_learning_rate=0.0, final_entropy_coef=0.0) if anneal else {}  # linear, to 0 at the end
    ppo = PPOSettings(
        total_steps=setting["total_steps"],
        rollout_steps=ROLLOUT_STEPS,
        segment_length=setting["segment_length"],
        gamma=task_gamma(task),
        **annealing,
    )

    def log(history):
        if len(history.steps) % log_every == 0:
            score = history.mean_returns[-1]
            print(
                f"  {task} {agent} seed {seed}: {history.steps[-1]:,} steps, mean return "
                f"{'-' if score is None else f'{score:.3f}'}, {history.seconds:.0f} s",
                flush=True,
            )

    history = train_ppo(policy, envs, ppo, seed=seed, log=log)
    envs.close()
    # the final policy frozen (what a user saves and runs), on fresh envs of another seed
    from hf_txvariants.rl.evaluate import evaluate_policy

    frozen = {}
    for name, greedy in (("frozen_greedy", True), ("frozen_sampled", False)):
        eval_envs = make_vector_env(task, NUM_ENVS, seed=10_000 + seed, previous_action=previous_action)
        returns = evaluate_policy(policy, eval_envs, FROZEN_EPISODES, deterministic=greedy, seed=10_000 + seed)
        eval_envs.close()
        frozen[name] = float(np.mean(returns))
    return {
        "task": task,
        "agent": agent,
        "seed": seed,
        "previous_action": previous_action,
        "mem_len": setting["mem_len"],
        "parameters": policy.num_parameters,
        **frozen,
        **history.to_dict(),
    }


def results_table(runs: list[dict], level: float = 0.9) -> str:
    lines = [
        "| task | agent | mem_len | parameters | seeds | MMER mean ± std | MMER per seed | steps to 0.0 per seed | "
        f"steps to {level} per seed | final policy frozen, greedy / sampled, per seed | steps/s | "
        "POPGym GRU / best of 13 (published, 15M steps) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def group(run):  # task, agent, the mem_len of a transformer run (None for the GRU) and the discount factor
        task, agent, _, _, mem_len, gamma = run_setting(run)
        return task, agent, mem_len, gamma

    def order(key):  # by task, then today's settings first, then by agent
        task, agent, mem_len, gamma = key
        current = is_current_setting(task, mem_len, gamma)
        return list(TASKS).index(task), not current, AGENTS.index(agent), -gamma, mem_len or 0

    for task, agent, mem_len, gamma in sorted({group(r) for r in runs}, key=order):
        rows = sorted((r for r in runs if group(r) == (task, agent, mem_len, gamma)), key=lambda r: r["seed"])
        discount = "" if gamma == DEFAULT_GAMMA else f", gamma {gamma:g}"
        mmer = np.array([r["mmer"] for r in rows])
        reached, onset = (
            " / ".join("never" if (n := steps_to_reach(r, at)) is None else f"{n / 1000:.0f}k" for r in rows)
            for at in (level, 0.0)
        )
        gru, best, which = POPGYM_PUBLISHED.get(task, (None, None, None))
        published = "" if best is None else f"{'?' if gru is None else f'{gru:.3f}'} / {best:.3f} ({which})"
        frozen = " ; ".join(
            f"{r['frozen_greedy']:.2f} / {r['frozen_sampled']:.2f}" if "frozen_greedy" in r else "not run" for r in rows
        )
        lines.append(
            f"| {task} ({rows[0]['settings']['total_steps'] // 1000}k steps{discount}) "
            f"| {agent} | "
            f"{'-' if mem_len is None else mem_len}{'' if is_current(rows[0]) else ' (earlier)'} | "
            f"{rows[0]['parameters']:,} | {', '.join(str(r['seed']) for r in rows)} | "
            f"{mmer.mean():.3f} ± {mmer.std():.3f} | {' / '.join(f'{m:.2f}' for m in mmer)} | "
            f"{onset} | {reached} | {frozen} | "
            f"{np.mean([r['steps_per_second'] for r in rows]):,.0f} | {published} |"
        )
    seconds = sum(r["seconds"] for r in runs)
    lines.append(
        f"\n{len(runs)} runs, {sum(r['steps'][-1] for r in runs):,} environment steps, "
        f"{seconds / 3600:.2f} CPU-hours (one thread each)."
    )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--agents", nargs="+", default=AGENTS, choices=AGENTS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--no-previous-action",
        action="store_true",
        help="hide the previous action (POPGym's baselines show it; the default here too)",
    )
    parser.add_argument(
        "--anneal",
        action="store_true",
        help="anneal the learning rate and the entropy coefficient linearly to 0 (runs stored in another --output)",
    )
    parser.add_argument("--output", type=Path, default=HERE / "memory_rl_hard_runs.json")
    parser.add_argument("--plot", type=Path, default=HERE / "memory_rl_hard_curves.png")
    parser.add_argument("--report", action="store_true", help="run nothing: the table and the PNG from --output")
    args = parser.parse_args(argv)
    if args.anneal and args.output == parser.get_default("output"):
        parser.error("--anneal needs its own --output: the stored runs are keyed without the annealing")
    stored = json.loads(args.output.read_text()) if args.output.exists() else {"runs": []}
    runs = stored["runs"]
    if args.report:
        tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
        agents = [a for a in AGENTS if any(r["agent"] == a for r in runs)]
        plot_curves([r for r in runs if is_current(r)], tasks, agents, args.plot)
        print(results_table(runs))
        return
    previous_action = not args.no_previous_action
    meta = {
        "num_envs": NUM_ENVS,
        "rollout_steps": ROLLOUT_STEPS,
        "tasks": TASKS,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    }
    # one run at a time, in the order asked: task, then agent, then seed
    for task in args.tasks:
        for agent in args.agents:
            for seed in args.seeds:
                planned = {"task": task, "agent": agent, "seed": seed, "previous_action": previous_action}
                key = run_setting(
                    {**planned, "mem_len": TASKS[task]["mem_len"], "settings": {"gamma": task_gamma(task)}}
                )
                if any(run_setting(r) == key for r in runs):
                    continue
                started = time.perf_counter()
                run = run_one(task, agent, seed, previous_action, anneal=args.anneal)
                runs.append(run)
                write_json_atomically(args.output, {"meta": meta, "runs": runs})
                print(
                    f"[{time.strftime('%H:%M:%S')}] {task} {agent} seed {seed}: MMER {run['mmer']:.3f}, "
                    f"{run['steps_per_second']:.0f} steps/s, {time.perf_counter() - started:.0f} s (stored)",
                    flush=True,
                )
    print(results_table(runs))


if __name__ == "__main__":
    main()
