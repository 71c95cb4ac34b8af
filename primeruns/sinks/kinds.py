"""Which entries each sink ships, and how many it has left: what a listing counts with.

``ls``, ``show``, ``gc`` and the dashboard say per sink what a run has still
to ship, from the entry counts a listing tallied by header. That needs the
sinks' names and entry kinds only, so they are here, apart from the sinks
themselves (which import the platform's client and httpx): each sink class
takes its ``kinds`` from this table, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ..journal.frames import EntryKind

__all__ = ["SINK_KINDS", "records_left", "sink_kinds", "sink_names"]

#: Each sink and the entry kinds it ships.
SINK_KINDS: dict[str, frozenset[EntryKind]] = {
    "traces": frozenset({EntryKind.EPISODE, EntryKind.TRACE}),
    "eval_samples": frozenset({EntryKind.EPISODE}),
    "train_samples": frozenset({EntryKind.EPISODE}),
    "train_metrics": frozenset({EntryKind.METRICS}),
}

_KNOWN_KINDS = frozenset(int(k) for k in EntryKind)


def sink_names(kind: str) -> list[str]:
    """The sinks a run of ``kind`` ships to, in the order they are started."""
    if kind == "train":
        return ["traces", "train_samples", "train_metrics"]
    return ["traces", "eval_samples"]


def sink_kinds(kind: str) -> dict[str, frozenset[EntryKind]]:
    """Each sink of a run of ``kind`` and the entry kinds it ships."""
    return {name: SINK_KINDS[name] for name in sink_names(kind)}


def records_left(counts: Mapping[int, int], kinds: Collection[EntryKind]) -> int:
    """Of entry counts by kind (an interval of ``Journal.tally``), the records a
    sink shipping ``kinds`` has still to deal with: its own kinds, and every
    entry that cannot be read or is of a kind this version does not know. Such
    an entry may be anything, so it is pending for every sink until a shipper
    passes over it (and counts what it lost)."""
    # An IntEnum hashes and compares as its int: a count's kind is found among
    # ``kinds`` as they are (a set made per sink was a listing's cost per journal).
    return sum(n for k, n in counts.items() if k in kinds or k not in _KNOWN_KINDS)
