"""Hot path: what one ``log_*`` call costs the producer, as a ratio to ``json.dumps``.

Run ``python tools/bench/hot_path.py`` (``--quick`` for a short version) from
the repository root. For each workload it times, call by call:

- ``run.log_metrics(row)`` of a 10-scalar row (a training run);
- ``run.log_episodes([episode])`` of one gsm8k eval episode (~9 KB);
- ``run.log_episodes([episode])`` of one agentic training episode (~120 KB);

in both durability modes (``process``, the default, and ``fsync``), with the
SDK online against a local platform on loopback (its uplink process uploads
concurrently, as in real use) and offline (journal only). The reference is
``json.dumps`` of the very same record, timed right before each call, so both
see the same machine noise. Reported: p50/p99 µs per call and the p50 ratio,
the median over ``--repeat`` runs with the spread between them.

Budgets (DESIGN §7), default durability: ``log_metrics`` p50 ≤ 2× and a gsm8k
``log_episodes`` p50 ≤ 0.75× ``json.dumps`` of the same record.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import benchlib
from benchlib import API_KEY, TEAM, Table

import primeruns as pr

Durability = Literal["process", "fsync"]
_WARMUP = 10  # the first calls pay one-time costs (imports, caches, LMDB growth)


@dataclass(frozen=True)
class Workload:
    label: str
    kind: Literal["eval", "train"]
    records: list[dict[str, Any]]
    call: Callable[[pr.Run, dict[str, Any], int], None]
    budget: float | None  # p50 ratio budget at the default durability


@dataclass(frozen=True)
class Sample:
    p50: float
    p99: float
    ref_p50: float
    ref_p99: float

    @property
    def ratio(self) -> float:
        return self.p50 / self.ref_p50


def _log_metrics(run: pr.Run, row: dict[str, Any], i: int) -> None:
    run.log_metrics(row, step=i)


def _log_episode(run: pr.Run, episode: dict[str, Any], i: int) -> None:
    run.log_episodes([episode])


def workloads(quick: bool) -> list[Workload]:
    n_metrics, n_gsm8k, n_agentic = (1000, 300, 60) if quick else (5000, 2000, 300)
    return [
        Workload(
            "log_metrics (10 scalars)",
            "train",
            [benchlib.metrics_row(i) for i in range(n_metrics)],
            _log_metrics,
            2.0,
        ),
        Workload(
            "log_episodes gsm8k (~9 KB)",
            "eval",
            benchlib.records("gsm8k-eval", n_gsm8k),
            _log_episode,
            0.75,
        ),
        Workload(
            "log_episodes agentic (~120 KB)",
            "train",
            benchlib.records("agentic-train", n_agentic),
            _log_episode,
            None,
        ),
    ]


def open_run(
    kind: Literal["eval", "train"], durability: Durability, url: str | None, runs_dir: Path
) -> pr.Run:
    """A run online against ``url``, or offline when ``url`` is None."""
    return pr.init(
        name=f"bench-{kind}",
        environments=["gsm8k"],
        model="Qwen/Qwen3-8B",
        framework="verifiers",
        kind=kind,
        team_id=TEAM,
        mode="online" if url else "offline",
        api_key=API_KEY if url else None,
        base_url=url,
        runs_dir=runs_dir,
        durability=durability,
    )


def measure(
    work: Workload, durability: Durability, url: str | None, runs_dir: Path, n: int | None = None
) -> Sample:
    """Time each call and ``json.dumps`` of its record just before it, interleaved."""
    records = work.records if n is None else work.records[:n]
    run = open_run(work.kind, durability, url, runs_dir)
    ref: list[float] = []
    cost: list[float] = []
    clock = time.perf_counter_ns
    try:
        for i, record in enumerate(records):
            t0 = clock()
            json.dumps(record)
            t1 = clock()
            work.call(run, record, i)
            t2 = clock()
            if i >= _WARMUP:
                ref.append((t1 - t0) / 1000)
                cost.append((t2 - t1) / 1000)
    finally:
        run.finish(timeout=120)
    if run.dropped_records or run.failed_records:
        raise RuntimeError(
            f"{work.label}: dropped {run.dropped_records}, failed {run.failed_records}"
        )
    p50, p99 = benchlib.pcts(cost)
    r50, r99 = benchlib.pcts(ref)
    return Sample(p50, p99, r50, r99)


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    repeats = repeat or (1 if quick else 3)
    table = Table(
        "Hot path: one log_* call vs json.dumps of the same record (µs per call)",
        [
            "call",
            "durability",
            "SDK",
            "p50 ratio",
            "budget",
            "p50 µs",
            "p99 µs",
            "dumps p50 µs",
            "dumps p99 µs",
            "spread",
        ],
    )
    with benchlib.isolated_env(None) as scratch:
        with benchlib.local_platform(scratch / "platform") as server:
            import os

            os.environ["PRIME_TRACES_URL"] = server.url
            for work in workloads(quick):
                for durability in ("process", "fsync"):
                    for where, url in (("online", server.url), ("offline", None)):
                        n = None if durability == "process" else min(len(work.records), 500)
                        samples = [
                            measure(work, durability, url, scratch / "runs", n)
                            for _ in range(repeats)
                        ]
                        ratios = [s.ratio for s in samples]
                        ratio = statistics.median(ratios)
                        budget = "-"
                        if work.budget is not None and durability == "process":
                            budget = benchlib.verdict(ratio, work.budget)
                        table.add(
                            work.label,
                            durability,
                            where,
                            f"{ratio:.2f}",
                            budget,
                            f"{statistics.median(s.p50 for s in samples):.1f}",
                            f"{statistics.median(s.p99 for s in samples):.1f}",
                            f"{statistics.median(s.ref_p50 for s in samples):.1f}",
                            f"{statistics.median(s.ref_p99 for s in samples):.1f}",
                            benchlib.spread(ratios),
                        )
    table.notes += [
        f"median of {repeats} run(s); spread = largest deviation of a run's ratio from the median",
        "reference: json.dumps(record) timed just before each call in the same loop",
        "online: the uplink process uploads to a local platform during the loop (shared cores)",
        "fsync rows use at most 500 calls per run (each call waits for the disk)",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
