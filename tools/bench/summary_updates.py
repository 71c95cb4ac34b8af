"""What a run that updates its summary every step costs: journal bytes and the
readers of its last summary, at 1k, 10k and 100k updates.

    python tools/bench/summary_updates.py [--updates 1000,10000,100000] [--before TREE]

For each count, a fresh process writes an offline training run under a
temporary runs dir with the SDK: ``count`` calls of ``run.update_summary``
with a 20-key summary (one key changed per call), then dies without
finishing (``os._exit``, as a preempted job), so every reader must find the
last summary (a crash is closed out with it). Then, each in a fresh process
with the same package:

- the journal's bytes on disk (``data.mdb`` and spool segments);
- ``primeruns show DIR --json`` wall seconds;
- the offline dashboard's index of the journal (``JournalIndex.update``);
- the uplink's close-out read (``terminal_state``: the crash's summary).

The figures are reported with their ratio to the 1k run's (flat costs: ~1x).
``--before TREE`` measures another checkout's package first (the code
before a change). ``run_all.py`` runs it with 1k, 10k, 100k (``--quick``:
1k and 10k).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import ROOT, Table

KEYS = 20

_WRITE = """
import os, sys
import primeruns as pr
keys = int(sys.argv[3]) - 1
run = pr.init(name="summary-updates", kind="train", model="m", mode="offline",
              team_id="team-bench", runs_dir=sys.argv[1])
summary = {f"key_{i:02d}": 0.5 * i for i in range(keys)}
for step in range(int(sys.argv[2])):
    summary[f"key_{step % keys:02d}"] = step + 0.25
    summary["step"] = step
    run.update_summary(summary)
print(run.journal_path, flush=True)
os._exit(0)
"""

# A shipped run's journal: every update acknowledged by its sink at once, on
# disk (a byte budget of BUDGET) and in memory (no folder to write to).
_SHIPPED = """
import json, sys, tempfile
from pathlib import Path
from primeruns.journal import EntryKind, Journal
from primeruns.journal.memory import MemoryJournal
count, keys, budget = int(sys.argv[1]), int(sys.argv[2]) - 1, int(sys.argv[3])
BATCH = 100
summary = {f"key_{i:02d}": 0.5 * i for i in range(keys)}
out = {}
with tempfile.TemporaryDirectory() as tmp:
    disk = Journal.create(Path(tmp), local_id="run", max_bytes=budget)
    memory = MemoryJournal(max_bytes=1 << 40, meta={})
    for j in (disk, memory):
        j.set_sinks(["traces"])
        dropped = 0
        for step in range(count):
            summary[f"key_{step % keys:02d}"] = step + 0.25
            summary["step"] = step
            row = json.dumps(summary).encode()
            dropped += j.append(EntryKind.SUMMARY, [row]).dropped
            dropped += j.append(EntryKind.METRICS, [b'{"step": %d}' % step]).dropped
            if step % BATCH == BATCH - 1:  # a batch shipped
                j.ack("traces", j.last_seq())
        j.ack("traces", j.last_seq())
        j.compact(["traces"])
        name = "memory" if j is memory else "disk"
        out[name + "_dropped"] = dropped
        out[name + "_bytes"] = j.size_bytes()
    disk.close()
print(json.dumps(out))
"""

_READ = """
import json, sys, time
from pathlib import Path
from primeruns.journal import Journal
from primeruns.ship.uplink import terminal_state
from primeruns.local.dashboard.journal_index import JournalIndex
path = Path(sys.argv[1])
out = {}
with Journal.open(path, owner=False) as journal:
    t0 = time.perf_counter()
    status, _, summary = terminal_state(journal)
    out["uplink"] = time.perf_counter() - t0
    out["step"] = summary.get("step")
    t0 = time.perf_counter()
    index = JournalIndex(True)
    index.update(journal)
    out["index"] = time.perf_counter() - t0
    out["index_step"] = index.summary.get("step")
