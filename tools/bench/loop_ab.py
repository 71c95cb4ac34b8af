"""The loop benchmark's online producer under two checkouts, in one run: before and after a change.

``python tools/bench/loop_ab.py BEFORE_CHECKOUT [--rounds N]`` runs
``uplink_loop.py``'s worker (250 steps of work, 8 gsm8k episodes and one
metrics row per step, against one local platform) as ``none`` (the loop
alone), ``before`` (this SDK online, imported from BEFORE_CHECKOUT, e.g. a
``git worktree add ../before <commit>``) and ``after`` (the installed
``primeruns``: an editable install of this checkout), in rotating order,
and prints the medians over the rounds: loop slowdown vs ``none``,
per-step log p50 and p99, init→finish, the producer's and the uplink's CPU
and the local platform's CPU over the worker's run (Linux: ``/proc``; the
CPU figures hold on a loaded host, where the wall-clock ones are noise),
and the p99 of the log times less the time each spent waiting for a CPU
(``loop_worker``'s ``waits_s``: on a loaded host the slowest calls were
nearly all that wait, the same in both checkouts).
``--sdk threads`` measures the fallback that ships from threads in the
producer (``PRIME_RUNS_UPLINK=threads``: its shipping CPU is the
producer's) instead of the uplink process; ``--vendor`` adds ``prime-runs``
0.1.4 (``tools/bench/.venv-vendor``) to the rotation.

Every worker runs with the repository's parent as its working directory, so
neither checkout's uplink can import the other's package from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import benchlib
from uplink_loop import check_landed, run_worker

HERE = Path(__file__).resolve().parent
STEPS = 250


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used; NaN where
    ``/proc`` cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "before", type=benchlib.as_installed_arg, help="a checkout of the code before the change"
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--sdk", choices=("online", "threads"), default="online", help="how both checkouts ship"
    )
    parser.add_argument("--vendor", action="store_true", help="the vendor's SDK in the rotation")
    args = parser.parse_args(argv)
    before = args.before.resolve()
    if not (before / "primeruns" / "__init__.py").is_file():
        sys.exit(f"{before} is not a checkout of this repository (no primeruns/)")
    configs: tuple[str, ...] = ("none", "before", "after", *(("vendor",) if args.vendor else ()))
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    os.chdir(HERE.parents[2])
    lines = benchlib.raw_lines("gsm8k-eval")[:400]
    with benchlib.isolated_env(None) as scratch:
        episodes = scratch / "episodes.jsonl"
        episodes.write_bytes(b"\n".join(lines) + b"\n")
        with benchlib.local_platform(scratch / "platform") as server:
            for round_ in range(args.rounds):
                turn = round_ % len(configs)
                order = configs[turn:] + configs[:turn]
                outs = {}
                for config in order:
                    env = dict(os.environ, PRIME_TRACES_URL=server.url)
                    sdk = config if config in ("none", "vendor") else args.sdk
                    if config == "before":
                        env["PYTHONPATH"] = str(before)
                    runs = scratch / f"{config}-{round_}"
                    served = cpu_s(server.pid)
                    out = run_worker(sdk, episodes, server.url, runs, STEPS, env)
                    out["server_cpu_s"] = cpu_s(server.pid) - served
                    check_landed(server, sdk, out, STEPS)
                    outs[config] = out
                for config, out in outs.items():
                    p50, p99 = benchlib.pcts(out["logs_s"])
                    own = benchlib.own_times(out)
                    rows[config].append(
                        {
                            "slowdown": out["loop_s"] / outs["none"]["loop_s"] - 1.0,
                            "p50": p50 * 1000,
                            "p99": p99 * 1000,
                            "p99_own": benchlib.pcts(own)[1] * 1000,
                            "finish": out["init_to_finish_s"],
                            "producer": out["cpu_s"],
                            "uplink": out["child_cpu_s"],
                            "server": out["server_cpu_s"],
                        }
                    )
    print(f"machine: {benchlib.machine()}; medians of {args.rounds} rounds")
    print(
        "config  slowdown  log p50 ms  log p99 ms  p99 less CPU wait ms  init→finish s"
        "  producer CPU s  uplink CPU s  server CPU s  p99 per round"
    )
    for config in configs:
        med = {k: statistics.median(r[k] for r in rows[config]) for k in rows[config][0]}
        p99s = ", ".join(f"{r['p99']:.2f}" for r in rows[config])
        print(
            f"{config:7s} {med['slowdown'] * 100:+7.0f}%  {med['p50']:10.2f}  {med['p99']:10.2f}"
            f"  {med['p99_own']:20.2f}  {med['finish']:13.2f}  {med['producer']:14.2f}"
            f"  {med['uplink']:12.2f}  {med['server']:12.2f}  {p99s}"
        )


if __name__ == "__main__":
    main()
