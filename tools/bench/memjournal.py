"""An in-memory stand-in for the run journal, to measure what the journal costs.

``end_to_end.py`` runs the SDK once as shipped and once with ``Journal``
replaced by :class:`MemoryJournal` (:func:`install`), so the difference between
the two is the journal's own cost and nothing else: ``init``, the ``Run``
handle, record encoding, the shipper threads, the sinks, the HTTP client and
the platform are the very same code in both.

What the stand-in keeps, to stay honest:

- the same API and the same semantics the run and the shippers rely on:
  dense sequence numbers, reads after a cursor filtered by kind and bounded by
  ``max_entries``/``max_bytes``, one in-flight batch per sink, acks, meta,
  losses, and appends waking waiting shippers through a condition variable;
- the same locking discipline (one lock per journal, appends notify).

Entries stay in RAM until the run ends (a benchmark run fits easily), so reads
index straight to the cursor, as an LMDB range read does.

What it leaves out is exactly the journal's work: framing, checksums, zstd,
the LMDB transactions and the page cache, the background sync. It is a queue
in RAM: a crash loses it all, which is why the SDK does not do this.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import primeruns.opening as run_module
from primeruns.exceptions import FINISHED_WHILE_LOGGING, RunFinishedError
from primeruns.journal import (
    AppendResult,
    CursorState,
    Entry,
    EntryKind,
    InFlight,
    ReadResult,
)
from primeruns.journal.journal import default_local_id

__all__ = ["MemoryJournal", "install"]


class MemoryJournal:
    """The subset of ``primeruns.journal.Journal`` a live run uses, held in RAM."""

    def __init__(self, path: Path, local_id: str, durability: str) -> None:
        self.path = path
        self.local_id = local_id
        self.durability = durability
        self._lock = threading.Lock()
        self._appended = threading.Condition(self._lock)
        self._wake_gen = 0
        self._closed = False
        self._finished = False  # the final entry is in: nothing more is appended
        self._entries: list[Entry] = []  # index i holds seq i + 1
        self._meta: dict[str, Any] = {}
        self._acked: dict[str, int] = {}
        self._inflight: dict[str, InFlight] = {}
        self._losses: dict[str, dict[str, Any]] = {}

    @classmethod
    def create(
        cls,
        runs_dir: Path,
        *,
        local_id: str | None = None,
        durability: str = "process",
        max_bytes: int = 0,
        meta: Mapping[str, Any] | None = None,
    ) -> MemoryJournal:
        local_id = local_id or default_local_id()
        journal = cls(Path(runs_dir) / local_id, local_id, durability)
        journal.update_meta(dict(meta or {}))
        return journal

    # -- appending and reading ------------------------------------------------
    def append(
        self,
        kind: EntryKind,
        payloads: Sequence[bytes],
        *,
        essential: bool = False,
        final: bool = False,
    ) -> AppendResult:
        """As ``Journal.append``: nothing is appended after the final entry."""
        if not payloads:
            return AppendResult(None, 0, 0)
        with self._appended:
            if self._finished:
                raise RunFinishedError(FINISHED_WHILE_LOGGING)
            self._finished = final
            first = len(self._entries) + 1
            self._entries.extend(Entry(first + i, kind, bytes(p)) for i, p in enumerate(payloads))
            self._appended.notify_all()
        return AppendResult(first, len(payloads), 0)

    def set_sinks(self, names: Sequence[str]) -> None:
        """Nothing to compact in memory."""

    def drop_sink(self, name: str) -> None:
        """Nothing to compact in memory."""

    def last_seq(self) -> int:
        return len(self._entries)

    def wait_for_append(
        self,
        after_seq: int,
        timeout: float | None,
        until: Callable[[], bool] | None = None,
    ) -> bool:
        """As ``Journal.wait_for_append``: ``until`` is looked at under the
        condition ``wake_all`` notifies; a timeout of None waits for good."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._appended:
            gen = self._wake_gen
            while self.last_seq() <= after_seq and self._wake_gen == gen and not self._closed:
                if until is not None and until():
                    break
                if deadline is None:
                    self._appended.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._appended.wait(left)
            return self.last_seq() > after_seq and not self._closed

    def wake_all(self) -> None:
        with self._appended:
            self._wake_gen += 1
            self._appended.notify_all()

    def read(
        self,
        after_seq: int,
        *,
        kinds: Collection[EntryKind] | None = None,
        max_entries: int = 1000,
        max_bytes: int = 8 << 20,
    ) -> ReadResult:
        wanted = None if kinds is None else frozenset(kinds)
        out: list[Entry] = []
        total = 0
        with self._lock:
            next_after = after_seq
            entries = self._entries
            for index in range(max(0, after_seq), len(entries)):
                entry = entries[index]
                if wanted is None or entry.kind in wanted:
                    if out and (len(out) >= max_entries or total + len(entry.payload) > max_bytes):
                        break
                    out.append(entry)
                    total += len(entry.payload)
                next_after = entry.seq
        return ReadResult(out, next_after, [])

    def tally(self, cuts: Sequence[int] = ()) -> list[Counter[int]]:
        bounds = sorted(set(cuts))
        counts: list[Counter[int]] = [Counter() for _ in range(len(bounds) + 1)]
        with self._lock:
            for entry in self._entries:
                counts[bisect_left(bounds, entry.seq)][int(entry.kind)] += 1
        return counts

    def get(self, seq: int) -> Entry | None:
        with self._lock:
            index = seq - 1
            return self._entries[index] if 0 <= index < len(self._entries) else None

    # -- cursors ----------------------------------------------------------------
    def cursor(self, sink: str) -> CursorState:
        with self._lock:
            return CursorState(self._acked.get(sink, 0), self._inflight.get(sink))

    def cursors(self) -> dict[str, int]:
        with self._lock:
            return dict(self._acked)

    def set_inflight(self, sink: str, inflight: InFlight) -> None:
        with self._lock:
            self._inflight[sink] = InFlight(
                inflight.first_seq, inflight.last_seq, inflight.body, dict(inflight.state)
            )

    def update_inflight_state(self, sink: str, state: Mapping[str, Any]) -> None:
        with self._lock:
            old = self._inflight[sink]
            self._inflight[sink] = InFlight(
                old.first_seq, old.last_seq, old.body, {**old.state, **state}
            )

    def ack(self, sink: str, upto_seq: int, *, failed: int = 0, reason: str | None = None) -> None:
        with self._lock:
            self._acked[sink] = upto_seq
            self._inflight.pop(sink, None)
            if failed:
                self._add_loss(sink, failed, reason)

    # -- losses and meta ------------------------------------------------------------
    def _add_loss(self, sink: str, count: int, reason: str | None) -> None:
        rec = self._losses.setdefault(sink, {"count": 0, "reasons": []})
        rec["count"] += count
        if reason:
            rec["reasons"] = [*rec["reasons"], reason][-5:]

    def record_loss(self, sink: str, count: int, reason: str) -> None:
        with self._lock:
            self._add_loss(sink, count, reason)

    def losses(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {
                k: {"count": v["count"], "reasons": list(v["reasons"])}
                for k, v in self._losses.items()
            }

    def get_meta(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._meta.get(key, default)

    def set_meta(self, key: str, value: Any) -> None:
        self.update_meta({key: value})

    def update_meta(self, values: Mapping[str, Any]) -> None:
        with self._lock:
            self._meta.update(values)

    def close(self) -> None:
        with self._appended:
            self._closed = True
            self._appended.notify_all()


def install() -> None:
    """Make ``primeruns.init`` create a :class:`MemoryJournal` in this process."""
    setattr(run_module, "Journal", MemoryJournal)  # noqa: B010  (a monkeypatch, on purpose)
