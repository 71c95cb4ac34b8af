"""Whether a copy is a copy of the journal a sync journal was made from,
where their origins cannot tell.

A sync journal is found by the copy's local id (``mirror.open_sync_journal``)
and takes the copy's entries past its own end, under their seqs. Both
record an origin (where the journal was written), and a copy whose origin
differs from the one the sync journal was made from is refused. But an
origin may be missing on either side: a journal written before origins
were recorded, or a meta value lost to damage. Nothing was compared then,
and a copy of another run claiming the same local id (a journal copied
into another's name, a collision a tool made) had its entries shipped into
the first run, or, holding fewer, was reported synced with none shipped.

Entries are immutable once written, so two copies of one journal hold the
same record under every seq both hold; two journals of different runs
almost never do (a run's first entry holds its spec and the time it was
made). :func:`differs_at` compares a few seqs both hold: the last the two
share, and the first the sync journal holds.
"""

from __future__ import annotations

from ..journal import Entry, Journal

__all__ = ["differs_at"]


def differs_at(copy: Journal, synced: Journal) -> int | None:
    """The seq of an entry ``copy`` and ``synced`` both hold, intact, that is
    not the same record in the two; None when every one compared agrees or
    none could be (an empty journal, entries damaged or compacted away)."""
    shared = min(copy.last_seq(), synced.last_seq())
    first = synced.read(0, max_entries=1).entries
    seqs = {shared, *(entry.seq for entry in first if entry.seq <= shared)}
    for seq in sorted(seqs):
        if seq <= 0:
            continue
        ours, theirs = _entry_at(copy, seq), _entry_at(synced, seq)
        if ours is None or theirs is None:
            continue
        if (ours.kind, ours.payload) != (theirs.kind, theirs.payload):
            return seq
    return None


def _entry_at(journal: Journal, seq: int) -> Entry | None:
    """Entry ``seq`` of ``journal``, or None where it does not hold it intact."""
    found = journal.read(seq - 1, max_entries=1).entries
    return found[0] if found and found[0].seq == seq else None
