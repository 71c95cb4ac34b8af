"""Idle wake-ups: how often a run's threads wake while nothing is logged.

Run ``python tools/bench/idle_wakeups.py`` (``--quick``: a 3 s window, one
round) from the repository root. An online train run against a local
platform on loopback logs 8 episodes and a metrics row, flushes, and then
logs nothing for the window (an evaluation waiting on its model, a training
step on the GPU). Over the window the context switches of every thread of
the producer and of its uplink process are counted (``/proc``: Linux only).

Every wake-up of an idle run is waste: a timer that looks for work instead
of being told of it. The target (issue "The uplink": wake-ups without timed
polling) is none beyond the producer's own: the uplink and the producer's
background threads wait on events, and a timer runs only while there is
something to time (a retry, a linger, the first sync after a write).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from benchlib import API_KEY, Table

SETTLE_S = 2.0  # after the flush: the first sync after the last write, a linger


def switches(pid: int) -> dict[str, int]:
    """Context switches so far per thread of ``pid`` (name:tid)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # a thread that just ended
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        count = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        out[f"{name}:{task.name}"] = count
    return out


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def child(url: str, runs_dir: str, window: float) -> dict[str, float]:
    """In a fresh process: a run gone idle; wake-ups per second, per process."""
    import primeruns as pr

    run = pr.init(
        name="bench-idle",
        kind="train",
        model="Qwen/Qwen3-8B",
        api_key=API_KEY,
        base_url=url,
        runs_dir=runs_dir,
        team_id="team-bench",
        training=pr.TrainingSpec(max_steps=1),
    )
    run.log_episodes(benchlib.records("gsm8k-eval", 8))
    run.log_metrics(benchlib.metrics_row(0), step=0)
    run.flush(timeout=60)
    time.sleep(SETTLE_S)  # the run's last timers (a sync, a linger) run out
    me = os.getpid()
    uplinks = children(me)
    before = {p: switches(p) for p in [me, *uplinks]}
    time.sleep(window)  # the idle window measured: this thread is left out
    after = {p: switches(p) for p in [me, *uplinks]}
    run.finish(timeout=60)

    def rate(pid: int, skip_main: bool) -> float:
        total = 0
        for thread, count in after[pid].items():
            if skip_main and int(thread.rsplit(":", 1)[1]) == pid:
                continue  # the benchmark's own sleeping main thread
            total += count - before[pid].get(thread, count)
        return total / window

    return {
        "producer": rate(me, skip_main=True),
        "uplink": sum(rate(p, skip_main=False) for p in uplinks),
    }


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    repeats = repeat or (1 if quick else 3)
    window = 3.0 if quick else 10.0
    rates: dict[str, list[float]] = {"producer": [], "uplink": []}
    with benchlib.isolated_env(None) as scratch:
        with benchlib.local_platform(scratch / "platform") as server:
            env = dict(os.environ, PRIME_TRACES_URL=server.url)
            for _ in range(repeats):
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        json.dumps([server.url, str(scratch / "runs"), window]),
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=300,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"idle child failed:\n{out.stderr[-3000:]}")
                got = json.loads(out.stdout.strip().splitlines()[-1])
                for key in rates:
                    rates[key].append(float(got[key]))
    table = Table(
        f"Idle wake-ups: an online train run logging nothing for {window:.0f} s",
        ["process", "wake-ups per second (median)", "spread"],
    )
    for key, label in (("producer", "producer (its threads)"), ("uplink", "uplink process")):
        table.add(label, f"{statistics.median(rates[key]):.1f}", benchlib.spread(rates[key]))
    table.notes += [
        "context switches of every thread, from /proc; the producer's main thread "
        "(asleep in the benchmark) is left out",
        f"median of {repeats} run(s), each in a fresh process",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        url, runs_dir, window = json.loads(argv[1])
        print(json.dumps(child(str(url), str(runs_dir), float(window))))
        return
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
