"""Records parsed once for all the sinks of a journal that take them.

Every episode of an evaluation goes to two sinks, Prime Traces and the
sample table, and each parsed the entry's JSON itself: parsing was the
largest CPU cost of shipping an episode, paid twice. Here the first sink to
parse an entry keeps the record for the others that take its kind, and each
later one takes it; once all have, it is let go. A sink only reads a
record: what it stamps or projects is a copy (``records.stamp_run``,
``projection``), so one parsed record serves all of them.

What is kept is bounded (``KEEP_BYTES`` of payloads): a sink far behind the
other (a retried request, one turned off) parses for itself again, as
before. Shared by the shippers' threads of one journal.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ..journal import Entry, EntryKind
from ..sinks.base import parse_entry

__all__ = ["KEEP_BYTES", "SharedRecords"]

KEEP_BYTES = 16 << 20


class SharedRecords:
    """Parsed records of one journal, kept until every sink that takes them has."""

    def __init__(self, takers: Mapping[EntryKind, int], keep_bytes: int = KEEP_BYTES) -> None:
        """``takers``: how many sinks take each kind of entry."""
        self._takers = dict(takers)
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        # seq -> (record, takers still to come, payload bytes); oldest first.
        self._kept: OrderedDict[int, tuple[Any, int, int]] = OrderedDict()
        self._bytes = 0

    def parse(self, entry: Entry) -> Any:
        """``entry``'s record: as another sink parsed it, else parsed now
        (and kept for the sinks still to take it)."""
        takers = self._takers.get(entry.kind, 1)
        if takers > 1:
            with self._lock:
                kept = self._kept.get(entry.seq)
                if kept is not None:
                    record, left, size = kept
                    if left > 1:
                        self._kept[entry.seq] = (record, left - 1, size)
                    else:
                        del self._kept[entry.seq]
                        self._bytes -= size
                    return record
        record = parse_entry(entry)
        if takers > 1:
            size = len(entry.payload)
            with self._lock:
                if entry.seq not in self._kept:
                    self._kept[entry.seq] = (record, takers - 1, size)
                    self._bytes += size
                    while self._bytes > self._keep_bytes and len(self._kept) > 1:
                        _, (_, _, dropped) = self._kept.popitem(last=False)
                        self._bytes -= dropped
        return record

    @property
    def kept(self) -> int:
        """How many records are kept now (for tests)."""
        with self._lock:
            return len(self._kept)
