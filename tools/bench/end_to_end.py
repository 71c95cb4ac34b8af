"""End to end: init → log N gsm8k episodes → finish, against one local platform.

Run ``python tools/bench/end_to_end.py`` (``--quick`` for 300 episodes instead
of 2,000) from the repository root. Three producers, each its own process (so
each pays its own start-up and is measured alike), take turns against the same
``primeruns serve`` on loopback, logging the same episodes one
``log_episodes([episode])`` call each:

- ``ours``: this SDK as shipped (journal, the uplink process, sinks);
- ``ours, threads``: this SDK shipping from threads in the producer (the
  fallback where no process can be started, ``PRIME_RUNS_UPLINK=threads``);
- ``in-memory``: this SDK with its journal replaced by an in-memory queue
  (``memjournal.py``: same API and locking; no framing, zstd, LMDB or sync),
  shipping from threads, so ``ours, threads / in-memory`` is the journal's
  own cost;
- ``vendor``: ``prime-runs==0.1.4`` from PyPI, installed by this script in its
  own virtual environment (``tools/bench/.venv-vendor``, git-ignored) because
  it owns the ``prime_runs`` import name. It reads PRIME_TRACES_URL like ours.

Reported per producer: episodes/s (N over wall seconds from just before
``init`` to ``finish`` returning) and CPU seconds per episode (every thread of
the producer process, ``time.process_time``), medians over ``--repeat`` rounds.
Every run is checked on the server (``/_local/runs/{id}``): all N episodes must
have landed in Prime Traces, or the benchmark fails. Ours also writes the eval
sample table (one row per episode); the vendor only does so when Prime Traces
refuses the account, so ours does strictly more work here.

Budgets (DESIGN §7): ours ≥ 1× the vendor's episodes/s, although every episode
goes to two sinks here; ours ≤ 1.3× the time of the in-memory variant.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Table

HERE = Path(__file__).resolve().parent
VENDOR_VENV = HERE / ".venv-vendor"
VENDOR_PACKAGES = ("prime-runs==0.1.4", "prime-traces==0.0.10", "pyarrow")
WORKER = HERE / "e2e_worker.py"
SDKS = ("ours", "ours, threads", "in-memory", "vendor")


@dataclass(frozen=True)
class Result:
    sdk: str
    episodes: int
    wall_s: float
    cpu_s: float
    log_s: float
    finish_s: float

    @property
    def eps(self) -> float:
        return self.episodes / self.wall_s


def vendor_python() -> Path:
    """The vendor venv's interpreter, creating the venv on first use."""
    python = VENDOR_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENDOR_VENV} with {' '.join(VENDOR_PACKAGES)} ...", file=sys.stderr)
        venv.create(VENDOR_VENV, with_pip=True, clear=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *VENDOR_PACKAGES], check=True)
    return python


def run_worker(
    sdk: str, records_path: Path, url: str, scratch: Path, env: dict[str, str]
) -> dict[str, Any]:
    python = str(vendor_python()) if sdk == "vendor" else sys.executable
    arg = {"in-memory": "memory", "ours, threads": "threads"}.get(sdk, sdk)
    runs_dir = scratch / "runs" / arg
    proc = subprocess.run(
        [python, str(WORKER), arg, str(records_path), url, str(runs_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{sdk} worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_landed(server: Any, run_id: str, n: int, sdk: str) -> dict[str, Any]:
    stored: dict[str, Any] = server.run(run_id)
    traces = stored.get("traces") or {}
    if traces.get("distinct_episodes") != n:
        raise RuntimeError(f"{sdk}: {traces.get('distinct_episodes')} of {n} episodes landed")
    return stored


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    n = 300 if quick else 2000
    repeats = repeat or (1 if quick else 3)
    vendor_python()
    lines = benchlib.raw_lines("gsm8k-eval")[:n]
    results: dict[str, list[Result]] = {sdk: [] for sdk in SDKS}
    samples: dict[str, int] = {}
    with benchlib.isolated_env(None) as scratch:
        records_path = scratch / "episodes.jsonl"
        records_path.write_bytes(b"\n".join(lines) + b"\n")
        with benchlib.local_platform(scratch / "platform") as server:
            env = dict(os.environ, PRIME_TRACES_URL=server.url)
            for round_ in range(repeats):
                # Rotate the order so no producer always runs first (warm caches, drift).
                order = SDKS[round_ % len(SDKS) :] + SDKS[: round_ % len(SDKS)]
                for sdk in order:
                    out = run_worker(sdk, records_path, server.url, scratch, env)
                    stored = check_landed(server, out["run_id"], n, sdk)
                    samples[sdk] = int((stored.get("samples") or {}).get("rows") or 0)
                    results[sdk].append(
                        Result(sdk, n, out["wall_s"], out["cpu_s"], out["log_s"], out["finish_s"])
                    )
    return [_table(results, samples, n, repeats)]


def _table(
    results: dict[str, list[Result]], samples: dict[str, int], n: int, repeats: int
) -> Table:
    med = {
        sdk: {
            "eps": statistics.median(r.eps for r in rs),
            "cpu": statistics.median(r.cpu_s / r.episodes for r in rs),
            "wall": statistics.median(r.wall_s for r in rs),
            "log": statistics.median(r.log_s for r in rs),
            "finish": statistics.median(r.finish_s for r in rs),
        }
        for sdk, rs in results.items()
    }
    ours = med["ours"]
    table = Table(
        f"End to end: init → {n} gsm8k episodes → finish, one local platform on loopback",
        [
            "producer",
            "episodes/s",
            "ours ÷ this (episodes/s)",
            "CPU ms/episode",
            "this ÷ ours (CPU)",
            "wall s",
            "log s",
            "finish s",
            "sample rows",
            "spread (episodes/s)",
        ],
    )
    for sdk in SDKS:
        m = med[sdk]
        table.add(
            sdk,
            f"{m['eps']:.0f}",
            f"{ours['eps'] / m['eps']:.2f}",
            f"{m['cpu'] * 1000:.2f}",
            f"{m['cpu'] / ours['cpu']:.2f}",
            f"{m['wall']:.2f}",
            f"{m['log']:.2f}",
            f"{m['finish']:.2f}",
            str(samples.get(sdk, 0)),
            benchlib.spread([r.eps for r in results[sdk]]),
        )
    vs_vendor = ours["eps"] / med["vendor"]["eps"]
    journal_cost = med["ours, threads"]["wall"] / med["in-memory"]["wall"]
    table.notes += [
        f"ours ÷ vendor episodes/s = {vs_vendor:.2f}: "
        f"{benchlib.verdict(vs_vendor, 1.0, at_least=True)}",
        f"journal cost = ours, threads ÷ in-memory wall time = {journal_cost:.2f}: "
        f"{benchlib.verdict(journal_cost, 1.3)}",
        f"median of {repeats} round(s), producers in rotating order; every run verified on "
        "the server (all episodes in Prime Traces)",
        "CPU = the producer process only (all its threads; not the uplink process, nor the server)",
        "in-memory ships from threads (its journal lives in the producer's memory), so the "
        "journal's cost is measured against ours, threads",
    ]
    return table


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
