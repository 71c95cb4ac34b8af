"""Measure the journal: append cost per record and bytes on disk per raw byte.

Run ``python tools/bench/journal_bench.py`` from the repository root. It prints:

- append cost per record (p50/p99 µs) for a 10-scalar metrics row and a 50 KB
  episode in both durability modes, each also as a ratio to ``json.dumps`` of
  the same record measured in the same run (the DESIGN budgets are ratios);
- journal bytes on disk per raw JSON byte for the workloads in
  ``../shared/data`` (budget ≤ 0.25), and for metrics rows with and without a
  trained zstd dictionary (to decide whether a dictionary pays).

Timings belong here, not in tests. Numbers vary by machine; compare ratios.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from primeruns.journal import EntryKind, Journal  # noqa: E402

DATA = ROOT / ".." / "shared" / "data"


def _pcts(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def _time_each(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def metrics_row(i: int) -> dict[str, float]:
    rng = random.Random(i)
    names = ["loss", "reward", "kl", "entropy", "lr", "grad_norm", "tokens", "step", "acc", "len"]
    return {k: rng.random() * 10 for k in names}


def episode_50k(i: int) -> dict[str, object]:
    rng = random.Random(i)
    words = ["the", "answer", "is", "step", "reason", "compute", "total", "so", "we", "get"]
    text = " ".join(rng.choice(words) + str(rng.randint(0, 99)) for _ in range(7000))
    return {"id": i, "reward": rng.random(), "completion": text[:50_000]}


def bench_appends() -> list[tuple[str, str, float, float, float, float]]:
    rows = []
    for label, make, n in (("metrics row (10 scalars)", metrics_row, 3000),
                           ("episode (50 KB)", episode_50k, 400)):
        records = [make(i) for i in range(n)]
        jd = [0.0] * 0
        it = iter(records * 2)
        jd = _time_each(lambda: json.dumps(next(it)), n)
        j50, _ = _pcts(jd)
        for durability in ("process", "fsync"):
            m = n if durability == "process" else min(n, 300)
            with tempfile.TemporaryDirectory() as tmp, Journal.create(
                    Path(tmp), durability=durability) as journal:  # type: ignore[arg-type]
                encoded = [json.dumps(r).encode() for r in records[:m]]
                it2 = iter(encoded)
                samples = _time_each(lambda: journal.append(EntryKind.METRICS, [next(it2)]), m)
            p50, p99 = _pcts(samples)
            rows.append((label, durability, p50, p99, p50 / j50, j50))
    return rows


def _journal_ratio(lines: list[bytes], kind: EntryKind) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        with Journal.create(Path(tmp), local_id="r") as journal:
            for line in lines:
                journal.append(kind, [line])
            used = journal.size_bytes()
    return sum(len(x) for x in lines), used


def bench_disk() -> list[tuple[str, int, int, int]]:
    rows = []
    for name in ("gsm8k-eval.jsonl.zst", "agentic-train.jsonl.zst"):
        path = DATA / name
        if not path.exists():
            print(f"(skipping {name}: not found under {DATA})")
            continue
        with open(path, "rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f).read()
        lines = raw.splitlines()
        total, used = _journal_ratio(lines, EntryKind.EPISODE)
        frames = sum(len(zstandard.ZstdCompressor(level=1).compress(x)) + 12 for x in lines)
        rows.append((name, total, used, frames))
    return rows


def bench_dictionary() -> tuple[float, float, float]:
    rows = [json.dumps({"run": "r", **metrics_row(i)}).encode() for i in range(5000)]
    raw = sum(map(len, rows))
    plain = sum(len(zstandard.ZstdCompressor(level=1).compress(r)) for r in rows)
    d = zstandard.train_dictionary(16 << 10, rows[:1000])
    cctx = zstandard.ZstdCompressor(level=1, dict_data=d)
    with_dict = sum(len(cctx.compress(r)) for r in rows[1000:]) * 5000 / 4000
    return raw / len(rows), plain / raw, with_dict / raw


def main() -> None:
    print("append cost per record (µs), ratio = p50 / p50 of json.dumps of the same record")
    print(f"{'record':26} {'durability':10} {'p50':>9} {'p99':>9} {'ratio':>7} {'dumps p50':>10}")
    for label, dur, p50, p99, ratio, j50 in bench_appends():
        print(f"{label:26} {dur:10} {p50:9.1f} {p99:9.1f} {ratio:7.2f} {j50:10.1f}")
    print()
    print("journal bytes on disk per raw JSON byte (budget <= 0.25)")
    print(f"{'workload':26} {'raw MB':>9} {'disk MB':>9} {'disk/raw':>9} {'frames/raw':>11}")
    for name, total, used, frames in bench_disk():
        print(f"{name:26} {total / 1e6:9.1f} {used / 1e6:9.1f} {used / total:9.3f} "
              f"{frames / total:11.3f}")
    print()
    size, plain, with_dict = bench_dictionary()
    print(f"metrics row ({size:.0f} B): zstd alone {plain:.3f} of raw, "
          f"with a 16 KB trained dictionary {with_dict:.3f} of raw")


if __name__ == "__main__":
    main()
