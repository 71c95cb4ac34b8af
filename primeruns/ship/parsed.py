"""Records parsed once for all the sinks of a journal that take them.

Every episode of an evaluation goes to two sinks, Prime Traces and the
sample table, and each parsed the entry's JSON itself: parsing was the
largest CPU cost of shipping an episode, paid twice. Here the first sink to
parse an entry keeps the record for the others that take its kind, and each
later one takes it; once all have, it is let go. A sink only reads a
record: what it stamps or projects is a copy (``records.stamp_run``,
``projection``), so one parsed record serves all of them.

What is kept is bounded (``KEEP_BYTES`` of payloads), and it is the oldest
records that are kept: a sink reads in order, so the one behind needs the
oldest first. When the bound is reached, a record parsed for the first time
is not kept (the sink behind parses it for itself when it gets there), and
a record parsed again (by the sink behind, or after a batch was cut and read
anew) is never kept: no other sink is still to take it. Evicting the oldest
instead, and keeping every re-parse, let the two sinks of a fast evaluation
(batches of thousands of episodes, one sink a batch ahead) push out each
other's records before they were taken: 5,000 episodes were parsed 9,491
times. Shared by the shippers' threads of one journal.

The bound is small on purpose. A parsed episode is a few hundred Python
containers, and one kept until the sink behind takes it (a batch later, in
a fast evaluation: about a second) outlives the garbage collector's young
generations: 16 MiB of them kept made the collector's passes a fifth of
the CPU time of shipping 5,000 episodes from threads (every full pass also
walks the user's own objects), more than the second parse they spared. So
records are shared where the sinks go together (a run logging at a pace
the platform keeps up with: each batch a few episodes, taken by both at
once), and a sink a whole batch behind parses for itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..journal import Entry, EntryKind
from ..sinks.base import parse_entry

__all__ = ["KEEP_BYTES", "SharedRecords"]

KEEP_BYTES = 1 << 20


class SharedRecords:
    """Parsed records of one journal, kept until every sink that takes them has."""

    def __init__(self, takers: Mapping[EntryKind, int], keep_bytes: int = KEEP_BYTES) -> None:
        """``takers``: how many sinks take each kind of entry."""
        self._takers = dict(takers)
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        # seq -> (record, takers still to come, payload bytes), in the order parsed.
        self._kept: dict[int, tuple[Any, int, int]] = {}
        self._bytes = 0
        # The newest seq any sink parsed: an entry at or before it was parsed
        # already (sinks read in order), so parsing it again keeps nothing.
        self._parsed_upto = -1

    def parse(self, entry: Entry) -> Any:
        """``entry``'s record: as another sink parsed it, else parsed now
        (and kept for the sinks still to take it, while there is room)."""
        takers = self._takers.get(entry.kind, 1)
        if takers <= 1:
            return parse_entry(entry)
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
            first = entry.seq > self._parsed_upto
            if first:
                self._parsed_upto = entry.seq
        record = parse_entry(entry)
        if first:
            size = len(entry.payload)
            with self._lock:
                # One record over the bound is still kept alone.
                if not self._kept or self._bytes + size <= self._keep_bytes:
                    self._kept[entry.seq] = (record, takers - 1, size)
                    self._bytes += size
        return record

    @property
    def kept(self) -> int:
        """How many records are kept now (for tests)."""
        with self._lock:
            return len(self._kept)