print(json.dumps(out))
"""


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}


def write_run(tree: Path, runs: Path, updates: int) -> Path:
    done = subprocess.run(
        [sys.executable, "-c", _WRITE, str(runs), str(updates), str(KEYS)],
        env=_env(tree),
        cwd="/",  # not a checkout's folder: its package would come first
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"writing the run failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


SHIPPED_BUDGET = 16 << 20


def shipped(tree: Path, updates: int) -> dict[str, int]:
    """A shipped run's journal after ``updates`` (``_SHIPPED``)."""
    done = subprocess.run(
        [sys.executable, "-c", _SHIPPED, str(updates), str(KEYS), str(SHIPPED_BUDGET)],
        env=_env(tree),
        cwd="/",  # not a checkout's folder: its package would come first
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def journal_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.name != "lock.mdb")


def measure(tree: Path, journal: Path, updates: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(journal)],
        env=_env(tree),
        cwd="/",  # not a checkout's folder: its package would come first
        capture_output=True,
        text=True,
        check=True,
    )
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if out["step"] != updates - 1 or out["index_step"] != updates - 1:
        raise SystemExit(f"the last summary was not read: {out}")
    t0 = time.perf_counter()
    shown = subprocess.run(
        [sys.executable, "-m", "primeruns", "show", str(journal), "--json"],
        env=_env(tree),
        cwd="/",  # not a checkout's folder: its package would come first
        capture_output=True,
        text=True,
        check=False,
    )
    out["show"] = time.perf_counter() - t0
    if json.loads(shown.stdout)["summary"].get("step") != updates - 1:
        raise SystemExit("show did not print the last summary")
    out["bytes"] = journal_bytes(journal)
    return out


def run(
    quick: bool,
    repeat: int | None = None,
    *,
    counts: list[int] | None = None,
    before: Path | None = None,
) -> list[Table]:
    counts = counts or ([1_000, 10_000] if quick else [1_000, 10_000, 100_000])
    cases = ([("before", before)] if before else []) + [("this tree", ROOT)]
    table = Table(
        f"a run updating a {KEYS}-key summary every step, crashed: journal and readers",
        [
            "code",
            "updates",
            "journal KB",
            "show (s)",
            "dashboard index (ms)",
            "uplink close-out read (ms)",
        ],
    )
    for name, tree in cases:
        first: dict[str, float] | None = None
        for count in counts:
            with tempfile.TemporaryDirectory() as tmp:
                runs = Path(tmp) / "runs"
                runs.mkdir(mode=0o700)
                got = measure(tree, write_run(tree, runs, count), count)
            first = first or got
            table.add(
                name,
                f"{count:,}",
                f"{got['bytes'] / 1e3:.0f} ({got['bytes'] / first['bytes']:.1f}x)",
                f"{got['show']:.2f} ({got['show'] / first['show']:.1f}x)",
                f"{got['index'] * 1e3:.1f} ({got['index'] / first['index']:.1f}x)",
                f"{got['uplink'] * 1e3:.1f} ({got['uplink'] / first['uplink']:.1f}x)",
            )
    table.notes.append(
        "ratios to the same code's 1k-update run; each figure one fresh process "
        "(show: its wall time, interpreter included)"
    )
    ship = Table(
        f"a shipped run updating its summary and logging a metrics row every step "
        f"(acknowledged every 100 steps; on disk: a {SHIPPED_BUDGET >> 20} MiB budget)",
        ["code", "updates", "disk: records dropped", "disk: file KB", "in memory: KB held"],
    )
    for name, tree in cases:
        for count in counts:
            kept = shipped(tree, count)
            ship.add(
                name,
                f"{count:,}",
                f"{kept['disk_dropped']:,}",
                f"{kept['disk_bytes'] / 1e3:.0f}",
                f"{kept['memory_bytes'] / 1e3:.1f}",
            )
    return [table, ship]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", default="1000,10000,100000", help="comma-separated counts")
    parser.add_argument(
        "--before", type=benchlib.as_installed_arg, help="a checkout whose package runs first"
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.updates.split(",")]
    for table in run(False, counts=counts, before=args.before):
        print(table.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
