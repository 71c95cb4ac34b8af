"""Entries of one kind found by their headers alone, then read one at a time.

A reader that wants the last summary of a run, or a few hundred of its metric
rows, used to read (decompress, copy, parse) every entry of that kind: on a
20,000-step run that logs a summary each step, 20,000 decodes for one value.
Here the kind's seqs come from entry headers (12 bytes each, nothing
decompressed) and only the entries wanted are decoded.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from primeruns.exceptions import JournalCorruptError
from primeruns.journal.frames import EntryKind
from primeruns.journal.journal import Journal

__all__ = ["last_payload", "seqs_by_kind", "seqs_of"]

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


def last_payload(
    journal: Journal, kind: EntryKind, seqs: Sequence[int] | None = None
) -> bytes | None:
    """The payload of the journal's last intact entry of ``kind``, or None;
    one decoded unless the last ones are damaged (each passed over).
    ``seqs``: the kind's seqs when a scan found them already."""
    for seq in reversed(seqs_of(journal, kind) if seqs is None else seqs):
        try:
            entry = journal.get(seq)
        except JournalCorruptError:
            continue  # reported by a damage scan; the one before it stands
        if entry is not None:
            return entry.payload
    return None
