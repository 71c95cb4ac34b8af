"""Sync scaling: ``primeruns sync`` of an offline training run, by the run's length.

Run ``python tools/bench/sync_scaling.py`` (``--quick``: runs of 1,000, 4,000
and 16,000 steps instead of 2,000, 5,000, 20,000 and 100,000; ``--sizes``
any) from the repository root; ``--before TREE`` syncs the same runs with the
package of another checkout too (main, say), the sync and the platform it
ships to, in the same run, for a before/after.

Each size is one offline training run written by this process: every step
logs one metrics row, and every 10th step (the training sample table's
cadence) one gsm8k episode as a training episode of that step, so every
sink of a training run has work (Prime Traces, the training sample table,
the metrics rows). A fresh local platform on loopback then takes
``primeruns sync RUN --base-url URL`` in a child process, which reports the
seconds from the command's start (after the interpreter and imports: a fixed
cost that would hide the scaling) to its end, its CPU, and its RSS sampled
every 0.25 s; the platform's CPU during the sync is read from ``/proc``.

Reported per size: metrics rows per second (steps ÷ seconds, every sink
shipped and the run closed out) and its ratio to the second size's (the
smallest run's is the most weighed by fixed costs: registering, closing out;
the target of issue #32: the same rate, within 20%, at 5k, 20k
and 100k steps, and at least 2,000 rows/s); the RSS while shipping (the
median from a tenth of the sync on) with its ratio to the smallest run's
(target: within 10%), how it moved within the sync (its last tenth over its
second), and the peak; the CPU per row of the sync and the platform together,
the figure that holds on a machine shared with other work, then split: the
sync's (with its kernel part) and the platform's, to tell which side to look at.

What bounds the rate (measured 2026-12-05, 5,000 steps, threads' CPU in the
sync's process, the platform's from /proc): both processes' CPU, ~0.48 ms a
row each, and how much of it overlaps (~1.4 cores of 2). Since a backlog's
sample objects go up to 8 steps to a batch, each stage for all of them at
once and recorded once (``sinks.sample_objects``), the sample table and the
metrics rows end together: neither is the tail. The metrics rows take ~0.21
ms of the sync's CPU a row and ~0.27 of the platform's; a step's Parquet
object ~1.2 ms of the sync's (~1.0 since its rows are no longer copied to
null what JSON cannot hold, and pyarrow's import leaves numpy out: ~0.03 ms
a row of a sync with one every 10th step), of which pyarrow's writer is
~0.4 (the object's bytes are the wire's: its options, its statistics and
dictionaries are the contract's); the sync's process also compiles the
package where bytecode is not cached (PYTHONDONTWRITEBYTECODE: ~0.1 s of
CPU, ~0.02 ms a row at 5,000 steps, both trees alike); the platform's per
request is mostly its HTTP layer (uvicorn, h11, asyncio). Tried without
gain: the interpreter's switch interval (0.2 to 5 ms), more metrics rows in
flight (8) or in a window (128), with batches of 512 rows. 2,000 rows/s
needs both sides' CPU a row lower still, or fewer requests a row than the
contract's one a metrics row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import benchlib
from benchlib import API_KEY, TEAM, Table

import primeruns as pr
from primeruns.local import LocalPlatform

SIZES = (2_000, 5_000, 20_000, 100_000)
QUICK_SIZES = (1_000, 4_000, 16_000)
_EPISODE_EVERY = 10  # the training sample table's default cadence
_RATE_FLOOR = 2_000.0  # metrics rows/s
_RATE_SPREAD = 0.20  # every size's rate within 20% of the first's
_RSS_SPREAD = 1.10
_PROBE_S = 1.0  # seconds of the cores' probe after each sync

# The child: times the command itself (imports done) and samples its own RSS.
_SYNC = """
import json, statistics, sys, threading, time
from primeruns import cli

def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM", "RssFile"):
                out[name] = int(rest.split()[0])
    return out

samples = []
stop = threading.Event()

def sample():
    while not stop.wait(0.25):
        now = status()
        samples.append((time.perf_counter(), now["VmRSS"], now.get("RssFile", 0)))

threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
code = cli.main()  # its arguments this process's own, as the command's script runs it
seconds = time.perf_counter() - t0
stop.set()

def median(lo, hi, field=1):
    picked = [s[field] for s in samples if lo <= (s[0] - t0) / seconds <= hi]
    return statistics.median(picked) if picked else status()["VmRSS"]

import resource
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "seconds": seconds, "peak_kb": status()["VmHWM"],
                  "cpu_s": usage.ru_utime + usage.ru_stime, "sys_s": usage.ru_stime,
                  "early_kb": median(0.1, 0.2), "late_kb": median(0.9, 1.0),
                  "steady_kb": median(0.1, 1.0), "steady_file_kb": median(0.1, 1.0, 2)}))
