"""A journal left as a producer killed before its mover moved its spool
leaves it: what the spool's damage tests start from."""

from __future__ import annotations

from pathlib import Path

from primeruns.journal import EntryKind, Journal
from primeruns.journal.spool import APPEND, list_segments


def killed_segment(journal: Journal) -> tuple[Path, bytearray, list[int]]:
    """Close ``journal`` (its mover stopped by the caller) as if killed, its
    appends left in its one spool segment: (the segment, its bytes, where
    each append starts)."""
    [(_, name)] = list_segments(journal.path)
    segment = journal.path / name
    data = bytearray(segment.read_bytes())
    journal._mover.drain = lambda *a, **k: None  # type: ignore[method-assign]  # as if killed
    journal.close()
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        at += APPEND.size + APPEND.unpack_from(data, at)[3]
    return segment, data, starts


def power_cut_from(journal: Journal, append: int) -> Path:
    """Close ``journal`` (its mover stopped by the caller) as if killed, then
    zero its one spool segment from its append number ``append`` (0 the
    first) on: a power cut's, where those pages never reached the disk.
    Returns the journal's path."""
    segment, data, starts = killed_segment(journal)
    data[starts[append] :] = bytes(len(data) - starts[append])
    segment.write_bytes(bytes(data))
    return segment.parent


def acked_then_cut(root: Path, local_id: str = "run") -> Path:
    """A journal under ``root`` of ten one-entry appends, a sink
    (``traces``) acknowledged through all ten, whose entries 4 to 10 a
    power cut's zeros then took: its next owner appends after them.
    Returns its path."""
    journal = Journal.create(root, local_id=local_id)
    journal._mover.stop()
    for n in range(10):
        journal.append(EntryKind.EPISODE, [b'{"n":%d}' % n])
    journal.ack("traces", 10)
    return power_cut_from(journal, 3)
