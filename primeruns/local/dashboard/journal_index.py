"""What the offline dashboard keeps of one journal: where its records are, not the records.

A page of a run used to read every record of it, project every episode and
keep the lot for four runs: 1.17 GB and 12 s for the first page of an honest
20,000-episode run, and gigabytes for a journal a few hundred KB on disk that
declares gigabytes once decoded. An index holds what a page needs to find
its records and no more: the seq and declared size of each episode (read from
entry headers alone, nothing decompressed), a training episode's step (read
once), the metric rows reduced to the numbers the charts draw, and the seq of
the last summary. A page then decodes only its own records, one at a time,
each bounded (``jsonbound``). The index grows with the journal (a live run's
new entries are read on the next page, not the whole journal again).

Every quantity it keeps is bounded as well: metric values, metric names and
damage notes beyond their caps are counted and said, never kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import jsonbound
from ...exceptions import JournalError
from ...journal import EntryKind, Journal
from ...records import training_step
from .metric_rows import MetricRows
from .views import SampleRow

#: The largest entry a page decodes; one declaring more is shown as a marker.
MAX_ENTRY_BYTES = 16 << 20
#: The largest metric row or summary decoded.
MAX_SMALL_BYTES = 1 << 20
#: Bytes of payload one read copies out (at least one entry).
READ_BYTES = 16 << 20
#: Bytes of payload one read of a run's episodes in order copies out (at least one entry).
BATCH_BYTES = 4 << 20
#: Damage notes kept per journal (the rest are counted).
MAX_NOTES = 50
#: What one kept value costs, roughly, for the cache's accounting.
_VALUE_COST = 100
#: A sample's row (:class:`SampleRow`, texts compacted) in kept values.
_FACT_VALUES = 7


#: Entries to read past which a journal's metric rows are counted first
#: (``JournalIndex.update``): fewer cannot reach the charts' bound.
_COUNTED_FROM = 1_000


def too_large(seq: int, size: int) -> str:
    return jsonbound.marker(f"entry {seq} declares {size} bytes, over what a page decodes")


@dataclass
class JournalIndex:
    """Where one journal's records are; ``update`` reads what was appended since."""

    training: bool
    upto: int = 0
    #: Each episode's (seq, declared bytes), in journal order.
    episodes: list[tuple[int, int]] = field(default_factory=list)
    #: A training run's episode seqs by step.
    steps: dict[int, list[int]] = field(default_factory=dict)
    #: Metric rows as the charts read them: ``step`` and numeric values only.
    charted: MetricRows = field(default_factory=MetricRows)
    summary_seq: int = 0
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    notes_more: int = 0
    #: Each episode's row of an evaluation's samples table, in order, as far
    #: as a page asked (filled by the source: ``JournalSource.sample_facts``).
    facts: list[SampleRow] = field(default_factory=list)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        return self.charted.rows

    @property
    def cost(self) -> int:
        """Roughly what it holds, in bytes (the source's cache is bounded by it)."""
        return _VALUE_COST * (
            self.charted.values
            + len(self.metrics)
            + 2 * len(self.episodes)
            + len(self.notes)
            + _FACT_VALUES * len(self.facts)
            + 1
        )

    def note(self, what: str) -> None:
        if what in self.notes:
            # Met again: the passes for episodes and metric rows go over the
            # same headers, and each reports what it cannot read (a run's
            # page listed that damage twice). A note names its entries.
            return
        if len(self.notes) < MAX_NOTES:
            self.notes.append(what)
        else:
            self.notes_more += 1

    def damage_notes(self) -> list[str]:
        more = [f"{self.notes_more} more notes"] if self.notes_more else []
        return self.notes + more

    def update(self, journal: Journal) -> None:
        """Read the entries appended after ``upto``."""
        start = self.upto
        end = journal.last_seq()
        if end <= start:
            return
        # Evaluations: episodes by header alone; training: each read once for its step.
        for seq, size, record in _scan(
            journal, start, end, EntryKind.EPISODE, MAX_ENTRY_BYTES if self.training else 0, self
        ):
            self.episodes.append((seq, size))
            if self.training:
                if size > MAX_ENTRY_BYTES:
                    self.note(too_large(seq, size) + ": its step is not known")
                step = training_step(record) if isinstance(record, dict) else None
                if step is not None:
                    self.steps.setdefault(step, []).append(seq)
        # The range's entries by kind, from their headers (~3 µs an entry):
        # a pass that can find nothing is not made. An evaluation has no
        # metric rows and often no summary entry, and those two passes over
        # every header were a third of its first page (each damaged header
        # was noted twice: the passes meet the same ones).
        held = None  # uncounted: every pass is made
        with contextlib.suppress(JournalError):
            held = journal.tally_range(start, end)
        charted = self.charted
        if held is not None and not charted.width and end - start > _COUNTED_FROM:
            # The rows to come counted, as the platform counts them: the
            # first thinning then picks the width they all need, and the
            # rows after it go as columns (``MetricRows.extend``). Thinned
            # again at each doubling of the width, a 100,000-step run of 20
            # metrics took 10-13 s to index.
            charted.expected_rows = charted.offered_rows + held[EntryKind.METRICS]
        if held is None or held[EntryKind.METRICS]:
            charted.extend(
                record
                for _, _, record in _scan(
                    journal, start, end, EntryKind.METRICS, MAX_SMALL_BYTES, self
                )
                if isinstance(record, dict)
            )
        # Of the summaries the last one alone is shown: read from the log's
        # end (a run that updated it each step wrote one per step).
        if held is None or held[EntryKind.SUMMARY]:
            found = _last_summary(journal, start, self)
            if found is not None:
                self.summary_seq, self.summary = found
        self.upto = end


