"""A producer SIGKILLed mid-run: how long until its run is whole and closed, with no command run.

Run ``python tools/bench/crash_close.py`` (``--quick``: one round) from the
repository root. A training loop (``loop_worker``'s step: pure-Python work,
then ``log_episodes`` of 8 gsm8k episodes and one ``log_metrics`` row) runs
online in a process of its own against one ``primeruns serve`` on loopback;
after 30 of its 60 steps have returned, the producer alone is SIGKILLed (as
an out-of-memory kill does; its uplink lives on). The clock runs from the
kill until the platform holds every record the journal holds, each exactly
once, and the run is closed as crashed (``FAILED`` with the crash named).

The target (issue "The uplink"): within 60 s, with no command run.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Table
from loop_worker import API_KEY, TEAM, step_batches, work

from primeruns.journal import EntryKind, Journal

STEPS = 60
KILL_AFTER = 30
WORK = 350_000
TARGET_S = 60.0


def producer(episodes_path: str, url: str, runs_dir: str) -> None:
    """The killed process: logs until the kill, printing each step that returned."""
    import primeruns as pr

    with open(episodes_path, "rb") as f:
        episodes = [json.loads(line) for line in f if line.strip()]
    batches = step_batches(episodes, STEPS)
    run = pr.init(
        name="bench-crash",
        kind="train",
        model="Qwen/Qwen3-8B",
        team_id=TEAM,
        api_key=API_KEY,
        base_url=url,
        runs_dir=runs_dir,
        training=pr.TrainingSpec(max_steps=STEPS),
    )
    print(f"run {run.id} {run.journal_path}", flush=True)
    for step in range(STEPS):
        work(WORK)
        run.log_episodes(batches[step])
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        print(f"step {step}", flush=True)
    sys.stdin.read()  # never finishes by itself: it waits here for the kill


def journaled(path: Path) -> tuple[int, int]:
    """(episodes, metrics rows) the killed producer's journal holds."""
    with Journal.open(path, owner=False) as journal:
        got = journal.read(
            0, kinds={EntryKind.EPISODE, EntryKind.METRICS}, max_entries=10**6, max_bytes=1 << 34
        )
    episodes = sum(1 for e in got.entries if e.kind == EntryKind.EPISODE)
    return episodes, len(got.entries) - episodes


def one_round(server: Any, episodes: Path, scratch: Path, round_: int) -> dict[str, Any]:
    runs_dir = scratch / "runs" / str(round_)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--producer", str(episodes), server.url, str(runs_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    _, run_id, journal_path = proc.stdout.readline().split()
    for _ in range(KILL_AFTER):
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    proc.wait()
    n_episodes, n_metrics = journaled(Path(journal_path))
    while True:
        stored = server.run(run_id)
        traces = stored.get("traces") or {}
        metrics = stored.get("train_metrics") or {}
        whole = (
            traces.get("episodes") == traces.get("distinct_episodes") == n_episodes
            and metrics.get("rows") == metrics.get("steps") == n_metrics
        )
        if stored["status"] != "RUNNING" and whole:
            break
        if time.monotonic() - killed > 2 * TARGET_S:
            late = f"{2 * TARGET_S:.0f} s"
            raise RuntimeError(f"not closed and whole {late} after the kill: {stored}")
        time.sleep(0.05)  # the measurement's resolution
    return {
        "seconds": time.monotonic() - killed,
        "status": stored["status"],
        "crash_named": "crash" in (stored.get("error_message") or ""),
        "episodes": n_episodes,
        "metrics": n_metrics,
    }


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    repeats = repeat or (1 if quick else 3)
    lines = benchlib.raw_lines("gsm8k-eval")[:400]
    results = []
    with benchlib.isolated_env(None) as scratch:
        episodes = scratch / "episodes.jsonl"
        episodes.write_bytes(b"\n".join(lines) + b"\n")
        with benchlib.local_platform(scratch / "platform") as server:
            os.environ["PRIME_TRACES_URL"] = server.url
            results = [one_round(server, episodes, scratch, r) for r in range(repeats)]
    table = Table(
        f"A producer SIGKILLed after {KILL_AFTER} of {STEPS} training steps (8 gsm8k "
        "episodes + 1 metrics row each): kill → run whole and closed, no command run",
        ["round", "seconds", "status", "crash named", "episodes", "metrics rows", "exactly once"],
    )
    for i, r in enumerate(results):
        table.add(
            i + 1,
            f"{r['seconds']:.2f}",
            r["status"],
            "yes" if r["crash_named"] else "no",
            r["episodes"],
            r["metrics"],
            "yes",  # one_round returns only once every record landed exactly once
        )
    worst = max(r["seconds"] for r in results)
    closed = all(r["status"] == "FAILED" and r["crash_named"] for r in results)
    table.notes += [
        f"median {statistics.median(r['seconds'] for r in results):.2f} s, worst {worst:.2f} s "
        f"(≤ {TARGET_S:.0f} s): {benchlib.verdict(worst, TARGET_S)}",
        f"closed as crashed every round: {'ok' if closed else 'MISS'}",
        "exactly once: the platform's episode count equals its distinct count equals the "
        "journal's, and likewise its metrics rows and steps (the training sample table "
        "holds a sample of the steps by design)",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--producer"]:
        producer(*sys.argv[2:5])
    else:
        main()
