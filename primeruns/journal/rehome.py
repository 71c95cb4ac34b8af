"""A journal whose directory was deleted or moved under its live run.

A tmp cleaner, a scratch wipe or ``rm -rf ~/.local/state`` removes the runs
directory of a days-long job. The open files outlive their names, so every
``log_*`` call still returned, but the uplink reads spool segments by name:
what came after the deletion reached no sink and no counter.

The producer can still read everything it journaled: LMDB through its open
environment, the spool through the descriptors it keeps of each segment it
wrote. So :func:`rehome` re-creates a journal at the same path and carries
the run over to it: its meta (registration, spec, the sinks' memory), every
entry under its own sequence number, each sink's acknowledged offset and
batch in flight, and the losses counted. The old handle then refuses appends
(``JournalMovedError``) so that a call racing the move appends again on the
new one. Starting the uplink on the new journal is the run's business
(``primeruns.rehoming``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from primeruns.exceptions import JournalError
from primeruns.journal.capacity import K_COMPACTED_KINDS
from primeruns.journal.frames import EntryKind
from primeruns.journal.journal import Durability, Journal
from primeruns.journal.meta import K_BUDGET
from primeruns.journal.origin import K_ORIGIN, Origin
from primeruns.journal.store import detach_store
from primeruns.journal.types import loss_counts

__all__ = ["gone", "leave_if_cut_short", "rehome"]

_READ_ENTRIES = 1000
_READ_BYTES = 16 << 20


def gone(journal: Journal, inode: tuple[int, int] | None) -> str | None:
    """Why ``journal``'s directory is no longer where it was ("deleted",
    "moved"), or None. ``inode``: the directory's (st_dev, st_ino) when it
    was opened (None: only the cheap check, the open segment's link count)."""
    appender = journal._appender
    if appender is not None and appender.unlinked():
        return "deleted"
    if inode is None:
        return None
    try:
        st = os.stat(journal.path)
    except FileNotFoundError:
        return "moved"  # its files still have a name (else "deleted" above): elsewhere
    except OSError:
        return None
    if (st.st_dev, st.st_ino) != inode:
        return "moved"
    return None


def leave_if_cut_short(journal: Journal) -> bool:
    """The open spool segment was truncated under the run: go on in a new
    one (``Appender.leave_if_cut_short``). True if so."""
    appender = journal._appender
    return appender is not None and appender.leave_if_cut_short()


def directory_id(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of ``path``, or None where it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def rehome(old: Journal) -> Journal:
    """Re-create ``old`` (a producer's journal) at its path, with the run's
    meta, entries, offsets and losses; the old handle refuses appends from
    here on. Call with no uplink reading or writing ``old`` (its offsets must
    be final). Raises JournalError where that cannot be done whole: the
    caller then counts what it cannot keep."""
    appender = old._appender
    if appender is None:
        raise JournalError(f"journal {old.path} is not this process's to re-create")
    with appender.lock:  # no append to the old handle from here on
        appender.moved = True
        try:
            new = _copy(old)
        except BaseException:
            appender.moved = False
            # The run goes on in this handle (``rehoming``): its mover and
            # background sync back (quiesced, its spool was never moved into
            # LMDB again, nothing compacted, and a budget it counts against
            # filled up with records the uplink had shipped).
            old.resume()
            raise
    if new._appender is not None:
        # What a full disk refused goes on waiting, now for the new journal.
        appender.hand_over_held(new._appender)
    return new


def _copy(old: Journal) -> Journal:
    meta = {k: v for k, v in old.all_meta().items() if not k.startswith("journal.")}
    compacted = old.get_meta(K_COMPACTED_KINDS)
    if compacted is not None:
        meta[K_COMPACTED_KINDS] = compacted
    budget = old.get_meta(K_BUDGET)
    kwargs = {"max_bytes": budget} if isinstance(budget, int) and budget > 0 else {}
    path = old.path
    durability: Durability = "fsync" if old.durability == "fsync" else "process"
    # The old handle's threads and its LMDB environment act by name: none
    # may touch what is created at its path now.
    old.quiesce()
    detach_store(old._store)
    # The same journal, carried on: it keeps its origin (a sync journal
    # takes only copies of the journal its origin names, and one made from
    # a copy taken before the move would refuse every later copy).
    origin = Origin.from_json(old.get_meta(K_ORIGIN))
    new = Journal.create(
        path.parent,
        local_id=path.name,
        durability=durability,
        meta=meta,
        origin=origin,
        **kwargs,
    )
    try:
        _copy_entries(old, new)
        for sink in old.cursors():
            cursor = old.cursor(sink)
            if cursor.acked:
                new.ack(sink, cursor.acked)
            if cursor.inflight is not None:
                new.set_inflight(sink, cursor.inflight)
        losses = old.losses()
        for sink, count in loss_counts(losses).items():
            if count:
                reasons = losses[sink].get("reasons") or ["counted before the move"]
                new.record_loss(sink, count, str(reasons[-1]))
    except BaseException:
        new.close()
        # Made by this call a moment ago and of no use now (the run ships
        # from the old handle): left, it held the run's registration without
        # its offsets, for a replay to send again what was shipped, and the
        # old handle's mover, resumed, would act on its files by name.
        shutil.rmtree(new.path, ignore_errors=True)
        raise
    return new


def _copy_entries(old: Journal, new: Journal) -> None:
    """Every entry of ``old`` into ``new`` under its own seq; a gap (entries
    compacted away) is refused: the seqs would no longer line up."""
    upto, end = 0, old.last_seq()
    while upto < end:
        result = old.read(upto, max_entries=_READ_ENTRIES, max_bytes=_READ_BYTES)
        entries = list(result.entries)
        if not entries or entries[0].seq != upto + 1:
            raise JournalError(
                f"journal {old.path}: entry {upto + 1} cannot be read to carry it over"
            )
        start = 0
        while start < len(entries):
            kind: EntryKind = entries[start].kind
            stop = start + 1
            while stop < len(entries) and entries[stop].kind == kind:
                stop += 1
            group = entries[start:stop]
            appended = new.append(kind, [e.payload for e in group], essential=True)
            # A gap inside the group shows here: the seqs would not line up.
            if (
                appended.dropped
                or appended.first_seq != group[0].seq
                or (group[-1].seq != group[0].seq + len(group) - 1)
            ):
                raise JournalError(f"journal {new.path}: could not carry entries over")
            start = stop
        upto = entries[-1].seq
