"""A run's journal in this process's memory, for when no folder takes one.

The journal is how a run reaches the platform: the shippers read it after
their acknowledged offsets and the producer reads the uplink's reports from
its meta. When neither the runs directory nor any fallback folder can be
written (a read-only home, a read-only or full temporary directory, no
``/dev/shm``), the vendor's SDK still ships the run, keeping its records in
memory; so does this SDK, through :class:`MemoryJournal`: the same interface
as :class:`~primeruns.journal.Journal`, its entries, cursors and meta kept in
dicts, shipped by the uplink's threads in this process (a process of its own
could not read it).

What that costs: nothing outlives the process. Entries are kept until every
sink acknowledged them (then dropped, as compaction drops them from a journal
on disk, the run's spec, finish and last summary kept), so memory holds the backlog, not
the run; the byte budget bounds it, and appends past it are dropped and
counted, as on disk. What is not shipped when the run finishes is counted as
lost (``ledger`` of the close-out; ``closing``), since no ``primeruns
replay`` can reach it.
"""

from __future__ import annotations

import json
import os
import threading
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..exceptions import FINISHED_WHILE_LOGGING, JournalError, RunFinishedError
from . import in_memory
from .frames import HEADER_SIZE, MAX_ENTRY_BYTES, EntryKind
from .journal import default_local_id
from .layout import dumps
from .meta import UNLISTED_PREFIXES
from .types import AppendResult, CursorState, Damage, Entry, InFlight, ReadResult

__all__ = ["MemoryJournal", "in_memory"]

_KEPT = frozenset({EntryKind.RUN_OPEN, EntryKind.SUMMARY, EntryKind.FINISH})
_MAX_REASONS = 5


