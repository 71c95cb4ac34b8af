"""The plain values the journal hands out: entries, damage reports, cursor states.

All are frozen dataclasses holding copied bytes, so none of them keeps an LMDB
read transaction (or its memory map) alive after the call that made it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primeruns.ascii_digits import decimal_or_none
from primeruns.journal.frames import EntryKind

__all__ = [
    "K_SKIPPED",
    "AppendResult",
    "CursorState",
    "Damage",
    "Entry",
    "InFlight",
    "JournalInfo",
    "ReadResult",
    "as_count",
    "is_loss_record",
    "loss_counts",
    "skipped_ranges",
    "skipped_within",
]

# Seqs an owner's appends started after, lost past the log's end
# (``Journal._appends_after``): {"<first>": <last>}. A sync journal's import
# passes over them as that owner did: no later copy brings them.
K_SKIPPED = "journal.skipped"
# The highest seq a journal holds (its LMDB key is a u64, read past by one).
_MAX_SEQ = (1 << 63) - 1


@dataclass(frozen=True)
class Entry:
    """One journal entry, copied out of LMDB, checksum-verified and decompressed."""

    seq: int
    kind: EntryKind
    payload: bytes


@dataclass(frozen=True)
class Damage:
    """One precise damage report: an entry (``seq``) or the structure (``seq=None``).

    ``entries``: how many entries it stands for (a range found missing: all of them)."""

    seq: int | None
    what: str
    entries: int = 1


@dataclass(frozen=True)
class ReadResult:
    """A range read: matching entries, how far the scan got, damage met on the way."""

    entries: list[Entry]
    next_after: int
    damaged: list[Damage] = field(default_factory=list)
    #: With ``max_entry_bytes``: the entries left out for their size, as
    #: ``(seq, kind, declared bytes)``, neither copied nor decompressed.
    oversized: list[tuple[int, int, int]] = field(default_factory=list)
    #: With ``decode=False``: the entries that passed their check (not
    #: decoded, not returned), as ``(seq, kind)``.
    checked: list[tuple[int, int]] = field(default_factory=list)
    #: With ``frames=True``: each returned entry's stored frame, by seq, as
    #: verified and decoded (a sync journal's import stores it as it is).
    frames: dict[int, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class AppendResult:
    """What an append did: entries written from ``first_seq``, entries
    dropped, and entries held in memory for a full disk (``overflow``: no
    seq yet, stored in order once it has room, or counted lost). (Not
    frozen: it is made on every log call, and a frozen dataclass, which
    sets each field through ``object.__setattr__``, cost 2.5 times as much
    to make.)"""

    first_seq: int | None
    count: int
    dropped: int
    held: int = 0


@dataclass(frozen=True)
class InFlight:
    """A shipper's batch, recorded before its first attempt so a resend is byte-identical."""

    first_seq: int
    last_seq: int
    body: bytes
    state: dict[str, Any]
    #: What is damaged in the batch as recorded (its body, its state), read
    #: back from a journal (untrusted input); None: it reads back whole. A
    #: damaged batch is never sent: its records count as lost.
    damage: str | None = None


@dataclass(frozen=True)
class CursorState:
    """A sink's progress: every entry ``<= acked`` is acknowledged; at most one batch in flight."""

    acked: int
    inflight: InFlight | None


def as_count(value: Any) -> int | None:
    """``value`` if it is a count as this package writes one (an int, not a
    bool, not negative), else None: damage. A journal, or a summary of one,
    is untrusted input, and a negative count taken into a total made
    ``ls`` and ``show`` report fewer records lost than were, or a negative
    number of them: every reader of a count takes it through here."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def is_loss_record(value: Any) -> bool:
    """Whether ``value`` is one sink's record of ``journal.losses`` as this
    package writes it: ``{"count": count, "reasons": [str, ...]}`` (reasons
    optional; the count by :func:`as_count`). Every reader of the counts
    relies on that shape, and a journal (or a summary of one) is untrusted
    input."""
    if not isinstance(value, dict):
        return False
    count, reasons = value.get("count", 0), value.get("reasons", [])
    return (
        as_count(count) is not None
        and isinstance(reasons, list)
        and all(isinstance(reason, str) for reason in reasons)
    )


def loss_counts(losses: Mapping[str, Any]) -> dict[str, int]:
    """Per sink, the count of each record of ``losses`` (``Journal.losses``,
    or a listing's ``JournalInfo.losses``) that is one (``is_loss_record``);
    the others are left out, as their reader reports them (``losses_in``)."""
    return {sink: int(rec.get("count", 0)) for sink, rec in losses.items() if is_loss_record(rec)}


def skipped_ranges(value: Any) -> list[tuple[int, int]]:
    """The ranges ``(first, last)`` of seqs a ``K_SKIPPED`` value names, as
    read back: a journal is untrusted input, so a key that is no seq (its
    decimal digits, at most a seq's 19: ``int`` refuses thousands of them),
    or a last that is no seq at or past its first, names none."""
    ranges = value.items() if isinstance(value, dict) else ()
    return [
        (seq, last)
        for first, last in ranges
        if isinstance(first, str)
        and (seq := decimal_or_none(first, 19)) is not None
        and isinstance(last, int)
        and not isinstance(last, bool)
        and 0 < seq <= last <= _MAX_SEQ
    ]


def skipped_within(value: Any, after: int, upto: int) -> int:
    """How many seqs past ``after`` and up to ``upto`` the ranges of a
    ``K_SKIPPED`` value hold, each once (ranges a journal names may overlap)."""
    if value is None:
        return 0  # (almost every journal: a listing asks thrice for each)
    count, counted_to = 0, after
    for first, last in sorted(skipped_ranges(value)):
        first, last = max(first, counted_to + 1), min(last, upto)
        if first <= last:
            count += last - first + 1
            counted_to = last
    return count


@dataclass(frozen=True)
class JournalInfo:
    """One run directory's state, as read without any lock."""

    path: Path
    local_id: str
    meta: dict[str, Any]
    last_seq: int
    cursors: dict[str, int]
    losses: dict[str, dict[str, Any]]
    size_bytes: int
    modified: float
    owner: str | None
    owner_alive: bool
    damage: list[Damage] = field(default_factory=list)
    after: dict[int, Counter[int]] = field(default_factory=dict)
    """With ``tally=True``: for offset 0 and each sink's acknowledged offset,
    the entries after it per kind (at 0, everything the run logged, compacted
    entries included; unreadable ones under ``UNREADABLE``)."""
    not_opened: str | None = None
    """Why it was not opened (a link in the runs directory, another user's
    folder: ``listing.journal_dirs``), None where it was: nothing of it was
    read, and nothing the commands do goes into it."""
    finish: dict[str, Any] | None = None
    """The run's finish record (its last ``FINISH`` entry), if it has one; one
    declaring more than ``listing.MAX_FINISH_BYTES`` reads as finished, unread."""

    @property
    def missing_entries(self) -> int:
        """Seqs up to ``last_seq`` that hold no entry: an owner's appends
        started past them (``K_SKIPPED``), lost at a power cut."""
        return skipped_within(self.meta.get(K_SKIPPED), 0, self.last_seq)

    @property
    def entries(self) -> int:
        """The entries the run logged: its seqs, less those that are missing."""
        return self.last_seq - self.missing_entries
