"""How fast `txv` answers --help, --version and a bad command (issue 24 item 5).

The peer, measured in the same run: the full command line `python -m hf_txvariants.cli` (what the `txv` script ran
before the launcher: it imports torch, transformers and every model to build all parsers). Each case runs as a fresh
process, interleaved, `--repeats` times; the median wall time is printed with the load average (the CPU is shared).

    python benchmarks/bench_cli_startup.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASES = {"--help": ["--help"], "--version": ["--version"], "a bad command": ["bogus"]}
PROGRAMS = {
    "txv (launcher)": [sys.executable, "-m", "hf_txvariants_launcher"],
    "full CLI (before)": [sys.executable, "-m", "hf_txvariants.cli"],
}


def wall_time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    times = {(case, program): [] for case in CASES for program in PROGRAMS}
    for _ in range(args.repeats):
        for case, argv in CASES.items():
            for program, command in PROGRAMS.items():
                times[case, program].append(wall_time(command + argv))
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load_before:.1f} before / "
        f"{os.getloadavg()[0]:.1f} after, median of {args.repeats} fresh processes"
    )
    print(f"{'case':<15}" + "".join(f"{program:>20}" for program in PROGRAMS) + f"{'ratio':>8}")
    for case in CASES:
        medians = [statistics.median(times[case, program]) for program in PROGRAMS]
        print(f"{case:<15}" + "".join(f"{m:>19.2f}s" for m in medians) + f"{medians[1] / medians[0]:>7.1f}x")


if __name__ == "__main__":
    main()
