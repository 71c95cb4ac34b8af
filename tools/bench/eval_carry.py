"""The evaluation sample table's rollout numbering: what preparing and
recording one batch costs as the evaluation's distinct examples grow.

Run ``python tools/bench/eval_carry.py`` (``--quick``: 1k and 5k examples)
from the repository root. Each size is an evaluation of that many distinct
examples with several rollouts each, shipped through the eval samples sink
and the shipper's recording of each batch (``Shipper._record``: the batch,
its carried numbering, the journal's meta) into a real journal, each batch
acknowledged as a successful send would (no request is made: the cost of
the numbering is what is measured, and the platform's is not). Rows are made
once, outside the timing (``rows=``): the projection costs the same at any
size.

Two orders: each example's rollouts one after the other (an evaluation's
usual order: an example's rollouts run together), and the rollouts of past
examples in random order (the worst case for a numbering kept in chunks).
Figures: CPU ms per batch (this process's: a shared machine's other load
is not counted), the median over the last batches, when the numbering is
largest; the ratio is the largest size's to the smallest's (flat: <= ~1.2).

``--startup``: what the next process's shipper pays to read the numbering
back (CPU ms of making it: every part saved, read and restored), after an
evaluation whose dataset was repeated once per rollout (round-robin: each
pass moves every example on), by rollouts per example; and the pairs saved.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchlib
from benchlib import Table

from primeruns.journal import Entry, EntryKind, Journal
from primeruns.platform.binding import Binding
from primeruns.projection import SampleRows, sample_rows
from primeruns.ship.policy import RetryPolicy
from primeruns.ship.shipper import Shipper
from primeruns.sinks.eval_samples import EvalSamplesSink

_BOUND = Binding(run_id="eval-bench", kind="eval")
_ROLLOUTS = 2  # rollouts per example
_TIMED = 50  # batches timed at the end of each evaluation


def _template() -> SampleRows:
    """One real episode's rows, renumbered under other keys for every entry."""
    record = benchlib.records("gsm8k-eval", 1)[0]
    rows = sample_rows(record)
    assert rows is not None and rows.numbered
    return rows


def _shipper(journal: Journal, rows: dict[int, SampleRows]) -> Shipper:
    sink = EvalSamplesSink(None, rows=lambda entry, _binding: rows[entry.seq])  # type: ignore[arg-type]
    return Shipper(
        journal,
        sink,
        binding=lambda: _BOUND,
        training=False,
        policy=RetryPolicy(),
        on_failure=lambda *_: None,
    )


def _ship(
    shipper: Shipper,
    rows: dict[int, SampleRows],
    keys: Sequence[Any],
    first_seq: int,
    template: SampleRows,
) -> list[float]:
    """Prepare, record and acknowledge batches of ``keys`` (one entry each,
    its rows put in ``rows``, which the sink reads); each batch's seconds."""
    times = []
    seq = first_seq
    size = shipper.sink.max_entries
    for start in range(0, len(keys), size):
        chunk = keys[start : start + size]
        entries = []
        for key in chunk:
            rows[seq] = template._replace(key=key, sample_ids=(f"s{seq}",))
            entries.append(Entry(seq, EntryKind.EPISODE, b"{}"))
            seq += 1
        # In the journal, for the acknowledgement (the sink reads ``rows``).
        shipper.journal.append(EntryKind.EPISODE, [e.payload for e in entries])
        t0 = time.process_time()
        prepared = shipper.sink.prepare(entries, _BOUND)
        assert prepared is not None
        inflight = shipper._record(prepared, entries[0].seq, entries[-1].seq, entries[-1].seq)
        shipper.journal.ack(shipper.name, inflight.last_seq)
        times.append(time.process_time() - t0)
        for entry in entries:
            del rows[entry.seq]
    return times


def measure(examples: int, order: str, template: SampleRows) -> float:
    """ms per batch over the last ``_TIMED`` batches of an evaluation of
    ``examples`` distinct examples."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.create(Path(tmp) / "runs")
        try:
            rows: dict[int, SampleRows] = {}
            shipper = _shipper(journal, rows)
            if order == "together":
                keys = [i for i in range(examples) for _ in range(_ROLLOUTS)]
                times = _ship(shipper, rows, keys, 1, template)
            else:
                keys = list(range(examples))
                _ship(shipper, rows, keys, 1, template)
                rng = random.Random(7)
                repeats = [rng.randrange(examples) for _ in range(_TIMED * 256)]
                times = _ship(shipper, rows, repeats, examples + 1, template)
        finally:
            journal.close()
    return statistics.median(times[-_TIMED:]) * 1000


def startup(examples: int, rollouts: int, template: SampleRows) -> tuple[float, int]:
    """CPU ms of a new process's shipper reading the numbering of
    ``examples`` examples shipped round-robin ``rollouts`` times (the median
    of 5 openings), and the pairs its parts hold."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Journal.create(Path(tmp) / "runs")
        path = journal.path
        rows: dict[int, SampleRows] = {}
        try:
            keys = [i for _ in range(rollouts) for i in range(examples)]
            _ship(_shipper(journal, rows), rows, keys, 1, template)
        finally:
            journal.close()
        times = []
        for _ in range(5):
            journal = Journal.open(path, owner=True)
            try:
                t0 = time.process_time()
                shipper = _shipper(journal, rows)
                times.append(time.process_time() - t0)
                prefix = f"carry.{shipper.name}.rollouts."
                pairs = sum(
                    len(v)
                    for k, v in journal.all_meta().items()
                    if k.startswith(prefix) and isinstance(v, list)
                )
            finally:
                journal.close()
    return statistics.median(times) * 1000, pairs


def run_startup(examples: int) -> list[Table]:
    template = _template()
    table = Table(
        f"Eval samples: a new shipper reading the numbering of {examples:,} examples, round-robin",
        ["rollouts per example", "start-up (CPU ms)", "pairs saved"],
    )
    for rollouts in (1, 4):
        ms, pairs = startup(examples, rollouts, template)
        table.add(str(rollouts), f"{ms:.0f}", f"{pairs:,}")
    table.notes = ["median of 5 openings of the journal; batches of 256 entries"]
    return [table]


def run(quick: bool, sizes: Sequence[int] | None = None) -> list[Table]:
    if not sizes:
        sizes = (1_000, 5_000) if quick else (1_000, 10_000, 50_000)
    template = _template()
    table = Table(
        "Eval samples: prepare + record one batch, by distinct examples",
        ["order", *[f"{n:,} examples (CPU ms/batch)" for n in sizes], "ratio largest/smallest"],
    )
    for order in ("together", "random"):
        figures = [measure(n, order, template) for n in sizes]
        table.add(order, *[f"{ms:.2f}" for ms in figures], f"{figures[-1] / figures[0]:.2f}")
    table.notes = [
        f"{_ROLLOUTS} rollouts per example; batches of 256 entries; median of the last "
        f"{_TIMED} batches; 'random': rollouts of past examples in random order",
        "flat: ratio <= ~1.2",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 5k examples")
    parser.add_argument(
        "--sizes", default="", help="comma-separated distinct examples (default 1000,10000,50000)"
    )
    parser.add_argument(
        "--startup",
        action="store_true",
        help="a new shipper's reading of the numbering (the largest size; 50,000 by default)",
    )
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",") if n.strip()]
    if args.startup:
        benchlib.print_tables(run_startup(sizes[-1] if sizes else 50_000))
    else:
        benchlib.print_tables(run(args.quick, sizes))


if __name__ == "__main__":
    main()