def _last_summary(
    journal: Journal, after: int, index: JournalIndex
) -> tuple[int, dict[str, Any]] | None:
    """(seq, what a page shows) of the last intact summary entry after
    ``after``, None where there is none: a damaged one is noted and passed
    over, the one before it stands (as the close-out of a crash takes it)."""
    for seq, _, size in journal.newest((EntryKind.SUMMARY,), after=after):
        if size > MAX_SMALL_BYTES:
            return seq, {jsonbound.MARK: f"{too_large(seq, size)}]"}
        # Decoded within the bound; damage is found here, not by the header.
        read = journal.read(
            seq - 1,
            kinds={EntryKind.SUMMARY},
            max_entries=1,
            max_bytes=MAX_SMALL_BYTES,
            max_entry_bytes=MAX_SMALL_BYTES,
        )
        for damage in read.damaged:
            index.note(damage.what)
        entry = next((e for e in read.entries if e.seq == seq), None)
        if entry is None:
            continue
        why = ""
        try:
            record = jsonbound.loads(entry.payload, MAX_SMALL_BYTES)
        except ValueError as exc:
            record, why = None, jsonbound.marker(f"entry {seq} is not shown: {exc}")
        if isinstance(record, dict):
            return seq, dict(jsonbound.clip(record))
        return seq, {jsonbound.MARK: f"{why}]"}
    return None


def _scan(
    journal: Journal,
    after: int,
    upto: int,
    kind: EntryKind,
    max_entry_bytes: int,
    index: JournalIndex,
) -> Iterator[tuple[int, int, Any]]:
    """(seq, declared bytes, decoded value or None) of every ``kind`` entry in
    ``(after, upto]``; entries over ``max_entry_bytes`` (every one, with 0) are
    not decoded. Those a live run appended past ``upto`` are left to the next
    update, which starts there: read now as well, each was read twice (a
    step's metric rows charted twice, its episodes listed twice)."""
    while after < upto:
        result = journal.read(
            after,
            kinds={kind},
            max_entries=1000,
            max_bytes=READ_BYTES,
            max_entry_bytes=max_entry_bytes,
        )
        for damage in result.damaged:
            index.note(damage.what)
        decoded = {entry.seq: entry for entry in result.entries}
        found = sorted(
            [(e.seq, len(e.payload)) for e in result.entries]
            + [(seq, size) for seq, _, size in result.oversized]
        )
        for seq, size in found:
            if seq > upto:
                return
            entry = decoded.pop(seq, None)
            value = None
            if entry is not None:
                try:
                    value = jsonbound.loads(entry.payload, max(max_entry_bytes, 1))
                except ValueError as exc:
                    index.note(f"entry {seq}: {exc}")
            yield seq, size, value
        if result.next_after <= after:
            return
        after = result.next_after


def read_records(
    journal: Journal, wanted: Iterable[tuple[int, int]], kind: EntryKind, max_bytes: int
) -> Iterator[tuple[int, Any, str]]:
    """Each wanted (seq, declared size) entry of ``kind`` decoded, in order, one
    at a time: (seq, value or None, why it is None). The caller keeps what it
    shows of each, never the batch."""
    for seq, size in wanted:
        if size > max_bytes:
            yield seq, None, too_large(seq, size)
            continue
        result = journal.read(
            seq - 1, kinds={kind}, max_entries=1, max_bytes=max_bytes, max_entry_bytes=max_bytes
        )
        entry = result.entries[0] if result.entries and result.entries[0].seq == seq else None
        if entry is None:
            yield seq, None, jsonbound.marker(f"entry {seq} is no longer in the journal")
            continue
        try:
            yield seq, jsonbound.loads(entry.payload, max_bytes), ""
        except ValueError as exc:
            yield seq, None, jsonbound.marker(f"entry {seq} is not shown: {exc}")


def payloads_in_order(
    journal: Journal, wanted: Sequence[tuple[int, int]], kind: EntryKind, max_bytes: int
) -> Iterator[tuple[int, bytes | None, str]]:
    """Each wanted (seq, declared size) entry of ``kind``'s payload, in journal
    order (a run's episodes, to read them all): (seq, payload or None, why it
    is None). Up to ``BATCH_BYTES`` of payload a read rather than one entry: a
    20,000-episode run's entries read one a read spent half the time of its
    analysis in the reads."""
    i = 0
    while i < len(wanted):
        seq, size = wanted[i]
        if size > max_bytes:
            yield seq, None, too_large(seq, size)
            i += 1
            continue
        result = journal.read(
            seq - 1,
            kinds={kind},
            max_entries=1000,
            max_bytes=BATCH_BYTES,
            max_entry_bytes=max_bytes,
        )
        batch = {entry.seq: entry for entry in result.entries}
        last = max(batch, default=seq)  # at least this one is answered for
        while i < len(wanted) and wanted[i][0] <= last:
            seq, size = wanted[i]
            i += 1
            entry = batch.pop(seq, None)
            if size > max_bytes:
                yield seq, None, too_large(seq, size)
            elif entry is None:
                yield seq, None, jsonbound.marker(f"entry {seq} is no longer in the journal")
            else:
                yield seq, entry.payload, ""


def decoded(seq: int, payload: bytes | None, why: str, max_bytes: int) -> tuple[Any, str]:
    """The value of a payload ``payloads_in_order`` read, or None and why."""
    if payload is None:
        return None, why
    try:
        return jsonbound.loads(payload, max_bytes), ""
    except ValueError as exc:
        return None, jsonbound.marker(f"entry {seq} is not shown: {exc}")
