"""The plain values the journal hands out: entries, damage reports, cursor states.

All are frozen dataclasses holding copied bytes, so none of them keeps an LMDB
read transaction (or its memory map) alive after the call that made it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primeruns.journal.frames import EntryKind

__all__ = [
    "AppendResult",
    "CursorState",
    "Damage",
    "Entry",
    "InFlight",
    "JournalInfo",
    "ReadResult",
    "is_loss_record",
]


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


@dataclass(slots=True)
class AppendResult:
    """What an append did: entries written from ``first_seq``, and entries
    dropped. (Not frozen: it is made on every log call, and a frozen
    dataclass, which sets each field through ``object.__setattr__``, cost
    2.5 times as much to make.)"""

    first_seq: int | None
    count: int
    dropped: int


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


def is_loss_record(value: Any) -> bool:
    """Whether ``value`` is one sink's record of ``journal.losses`` as this
    package writes it: ``{"count": int, "reasons": [str, ...]}`` (reasons
    optional). Every reader of the counts relies on that shape, and a journal
    (or a summary of one) is untrusted input."""
    if not isinstance(value, dict):
        return False
    count, reasons = value.get("count", 0), value.get("reasons", [])
    return (
        isinstance(count, int)
        and not isinstance(count, bool)
        and isinstance(reasons, list)
        and all(isinstance(reason, str) for reason in reasons)
    )


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
    finish: dict[str, Any] | None = None
    """The run's finish record (its last ``FINISH`` entry), if it has one; one
    declaring more than ``listing.MAX_FINISH_BYTES`` reads as finished, unread."""
