"""Episodes parsed once for all the sinks of a journal that take them.

Every episode of an evaluation goes to two sinks, Prime Traces and the
sample table, and each parsed the entry's JSON itself: parsing was the
largest CPU cost of shipping an episode, paid twice. Here the first sink to
parse an entry makes what both send of it (``sinks.forms``: the Prime Traces
line and the sample rows, from the record stamped once), keeps the other's
until it takes it, and lets the record go at once.

What is kept is bytes. Keeping the parsed records instead (16 MiB of them,
a batch long in a fast evaluation) cost more than the second parse it
spared: hundreds of containers each, they outlived the garbage collector's
young generations, and its passes (each full one also walking the user's
objects) took a fifth of the CPU time of shipping 5,000 episodes from
threads. Bytes the collector never walks.

What is kept is bounded (``KEEP_BYTES`` of forms), and it is the oldest
entries' that are kept: a sink reads in order, so the one behind needs the
oldest first. When the bound is reached, an entry parsed for the first time
gets only the parsing sink's form, kept for nobody (the sink behind parses
it for itself when it gets there), and an entry parsed again (by the sink
behind, or after a batch was cut and read anew) is never kept: no other sink
is still to take it. Evicting the oldest instead, and keeping every
re-parse, let the two sinks of a fast evaluation (batches of thousands of
episodes, one sink a batch ahead) push out each other's before they were
taken: 5,000 episodes were parsed 9,491 times. Shared by the shippers'
threads of one journal.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ..journal import Entry, EntryKind
from ..platform.binding import Binding
from ..projection import SampleRows
from ..sinks.base import parse_entry
from ..sinks.forms import Forms, Line, made, make_forms, size

__all__ = ["KEEP_BYTES", "SharedRecords"]

#: About 3,000 gsm8k episodes' sample rows (21 KB each; the 9 KB line
#: Prime Traces took is not kept for the sample table's sink): less memory
#: than the 16 MiB of parsed records kept before.
KEEP_BYTES = 64 << 20
#: What is kept of an entry, per byte of its payload, until one was kept
#: (then as the last one kept): a gsm8k episode's sample rows are about 2.3
#: times its payload, its line about as long. Making both forms where they
#: would not be kept was making the other's for nothing.
_KEPT_PER_BYTE = 4.0


class SharedRecords:
    """What the sinks of one journal send of its entries, made once, kept
    until every sink that takes them has."""

    def __init__(self, takers: Mapping[EntryKind, int], keep_bytes: int = KEEP_BYTES) -> None:
        """``takers``: how many sinks take each kind of entry."""
        self._takers = dict(takers)
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        # seq -> (forms, their binding, takers still to come, bytes), in the
        # order made; forms None while the first sink makes them.
        self._kept: dict[int, tuple[Forms | None, Binding, int, int]] = {}
        self._bytes = 0
        # The newest seq any sink parsed: an entry at or before it was parsed
        # already (sinks read in order), so parsing it again keeps nothing.
        self._parsed_upto = -1
        self._kept_per_byte = _KEPT_PER_BYTE

    def line(self, entry: Entry, binding: Binding) -> Line:
        """``entry``'s Prime Traces line (``sinks.forms.line_of``)."""
        form: Line = made(self._forms(entry, binding, rows=False).line)
        return form

    def rows(self, entry: Entry, binding: Binding) -> SampleRows | None:
        """``entry``'s sample rows (``sinks.forms.rows_of``)."""
        form: SampleRows | None = made(self._forms(entry, binding, rows=True).rows)
        return form

    def _forms(self, entry: Entry, binding: Binding, *, rows: bool) -> Forms:
        """As another sink made them, else made now: both (kept for the sink
        still to take them) while there is room, else the one asked for."""
        takers = self._takers.get(entry.kind, 1)
        first = False
        if takers > 1:
            with self._lock:
                kept = self._kept.get(entry.seq)
                if kept is not None and kept[1] == binding:
                    forms, _, left, held = kept
                    # Taken (or, while another sink makes them, made here too:
                    # waiting would hold this sink up; none is kept for it).
                    if left > 1:
                        self._kept[entry.seq] = (forms, binding, left - 1, held)
                    else:
                        del self._kept[entry.seq]
                        self._bytes -= held
                    if forms is not None and _holds(forms, rows=rows):
                        return forms
                else:
                    first = entry.seq > self._parsed_upto and (
                        not self._kept
                        or self._bytes + self._kept_per_byte * len(entry.payload)
                        <= self._keep_bytes
                    )
                    self._parsed_upto = max(self._parsed_upto, entry.seq)
                    if first:
                        self._kept[entry.seq] = (None, binding, takers - 1, 0)
        record = parse_entry(entry)
        if not first:
            return make_forms(record, binding, line=not rows, rows=rows)
        forms = make_forms(record, binding, line=True, rows=True)
        with self._lock:
            kept = self._kept.pop(entry.seq, None)
            # What is kept is what the sinks still to come send: for the one
            # sink left, not the form this one asked for (a third of an
            # episode's forms: the bound then holds half as many entries more).
            keep = forms if kept is None or kept[2] > 1 else _without(forms, rows=rows)
            held = size(keep)
            # Kept while a sink is still to take them (one entry's over the
            # bound is still kept alone).
            if kept is not None and (not self._kept or self._bytes + held <= self._keep_bytes):
                self._kept[entry.seq] = (keep, binding, kept[2], held)
                self._bytes += held
                self._kept_per_byte = held / max(1, len(entry.payload))
        return forms

    def leave(self) -> None:
        """A sink taking them is off or retired: each takes its own from now
        on (it may be revived, and then makes its own), and nothing is kept."""
        with self._lock:
            self._takers = {kind: 1 for kind in self._takers}
            self._kept.clear()
            self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        """The bytes of the forms kept now (for tests)."""
        with self._lock:
            return self._bytes

    @property
    def kept(self) -> int:
        """How many entries' forms are kept now (for tests)."""
        with self._lock:
            return len(self._kept)


def _holds(forms: Forms, *, rows: bool) -> bool:
    """Whether ``forms`` has the form asked for (made, or the error making it raised)."""
    return (forms.rows if rows else forms.line) is not None


def _without(forms: Forms, *, rows: bool) -> Forms:
    """``forms`` less the one asked for (``rows``, else the line): the rest
    is what the sink still to take them sends. A sink asking for a form
    dropped here (one sending the same form as the other) makes its own."""
    return Forms(forms.line, None) if rows else Forms(None, forms.rows)