"""


def log_run(runs: Path, steps: int, episode_every: int = _EPISODE_EVERY) -> tuple[Path, float]:
    """An offline training run of ``steps`` steps under ``runs``: (its journal,
    the producer's steps/s). ``episode_every`` 0: metrics rows only."""
    episodes = benchlib.records("gsm8k-eval", 200)
    run = pr.init(
        name="bench-sync",
        kind="train",
        model="Qwen/Qwen3-8B",
        team_id=TEAM,
        mode="offline",
        training=pr.TrainingSpec(max_steps=steps),
        runs_dir=runs,
    )
    t0 = time.perf_counter()
    for step in range(steps):
        if episode_every and step % episode_every == 0:
            episode = benchlib.renew_ids(dict(episodes[step % len(episodes)]), f"s{step}")
            episode["run"] = {"type": "train", "work": {"type": "train", "step": step}}
            run.log_episodes([episode])
        run.log_metrics(benchlib.metrics_row(step), step=step)
    rate = steps / (time.perf_counter() - t0)
    run.finish()
    path = run.journal_path
    assert path is not None
    return path, rate


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sync(tree: Path, journal: Path, url: str) -> dict[str, float]:
    """``primeruns sync`` of ``journal`` with the package of ``tree``: its
    seconds, and RSS figures in KiB (see ``_SYNC``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PRIME_API_KEY": API_KEY}
    done = subprocess.run(
        [sys.executable, "-c", _SYNC, "sync", str(journal), "--base-url", url, "--json"],
        # Not this checkout's root: ``python -c`` puts the working directory
        # first on the path, where it would win over PYTHONPATH's tree.
        cwd=journal.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise SystemExit(f"sync failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(lines[-1])
    if result["code"] != 0:
        raise SystemExit(f"sync exited {result['code']}:\n{done.stdout[-3000:]}")
    return result


def sync_one(
    tree: Path, steps: int, episode_every: int = _EPISODE_EVERY
) -> tuple[dict[str, float], float]:
    """One run of ``steps`` steps logged, then synced by ``tree``'s package
    to a fresh platform of its own: the sync's figures, the producer's rate."""
    with (
        benchlib.isolated_env(None) as scratch,
        # The platform's share of a sync is measured too: run from the tree's code.
        benchlib.local_platform(scratch / "platform", tree) as server,
    ):
        journal, produced = log_run(scratch / "runs", steps, episode_every)
        served = cpu_s(server.pid)
        result = sync(tree, journal, server.url)
        result["server_cpu_s"] = cpu_s(server.pid) - served
        check_landed(server, journal, steps)
    # What this machine gives two busy processes right after (a shared
    # host's varies by the minute): the sync and the platform are two.
    result["cores"] = benchlib.parallel_cores(_PROBE_S)
    return result, produced


def measure(sizes: tuple[int, ...], trees: list[tuple[str, Path]]) -> list[Table]:
    rows: dict[str, list[tuple[int, float, dict[str, float], float]]] = {
        name: [] for name, _ in trees
    }
    for steps in sizes:
        for name, tree in trees:
            result, produced = sync_one(tree, steps)
            rows[name].append((steps, result["seconds"], result, produced))
    t = Table(
        f"Sync scaling: primeruns sync of an offline training run by its length "
        f"(1 metrics row per step, 1 episode every {_EPISODE_EVERY}th)",
        [
            "tree",
            "steps",
            "sync s",
            "rows/s",
            "÷ 2nd size",
            "RSS shipping MB",
            "of it file MB",
            "÷ smallest",
            "late ÷ early",
            "peak MB",
            "CPU ms/row",
            "÷ 2nd size",
            "sync ms/row",
            "of it sys",
            "platform ms/row",
            "cores used",
            "free",
        ],
    )
    for name, _ in trees:
        measured = rows[name]
        ref = measured[1] if len(measured) > 1 else measured[0]  # the smallest: fixed costs
        ref_rate = ref[0] / ref[1]
        first_rss = measured[0][2]["steady_kb"]
        ref_cpu = (ref[2]["cpu_s"] + ref[2]["server_cpu_s"]) / ref[0]
        for steps, seconds, rss, _ in measured:
            rate = steps / seconds
            cpu = (rss["cpu_s"] + rss["server_cpu_s"]) / steps
            t.add(
                name,
                f"{steps:,}",
                f"{seconds:.1f}",
                f"{rate:,.0f}",
                f"{rate / ref_rate:.2f}",
                f"{rss['steady_kb'] / 1024:.0f}",
                f"{rss.get('steady_file_kb', 0) / 1024:.0f}",
                f"{rss['steady_kb'] / first_rss:.2f}",
                f"{rss['late_kb'] / rss['early_kb']:.2f}",
                f"{rss['peak_kb'] / 1024:.0f}",
                f"{cpu * 1000:.2f}",
                f"{cpu / ref_cpu:.2f}",
                f"{rss['cpu_s'] * 1000 / steps:.2f}",
                f"{rss.get('sys_s', 0.0) * 1000 / steps:.2f}",
                f"{rss['server_cpu_s'] * 1000 / steps:.2f}",
                f"{(rss['cpu_s'] + rss['server_cpu_s']) / seconds:.2f}",
                f"{rss['cores']:.2f}",
            )
        rated = [steps / seconds for steps, seconds, _, _ in measured[1:]] or [ref_rate]
        spread = max(rated) / min(rated) - 1
        slowest = min(rated)
        growth = max(r[2]["steady_kb"] for r in measured) / first_rss
        t.notes.append(
            f"{name}: rates but the smallest run's within {spread:.0%} of each other "
            f"({'ok' if spread <= _RATE_SPREAD else 'MISS'} ≤ {_RATE_SPREAD:.0%}); slowest "
            f"{slowest:,.0f} rows/s ({benchlib.verdict(slowest, _RATE_FLOOR, at_least=True)}); "
            f"RSS while shipping, largest run ÷ smallest {growth:.2f} "
            f"({benchlib.verdict(growth, _RSS_SPREAD)})"
        )
    t.notes.append(
        "RSS shipping: the median of the sync's RSS (sampled every 0.25 s) from 10% of its "
        "time to its end (of it file MB: the median of its file-backed part, RssFile: the "
        "libraries' pages and the journals' mapped pages); late ÷ early: the last tenth's "
        "over the second's (flat while it ships: ≤ 1.10); peak: VmHWM, with the first "
        "Prime Traces batch (up to 30 MB of episodes) in memory"
    )
    t.notes.append(
        "CPU ms/row: the sync's CPU and the platform's during it, per metrics row: what a "
        "machine shared with other work pays, whatever the wall time; split after it into "
        "the sync's (of it sys: its kernel time) and the platform's"
    )
    t.notes.append(
        "sync s: from the command's start (interpreter and imports excluded) to its end, "
        "every sink shipped and the run closed out; a fresh local platform per run"
    )
    for name, _ in trees:
        steps, _, largest, _ = rows[name][-1]
        sync_ms = largest["cpu_s"] * 1000 / steps
        platform_ms = largest["server_cpu_s"] * 1000 / steps
        note = benchlib.ceiling_note(largest["cores"], sync_ms, platform_ms, _RATE_FLOOR)
        t.notes.append(f"{name}, {steps:,} steps: {note}")
    t.notes.append(
        "cores used: the sync's and the platform's CPU over the sync's wall time; free: the "
        f"cores' worth {os.cpu_count()} busy processes got at once right after it "
        "(benchlib.parallel_cores; on a shared host it varies by the minute): the sync and "
        "the platform are two busy processes of one interpreter each, so their CPU per row "
        "on those cores bounds the rate, whatever the requests in flight"
    )
    rates = [r[3] for name, _ in trees for r in rows[name]]
    t.notes.append(f"the producer logged {min(rates):,.0f}-{max(rates):,.0f} steps/s")
    return [t, measure_alone(sizes[1] if len(sizes) > 1 else sizes[0], trees)]


def measure_alone(steps: int, trees: list[tuple[str, Path]]) -> Table:
    """The metrics rows of a run without episodes: the rate of the metrics
    sink itself, where a training run's is that of its slowest sink (the
    sample table's three requests an object, one after the other)."""
    t = Table(
        f"Metrics rows alone: primeruns sync of a {steps:,}-step run logging only metrics",
        ["tree", "rows/s", "sync ms/row", "platform ms/row", "cores used", "free"],
    )
    for name, tree in trees:
        result, _ = sync_one(tree, steps, episode_every=0)
        rate = steps / result["seconds"]
        t.add(
            name,
            f"{rate:,.0f}",
            f"{result['cpu_s'] * 1000 / steps:.2f}",
            f"{result['server_cpu_s'] * 1000 / steps:.2f}",
            f"{(result['cpu_s'] + result['server_cpu_s']) / result['seconds']:.2f}",
            f"{result['cores']:.2f}",
        )
        t.notes.append(
            f"{name}: {rate:,.0f} metric rows/s "
            f"({benchlib.verdict(rate, _RATE_FLOOR, at_least=True)})"
        )
    return t


def check_landed(server: LocalPlatform, journal: Path, steps: int) -> None:
    """Every metrics row and training sample object is on the platform, once."""
    del journal
    import sqlite3

    db = sqlite3.connect(server.data_dir / "platform.sqlite3")
    try:
        rows = db.execute("SELECT count(*), count(DISTINCT step) FROM train_metrics").fetchone()
    finally:
        db.close()
    if rows != (steps, steps):
        raise SystemExit(f"the platform holds {rows[0]} metrics rows ({rows[1]} steps) of {steps}")


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    """For ``run_all.py``: this tree only."""
    return measure(QUICK_SIZES if quick else SIZES, [("this tree", benchlib.ROOT)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k, 4k and 16k steps")
    parser.add_argument("--sizes", type=str, default=None, help="steps, comma-separated")
    parser.add_argument(
        "--before", type=benchlib.as_installed_arg, help="a checkout whose package syncs too"
    )
    parser.add_argument("--repeat", type=int, default=None, help="ignored (one run)")
    args = parser.parse_args(argv)
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    else:
        sizes = QUICK_SIZES if args.quick else SIZES
    trees = [("this tree", benchlib.ROOT)]
    if args.before is not None:
        trees.insert(0, ("before", args.before.resolve()))
    benchlib.print_tables(measure(sizes, trees))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
