"""Profile the hot path and shipping: where a ``log_*`` call and a replay spend time.

Run ``python tools/bench/profile_paths.py`` (``--quick`` for fewer records)
from the repository root; needs ``pip install pyinstrument`` (a local tool, not
a project dependency). Two parts:

1. a component breakdown of one call, p50 µs each, timed in isolation:
   ``json.dumps`` (the reference), ``clean_metrics``, ``encode_record``,
   ``encode_frame`` (zstd + CRC) with and without the trained dictionary, and
   ``Journal.append`` (frame + LMDB transaction);
2. a pyinstrument profile of shipping's CPU work on a backlog journal: the
   journal reads and each eval sink's batch building (``profile_shipping``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Table

from primeruns import records
from primeruns.journal import EntryKind, Journal
from primeruns.journal.frames import encode_frame


def _p50(fn: Callable[[Any], object], items: Sequence[Any]) -> float:
    out = []
    for item in items:
        t0 = time.perf_counter_ns()
        fn(item)
        out.append(time.perf_counter_ns() - t0)
    return statistics.median(out) / 1000


def breakdown(quick: bool) -> Table:
    n = 500 if quick else 2000
    rows = [benchlib.metrics_row(i) for i in range(n * 2)]
    episodes = benchlib.records("gsm8k-eval", n)
    table = Table(
        "Hot path breakdown (p50 µs per record, each step timed alone)",
        ["step", "metrics row", "÷ dumps", "gsm8k episode", "÷ dumps"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.create(Path(tmp))
        try:
            m_pl = [records.encode_record(r) for r in rows]
            e_pl = [records.encode_record(e) for e in episodes]
            ref_m, ref_e = _p50(json.dumps, rows), _p50(json.dumps, episodes)
            steps: list[tuple[str, float, float]] = [
                ("json.dumps (reference)", ref_m, ref_e),
                ("records.clean_metrics", _p50(records.clean_metrics, rows), float("nan")),
                (
                    "records.encode_record",
                    _p50(records.encode_record, rows),
                    _p50(records.encode_record, episodes),
                ),
                (
                    "encode_frame, no dictionary",
                    _p50(lambda p: encode_frame(int(EntryKind.METRICS), p), m_pl),
                    _p50(lambda p: encode_frame(int(EntryKind.EPISODE), p), e_pl),
                ),
                (
                    "Journal.append, no dictionary",
                    _p50(lambda p: journal.append(EntryKind.METRICS, [p]), m_pl[:n]),
                    _p50(lambda p: journal.append(EntryKind.EPISODE, [p]), e_pl),
                ),
            ]
            journal.train_dictionaries()
            steps.append(
                (
                    "Journal.append, trained dictionary",
                    _p50(lambda p: journal.append(EntryKind.METRICS, [p]), m_pl[n:]),
                    _p50(lambda p: journal.append(EntryKind.EPISODE, [p]), e_pl),
                )
            )
        finally:
            journal.close()
    for label, m, e in steps:
        table.add(label, f"{m:.2f}", f"{m / ref_m:.2f}", f"{e:.2f}", f"{e / ref_e:.2f}")
    return table


def profile_shipping(quick: bool) -> str:
    """pyinstrument over what the shipper threads do per batch, minus the HTTP:
    read the journal after a cursor, then each eval sink's ``prepare``. (A
    sampling profiler sees only the thread that runs it, so the work is run
    here, in the main thread, on a backlog journal.)"""
    from typing import cast

    from backlog import make_backlog
    from pyinstrument import Profiler

    from primeruns.platform import PlatformClient
    from primeruns.sinks.base import Binding
    from primeruns.sinks.eval_samples import EvalSamplesSink
    from primeruns.sinks.traces import TracesSink

    binding = Binding(run_id="bench-run", kind="eval")
    client = cast(PlatformClient, object())  # prepare() never calls the client
    with benchlib.isolated_env(None) as scratch:
        backlog = make_backlog(scratch, 1000 if quick else 5000)
        journal = Journal.open(backlog.journal, owner=False)
        try:
            profiler = Profiler(interval=0.0005)
            profiler.start()
            for sink in (TracesSink(client, context={"source": "bench"}), EvalSamplesSink(client)):
                after = 0
                while True:
                    got = journal.read(
                        after,
                        kinds=sink.kinds,
                        max_entries=sink.max_entries,
                        max_bytes=sink.max_bytes,
                    )
                    if not got.entries:
                        break
                    prepared = sink.prepare(got.entries, binding)
                    restore = getattr(sink, "restore", None)
                    if prepared is not None and prepared.carry is not None and restore:
                        restore(prepared.carry)  # as the shipper does once it is recorded
                    # A sink that used only a prefix names the last entry it took.
                    last = prepared.last_seq if prepared is not None else None
                    after = got.next_after if last is None else last
            profiler.stop()
        finally:
            journal.close()
    return str(profiler.output_text(unicode=False, color=False))


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables([breakdown(args.quick)])
    print()
    print(profile_shipping(args.quick))


if __name__ == "__main__":
    main()
