"""The run journal: a crash-safe LMDB write-ahead log of a run's records.

Every ``log_*`` call appends here and returns once committed; shipper threads
read after their own cursors and acknowledge what the platform accepted. See
``journal.Journal`` for the concepts (entries, cursors, meta, durability,
capacity) and ``store`` for how LMDB is opened with care.
"""

import sys
from typing import TYPE_CHECKING, Any

from primeruns.journal.frames import EntryKind
from primeruns.journal.listing import (
    JournalInfo,
    default_runs_dir,
    delete_journal,
    journal_info,
    list_journals,
)
from primeruns.journal.types import (
    AppendResult,
    CursorState,
    Damage,
    Entry,
    InFlight,
    ReadResult,
)

if TYPE_CHECKING:
    from primeruns.journal.journal import DEFAULT_MAX_JOURNAL_BYTES, FORMAT_VERSION, Journal

# What ``journal.journal`` defines loads on first use (PEP 562): the writing
# side (appends, capacity, the mover) is half of ``primeruns ls``'s start-up,
# and a listing opens no journal whose summary is current.
_FROM_JOURNAL = frozenset({"DEFAULT_MAX_JOURNAL_BYTES", "FORMAT_VERSION", "Journal"})


def __getattr__(name: str) -> Any:
    if name in _FROM_JOURNAL:
        from primeruns.journal import journal

        return getattr(journal, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MAX_JOURNAL_BYTES",
    "FORMAT_VERSION",
    "AppendResult",
    "CursorState",
    "Damage",
    "Entry",
    "EntryKind",
    "InFlight",
    "Journal",
    "JournalInfo",
    "ReadResult",
    "default_runs_dir",
    "delete_journal",
    "in_memory",
    "journal_info",
    "list_journals",
]


def in_memory(journal: object) -> bool:
    """Whether ``journal`` is held in memory (a ``journal.memory.MemoryJournal``).

    Asked without importing ``journal.memory``: a run on disk (nearly every
    one) never loads it, and until it is loaded no journal can be one.
    """
    memory = sys.modules.get(f"{__name__}.memory")
    return memory is not None and isinstance(journal, memory.MemoryJournal)