class MemoryJournal:
    """A journal held in memory. Thread-safe; used by this process only.

    ``path`` names no folder (``<memory>/<local id>``) and nothing is ever
    written there: it is for messages. ``in_memory`` tells it from a journal
    on disk.
    """

    in_memory = True

    def __init__(
        self,
        *,
        local_id: str | None = None,
        max_bytes: int,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.local_id = local_id or default_local_id()
        self.path = Path("<memory>") / self.local_id
        self.durability = "memory"
        self.max_bytes = max_bytes
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._seqs: list[int] = []  # ascending, of the entries still held
        self._entries: dict[int, Entry] = {}
        self._bytes = 0
        self._last = 0
        self._finished = False
        self._closed = False
        self._meta: dict[str, bytes] = {}
        self._cursors: dict[str, CursorState] = {}
        self._losses: dict[str, dict[str, Any]] = {}
        self._compacted: Counter[int] = Counter()
        self._swept = 0  # every entry up to it was forgotten, but the lifecycle's
        self._summary = 0  # the summary entry kept at or before ``_swept`` (0: none)
        self._sinks: frozenset[str] = frozenset()
        self._woken = 0
        if meta:
            self.update_meta(meta)

    # -- checks -------------------------------------------------------------------------
    def _check(self) -> None:
        if os.getpid() != self._pid:
            raise JournalError(
                f"the in-memory journal of run {self.local_id} belongs to process {self._pid}"
            )
        if self._closed:
            raise JournalError(f"journal {self.path} is closed")

    # -- meta: JSON values, stored encoded so that no caller shares one -----------------
    def get_meta(self, key: str, default: Any = None) -> Any:
        self._check()
        with self._cond:
            raw = self._meta.get(key)
        return default if raw is None else json.loads(raw)

    def get_metas(self, keys: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
        self._check()
        with self._cond:
            found = {key: raw for key in keys if (raw := self._meta.get(key)) is not None}
        return {key: json.loads(raw) for key, raw in found.items()}, []

    def all_meta(
        self, max_value_bytes: int | None = None, shape: Callable[[Any], Any] | None = None
    ) -> dict[str, Any]:
        self._check()
        with self._cond:
            items = list(self._meta.items())
        out: dict[str, Any] = {}
        for key, raw in items:
            if max_value_bytes is not None and (
                len(raw) > max_value_bytes or key.startswith(UNLISTED_PREFIXES)
            ):
                continue
            value = json.loads(raw)
            out[key] = shape(value) if shape is not None else value
        return out

    def set_meta(self, key: str, value: Any) -> None:
        self.update_meta({key: value})

    def update_meta(self, values: Mapping[str, Any], drop: Iterable[str] = ()) -> None:
        encoded = {k: dumps(v) for k, v in values.items()}  # fail on bad JSON first
        with self._cond:
            self._meta.update(encoded)
            for key in drop:
                self._meta.pop(key, None)

    def push_meta(self, key: str, item: Any, *, cap: int) -> None:
        encoded = json.loads(dumps(item))
        with self._cond:
            current = json.loads(self._meta.get(key, b"[]"))
            items = current if isinstance(current, list) else []
            if len(items) < cap:
                self._meta[key] = dumps([*items, encoded])
            else:
                more = json.loads(self._meta.get(f"{key}#more", b"0"))
                self._meta[f"{key}#more"] = dumps(int(more or 0) + 1)

    # -- appending and waiting ------------------------------------------------------------
    def append(
        self,
        kind: EntryKind,
        payloads: Sequence[bytes],
        *,
        essential: bool = False,
        final: bool = False,
    ) -> AppendResult:
        self._check()
        if not payloads:
            return AppendResult(None, 0, 0)
        if any(len(p) > MAX_ENTRY_BYTES for p in payloads):
            raise ValueError(f"an entry is over the per-entry limit of {MAX_ENTRY_BYTES} bytes")
        size = sum(map(len, payloads)) + HEADER_SIZE * len(payloads)
        with self._cond:
            if self._finished:
                raise RunFinishedError(FINISHED_WHILE_LOGGING)
            if not essential and self._bytes + size > self.max_bytes:
                self._add_loss("journal", len(payloads), "journal byte budget reached (in memory)")
                return AppendResult(None, 0, len(payloads))
            # After the entries held too: an append cut before it set
            # ``_last`` (Ctrl-C's KeyboardInterrupt) holds its seqs, whole.
            seqs = self._seqs
            first = max(self._last, seqs[-1] if seqs else 0) + 1
            made = [Entry(seq, EntryKind(kind), bytes(p)) for seq, p in enumerate(payloads, first)]
            self._entries.update([(entry.seq, entry) for entry in made])
            seqs.extend([entry.seq for entry in made])  # one call: all of them or none
            self._last = first + len(payloads) - 1
            self._bytes += size
            self._finished = final
            self._cond.notify_all()
        return AppendResult(first, len(payloads), 0)

    def watch_held(self) -> None:
        """Nothing is held for a full disk here (``Journal.watch_held``): None."""
        return None

    def settle_held(self, within: float, room_may_come: Callable[[], bool] | None = None) -> int:
        """Nothing is held for a full disk here (``Journal.settle_held``): 0."""
        return 0

    def held_lost(self) -> int:
        return 0

    def last_seq(self) -> int:
        self._check()
        return self._last

    def wait_for_append(
        self,
        after_seq: int,
        timeout: float | None,
        until: Callable[[], bool] | None = None,
    ) -> bool:
        self._check()
        with self._cond:
            woken = self._woken
            self._cond.wait_for(
                lambda: (
                    self._last > after_seq
                    or self._woken != woken
                    or self._closed
                    or (until is not None and until())
                ),
                timeout=timeout,
            )
            return self._last > after_seq

    def wake_all(self, *, hurry: bool = False) -> None:
        with self._cond:
            self._woken += 1
            self._cond.notify_all()

    # -- reading ----------------------------------------------------------------------------
    def read(
        self,
        after_seq: int,
        *,
        kinds: Collection[EntryKind] | None = None,
        max_entries: int = 1000,
        max_bytes: int = 8 << 20,
        max_entry_bytes: int | None = None,
    ) -> ReadResult:
        self._check()
        wanted = None if kinds is None else {int(k) for k in kinds}
        entries: list[Entry] = []
        oversized: list[tuple[int, int, int]] = []
        taken = 0
        with self._cond:
            next_after = after_seq
            for seq in self._seqs[bisect_right(self._seqs, after_seq) :]:
                entry = self._entries[seq]
                if wanted is None or int(entry.kind) in wanted:
                    # 0 lists every entry, one of no bytes too (``Reader.read``).
                    if max_entry_bytes is not None and (
                        max_entry_bytes == 0 or len(entry.payload) > max_entry_bytes
                    ):
                        oversized.append((seq, int(entry.kind), len(entry.payload)))
                    else:
                        if entries and (
                            len(entries) >= max_entries or taken + len(entry.payload) > max_bytes
                        ):
                            break
                        entries.append(entry)
                        taken += len(entry.payload)
                next_after = seq
            else:  # scanned to the log's end (entries forgotten as shipped included)
                next_after = max(after_seq, self._last)
        return ReadResult(entries, next_after, oversized=oversized)

    def get(self, seq: int) -> Entry | None:
        self._check()
        with self._cond:
            return self._entries.get(seq)

    def newest(
        self, kinds: Collection[EntryKind], *, after: int = 0
    ) -> Iterator[tuple[int, int, int]]:
        """``(seq, kind, bytes)`` of the entries of ``kinds`` after ``after``,
        newest first (``Journal.newest``): those held, a backlog's."""
        self._check()
        wanted = {int(k) for k in kinds}
        with self._cond:
            held = self._seqs[bisect_right(self._seqs, after) :]
            found = [
                (seq, int(entry.kind), len(entry.payload))
                for seq in reversed(held)
                if int((entry := self._entries[seq]).kind) in wanted
            ]
        return iter(found)

    def tally(self, cuts: Sequence[int] = ()) -> list[Counter[int]]:
        self._check()
        bounds = sorted(set(cuts))
        counts: list[Counter[int]] = [Counter() for _ in range(len(bounds) + 1)]
        with self._cond:
            for seq in self._seqs:
                counts[bisect_left(bounds, seq)][int(self._entries[seq].kind)] += 1
            counts[0].update(self._compacted)
        return counts

    def tally_past(self, after: int) -> Counter[int]:
        """Entries per kind past ``after`` (``Journal.tally_past``)."""
        self._check()
        with self._cond:
            seqs = self._seqs[bisect_right(self._seqs, after) :]
            return Counter(int(self._entries[seq].kind) for seq in seqs)

    def tallies_past(self, afters: Sequence[int]) -> list[Counter[int]]:
        """``tally_past`` of each offset of ``afters`` (``Journal.tallies_past``)."""
        return [self.tally_past(after) for after in afters]

    def tally_range(self, after: int, upto: int) -> Counter[int]:
        """Entries per kind in ``(after, upto]`` (``Journal.tally_range``)."""
        self._check()
        with self._cond:
            seqs = self._seqs[bisect_right(self._seqs, after) : bisect_right(self._seqs, upto)]
            return Counter(int(self._entries[seq].kind) for seq in seqs)

    def compacted(self) -> Counter[int]:
        """Entries per kind forgotten as shipped (``Journal.compacted``)."""
        self._check()
        with self._cond:
            return Counter(self._compacted)

    # -- cursors and losses -----------------------------------------------------------------
    def cursor(self, sink: str) -> CursorState:
        self._check()
        with self._cond:
            return self._cursors.get(sink, CursorState(0, None))

    def acked(self, sink: str) -> int:
        return self.cursor(sink).acked

    def cursors(self) -> dict[str, int]:
        self._check()
        with self._cond:
            return {sink: state.acked for sink, state in self._cursors.items()}

    def inflight_frame(self, body: bytes) -> bytes:
        """The body as this journal keeps it: as is (``Journal.inflight_frame``)."""
        return body

    def set_inflight(self, sink: str, inflight: InFlight, *, frame: bytes | None = None) -> None:
        # ``frame`` is how the LMDB journal stores the body: kept as is here.
        self._check()
        if inflight.first_seq > inflight.last_seq:
            raise ValueError("in-flight range is empty")
        state = json.loads(dumps(inflight.state))
        with self._cond:
            acked = self._cursors.get(sink, CursorState(0, None)).acked
            # Its damage kept, as on disk: a batch carried here damaged is
            # never sent, its records count as lost.
            self._cursors[sink] = CursorState(acked, replace(inflight, state=state))

    def update_inflight_state(self, sink: str, state: Mapping[str, Any]) -> None:
        self._check()
        extra = json.loads(dumps(dict(state)))
        with self._cond:
            current = self._cursors.get(sink)
            if current is None or current.inflight is None:
                raise JournalError(f"sink {sink!r} has no batch in flight")
            batch = current.inflight
            merged = replace(batch, state={**batch.state, **extra})
            self._cursors[sink] = CursorState(current.acked, merged)

    def ack(self, sink: str, upto_seq: int, *, failed: int = 0, reason: str | None = None) -> None:
        self._check()
        with self._cond:
            if upto_seq > self._last:
                raise ValueError(f"cannot ack {upto_seq}: the last entry is {self._last}")
            acked = self._cursors.get(sink, CursorState(0, None)).acked
            if upto_seq < acked:
                raise ValueError(f"sink {sink!r} already acked {acked} > {upto_seq}")
            self._cursors[sink] = CursorState(upto_seq, None)
            if failed > 0:
                self._add_loss(sink, failed, reason)
            self._drop_shipped()

    def record_loss(
        self, sink: str, count: int, reason: str, *, damaged_through: int | None = None
    ) -> None:
        self._check()
        with self._cond:
            self._add_loss(sink, count, reason)

    def damage_counted(self, sink: str) -> int:
        return -1  # no process after this one reads it (its shipper keeps the mark)

    def damaged_end(self) -> int:
        return self.last_seq()  # nothing on disk to be damaged

    def _add_loss(self, sink: str, count: int, reason: str | None) -> None:
        rec = self._losses.setdefault(sink, {"count": 0, "reasons": []})
        rec["count"] += count
        if reason:
            rec["reasons"] = [*rec["reasons"], reason][-_MAX_REASONS:]

    def losses(self) -> dict[str, dict[str, Any]]:
        self._check()
        with self._cond:
            return {
                sink: {**rec, "reasons": list(rec["reasons"])} for sink, rec in self._losses.items()
            }

    # -- capacity: what every sink acknowledged leaves memory -------------------------------
    def set_sinks(self, names: Collection[str]) -> None:
        with self._cond:
            self._sinks = frozenset(names)
            self._drop_shipped()

    def drop_sink(self, name: str) -> None:
        with self._cond:
            self._sinks = self._sinks - {name}
            self._drop_shipped()

    def _drop_shipped(self) -> None:
        """Forget the entries every named sink acknowledged (under the lock),
        but the run's spec, finish and last summary: the close-out reads them."""
        if not self._sinks:
            return
        upto = min(self._cursors.get(s, CursorState(0, None)).acked for s in self._sinks)
        # Only what the last pass did not look at: the lifecycle entries it
        # kept (a summary per step, for a run that updates it each step)
        # are not walked again at every acknowledgement.
        start = bisect_right(self._seqs, self._swept)
        end = bisect_right(self._seqs, upto)
        kept: list[int] = []
        before = 0  # a summary an earlier pass kept, superseded in this one
        for seq in self._seqs[start:end]:
            entry = self._entries[seq]
            if entry.kind == EntryKind.SUMMARY:
                # Only the last summary is read (the close-out of a crash
                # sends it; no sink ships one): one a later one supersedes
                # goes, as shipped entries do, and memory holds one.
                if self._summary in self._entries:
                    before = self._summary if self._summary <= self._swept else before
                    self._forget(self._summary)
                self._summary = seq
            if entry.kind in _KEPT:
                kept.append(seq)
                continue
            self._forget(seq)
        self._seqs[start:end] = [seq for seq in kept if seq in self._entries]
        if before:
            at = bisect_left(self._seqs, before)
            if at < len(self._seqs) and self._seqs[at] == before:
                del self._seqs[at]
        self._swept = max(self._swept, upto)

    def _forget(self, seq: int) -> None:
        entry = self._entries.pop(seq)
        self._bytes -= len(entry.payload) + HEADER_SIZE
        self._compacted[int(entry.kind)] += 1

    def size_bytes(self) -> int:
        with self._cond:
            return self._bytes

    def compact(self, sinks: Collection[str] | None = None) -> int:
        return 0  # done at every acknowledgement

    # -- what a journal on disk has and this one does without --------------------------------
    def structural_damage(self) -> list[Damage]:
        return []

    def damage(self, *, decode: bool = True) -> list[Damage]:
        return []

    def sync(self) -> None:
        """Nothing to flush: nothing is on disk."""

    def unshare_lock(self) -> None:
        """No lock to take back: no uplink process ever shared this journal."""

    def take_back_moving(self) -> None:
        """No mover: nothing is spooled."""

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __enter__(self) -> MemoryJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemoryJournal({self.local_id!r}, last_seq={self._last})"
