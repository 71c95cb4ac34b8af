"""Entries of one kind found by their headers alone, then read one at a time.

A reader that wants the last summary of a run, or a few hundred of its metric
rows, used to read (decompress, copy, parse) every entry of that kind: on a
20,000-step run that logs a summary each step, 20,000 decodes for one value.
Here the kind's seqs come from entry headers (12 bytes each, nothing
decompressed) and only the entries wanted are decoded. A reader of the last
entry of a kind reads headers from the log's end (``Journal.newest``), not
the whole log: what it costs is the entries past the one it finds.
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from primeruns.exceptions import JournalCorruptError
from primeruns.journal.frames import EntryKind
from primeruns.journal.types import Entry

if TYPE_CHECKING:
    from primeruns.journal.journal import Journal

__all__ = ["last_entry", "last_payload", "seqs_by_kind", "seqs_of"]

# Headers one read examines; a read stops at its own scan limit before this.
_BATCH = 1_000_000


def seqs_of(journal: Journal, kind: EntryKind) -> array[int]:
    """The seqs of the journal's entries of ``kind`` whose header reads, ascending.

    Eight bytes a seq: a million-row run costs 8 MB here."""
    return seqs_by_kind(journal, (kind,))[int(kind)]


def seqs_by_kind(journal: Journal, kinds: Sequence[EntryKind]) -> dict[int, array[int]]:
    """``seqs_of`` for each of ``kinds``, in one pass over the headers."""
    seqs: dict[int, array[int]] = {int(kind): array("q") for kind in kinds}
    after = 0
    while True:
        found = journal.read(
            after, kinds=set(kinds), max_entries=_BATCH, max_bytes=1 << 62, max_entry_bytes=0
        )
        for seq, kind, _ in found.oversized:
            seqs[int(kind)].append(seq)
        if found.next_after <= after:
            return seqs
        after = found.next_after


def last_entry(journal: Journal, kinds: Collection[EntryKind], after: int = 0) -> Entry | None:
    """The journal's last intact entry of any of ``kinds`` after ``after``,
    or None; found from the log's end, one decoded unless the last ones are
    damaged (each passed over: a damage scan reports it, the one before it
    stands)."""
    for seq, _, _ in journal.newest(kinds, after=after):
        try:
            entry = journal.get(seq)
        except JournalCorruptError:
            continue
        if entry is not None:  # (None: compacted away since its header was read)
            return entry
    return None


def last_payload(journal: Journal, kind: EntryKind) -> bytes | None:
    """The payload of the journal's last intact entry of ``kind``, or None
    (``last_entry``)."""
    entry = last_entry(journal, (kind,))
    return None if entry is None else entry.payload
