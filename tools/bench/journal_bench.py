"""Measure the journal: append cost per record and bytes on disk per raw byte.

Run ``python tools/bench/journal_bench.py`` from the repository root. It prints:

- append cost per record (p50/p99 µs) for a 10-scalar metrics row and a 50 KB
  episode in both durability modes, each also as a ratio to ``json.dumps`` of
  the same record measured in the same run (the DESIGN budgets are ratios);
- journal file bytes per raw JSON byte for the workloads in ``../shared/data``
  (budget ≤ 0.25) and for metrics rows, without and with the zstd dictionary
  the journal trains on a run's first records (how its keep-if-it-pays rule
  was chosen).

Timings belong here, not in tests. Numbers vary by machine; compare ratios.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import zstandard

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from primeruns.journal import EntryKind, Journal, dictionary  # noqa: E402
from primeruns.journal.spool import spool_bytes  # noqa: E402
from primeruns.journal.store import DATA_NAME  # noqa: E402

DATA = ROOT / ".." / "shared" / "data"


def _pcts(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.99) - 1)]


def metrics_row(i: int) -> dict[str, object]:
    rng = random.Random(i)
    names = ["loss", "reward", "kl", "entropy", "lr", "grad_norm", "tokens", "step", "acc", "len"]
    return {k: rng.random() * 10 for k in names}


def episode_50k(i: int) -> dict[str, object]:
    rng = random.Random(i)
    words = ["the", "answer", "is", "step", "reason", "compute", "total", "so", "we", "get"]
    text = " ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(7000))
    return {"id": i, "reward": rng.random(), "completion": text[:50_000]}


def _append_cost(payloads: list[bytes], kind: EntryKind, durability: str) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.create(
            Path(tmp), durability="fsync" if durability == "fsync" else "process"
        )
        try:
            out = []
            for payload in payloads:
                t0 = time.perf_counter_ns()
                journal.append(kind, [payload])
                out.append((time.perf_counter_ns() - t0) / 1000)
            return out
        finally:
            journal.close()


def bench_appends() -> list[tuple[str, str, float, float, float, float]]:
    rows = []
    workloads: tuple[tuple[str, Callable[[int], dict[str, object]], EntryKind, int], ...] = (
        ("metrics row (10 scalars)", metrics_row, EntryKind.METRICS, 3000),
        ("episode (50 KB)", episode_50k, EntryKind.EPISODE, 400),
    )
    for label, make, kind, n in workloads:
        records = [make(i) for i in range(n)]
        dumps = []
        for r in records:
            t0 = time.perf_counter_ns()
            json.dumps(r)
            dumps.append((time.perf_counter_ns() - t0) / 1000)
        j50, _ = _pcts(dumps)
        payloads = [json.dumps(r).encode() for r in records]
        for durability in ("process", "fsync"):
            m = n if durability == "process" else min(n, 300)
            p50, p99 = _pcts(_append_cost(payloads[:m], kind, durability))
            rows.append((label, durability, p50, p99, p50 / j50, j50))
    return rows


def _journal_ratio(lines: list[bytes], kind: EntryKind, *, train: bool) -> tuple[int, int]:
    """Raw bytes and journal file bytes for ``lines``, appended one per call,
    once the journal is closed: entries are spooled as they are appended and
    compressed into LMDB by the mover (its thread, or ``close()``), which
    trains the dictionary on the first batch it compresses; so a journal at
    rest is what a user keeps (measured while open, the spool's uncompressed
    frames made it ~1.0 bytes a raw byte). ``train=False``: as if no
    dictionary ever paid (``dictionary.train`` finds none)."""
    with tempfile.TemporaryDirectory() as tmp:
        with contextlib.ExitStack() as stack:
            if not train:
                stack.enter_context(mock.patch.object(dictionary, "train", lambda samples: None))
            journal = stack.enter_context(Journal.create(Path(tmp), local_id="r"))
            for line in lines:
                journal.append(kind, [line])
        # What ``size_bytes`` counts: the data file and the spool (empty at rest).
        at_rest = (journal.path / DATA_NAME).stat().st_size + spool_bytes(journal.path)
        return sum(len(x) for x in lines), at_rest


def bench_disk() -> list[tuple[str, int, int, int]]:
    """(workload, raw bytes, journal bytes without / with a trained dictionary)."""
    rows = []
    for name in ("gsm8k-eval.jsonl.zst", "agentic-train.jsonl.zst"):
        path = DATA / name
        if not path.exists():
            print(f"(skipping {name}: not found under {DATA})")
            continue
        with open(path, "rb") as f:
            lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()
        total, plain = _journal_ratio(lines, EntryKind.EPISODE, train=False)
        _, trained = _journal_ratio(lines, EntryKind.EPISODE, train=True)
        rows.append((name, total, plain, trained))
    metrics = [json.dumps({"run": "r", **metrics_row(i)}).encode() for i in range(20_000)]
    total, plain = _journal_ratio(metrics, EntryKind.METRICS, train=False)
    _, trained = _journal_ratio(metrics, EntryKind.METRICS, train=True)
    rows.append(("metrics rows (20,000)", total, plain, trained))
    return rows


def main() -> None:
    print("append cost per record (µs); ratio = append p50 / json.dumps p50 of the same record")
    print(f"{'record':26} {'durability':10} {'p50':>9} {'p99':>9} {'ratio':>7} {'dumps p50':>10}")
    for label, dur, p50, p99, ratio, j50 in bench_appends():
        print(f"{label:26} {dur:10} {p50:9.1f} {p99:9.1f} {ratio:7.2f} {j50:10.1f}")
    print()
    print("journal file bytes per raw JSON byte (budget <= 0.25), plain / with trained dictionary")
    print(f"{'workload':26} {'raw MB':>9} {'plain':>9} {'dict':>9}")
    for name, total, plain, trained in bench_disk():
        print(f"{name:26} {total / 1e6:9.2f} {plain / total:9.3f} {trained / total:9.3f}")


if __name__ == "__main__":
    main()
