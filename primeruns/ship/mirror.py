"""The sync journal: where a copied journal is shipped from, so copies can come again.

On a cluster the runs directory is copied from compute nodes to a login node
(rsync, scp, ``cp -a``), usually again and again while the job runs, and
synced there. A copy cannot hold its own shipping state: the next copy
overwrites it, and with it the registration and the acknowledged offsets, so
the next sync would register the run again and ship everything twice.

So a copy is never written. Its entries are imported, in order and under
their own sequence numbers, into a journal of the syncing user,
``$XDG_STATE_HOME/prime-runs/synced/<local id>`` (:func:`sync_root`), and
shipped from there with the same uplink a live run uses. That journal keeps
the registration, the offsets, the batches in flight and the sinks' memory
across any number of copies; each sync imports only what the newest copy
holds beyond it, so a pass over an unchanged copy costs the platform nothing.

- Entries are imported as a contiguous run from the sync journal's end: a
  copy taken mid-write may miss an entry or hold a damaged one, and then the
  import stops there, for a later copy to fill in (nothing is counted lost
  while the producer may still write; :func:`import_new` says where it
  stopped).
- A copy of a journal that was already shipping (an online run: its uplink
  registered it and acknowledged offsets) hands that state over once, when
  the sync journal is created, so what the uplink shipped is not shipped again.
- Losses the producer counted (its byte budget, a full disk) are carried over
  as they grow, so the sync journal's report is the run's.

The sequence numbers of the sync journal and of every copy of one journal
are the same numbers; that is what makes a later copy's entries line up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..exceptions import JournalError
from ..journal import Entry, EntryKind, Journal
from ..journal.origin import K_ORIGIN

__all__ = [
    "K_SOURCE_ORIGIN",
    "Imported",
    "import_new",
    "open_sync_journal",
    "sync_journal_path",
    "sync_root",
]

log = logging.getLogger("primeruns.ship")

K_SOURCE_ORIGIN = "sync.origin"  # the copied journal's origin (who may still write it)
K_SOURCE_PATH = "sync.source"  # the copy last imported from
K_SOURCE_LOSSES = "sync.source_losses"  # per sink: the copy's loss count already carried over

_READ_ENTRIES = 1000
_READ_BYTES = 16 << 20


def sync_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/prime-runs/synced`` (``~/.local/state`` by default):
    beside the default runs directory, never inside a directory copies land in
    (``rsync --delete`` would remove it)."""
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state).expanduser() / "prime-runs" / "synced"


def sync_journal_path(local_id: str, root: Path | None = None) -> Path:
    return (root or sync_root()) / local_id


@dataclass(frozen=True)
class Imported:
    """What one import did: ``entries`` new entries; the sync journal now
    holds the copy's entries up to ``upto``; ``stopped`` says why it did not
    go further when the copy holds more (a missing or damaged entry)."""

    entries: int
    upto: int
    source_end: int
    stopped: str | None = None


# Meta that is the journal's own (format, ids, owner, budget, dictionaries,
# compaction): never handed from a copy to the sync journal.
_OWN_META = ("journal.",)


def open_sync_journal(source: Journal, root: Path) -> tuple[Journal, bool]:
    """The sync journal of ``source`` (a copy, opened read-only), created on
    first use: (journal, created). Raises JournalLockedError while another
    sync ships it, JournalError if it cannot be made."""
    path = root / source.local_id
    if path.exists():
        return Journal.open(path, owner=True), False
    meta = {key: value for key, value in source.all_meta().items() if not key.startswith(_OWN_META)}
    meta[K_SOURCE_ORIGIN] = source.get_meta(K_ORIGIN)
    budget = source.get_meta("journal.max_bytes")
    kwargs: dict[str, Any] = {}
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        kwargs["max_bytes"] = budget
    journal = Journal.create(root, local_id=source.local_id, meta=meta, **kwargs)
    try:
        _hand_over_shipping(source, journal)
    except BaseException:
        journal.close()
        raise
    return journal, True


def _hand_over_shipping(source: Journal, dest: Journal) -> None:
    """A copy that was shipping already (an online run): import up to what it
    acknowledged and take its offsets and in-flight batches, so that nothing
    it shipped is shipped again. A copy that never shipped has none."""
    cursors = {sink: source.cursor(sink) for sink in source.cursors()}
    need = max(
        [c.acked for c in cursors.values()]
        + [c.inflight.last_seq for c in cursors.values() if c.inflight is not None]
        + [0]
    )
    if need == 0:
        return
    done = import_new(source, dest)
    if done.upto < need:
        raise JournalError(
            f"the copy at {source.path} holds entries only up to {done.upto} "
            f"({done.stopped or 'compacted or missing'}), but its run already shipped up to "
            f"{need}: copy the journal again once its job has ended"
        )
    for sink, cursor in cursors.items():
        if cursor.acked:
            dest.ack(sink, cursor.acked)
        if cursor.inflight is not None:
            dest.set_inflight(sink, cursor.inflight)


def import_new(source: Journal, dest: Journal) -> Imported:
    """Append to ``dest`` the entries ``source`` holds beyond ``dest``'s end,
    under the same sequence numbers, stopping at the first one missing or
    damaged in ``source``; carry over the losses ``source`` counted since."""
    upto = dest.last_seq()
    end = source.last_seq()
    count = 0
    stopped: str | None = None
    while upto < end:
        result = source.read(upto, max_entries=_READ_ENTRIES, max_bytes=_READ_BYTES)
        run: list[Entry] = []
        for entry in result.entries:
            if entry.seq != upto + len(run) + 1:
                break
            run.append(entry)
        if run:
            _append_in_order(dest, run)
            upto += len(run)
            count += len(run)
            continue  # the next read starts right after, and meets any gap first
        # The entry after ``upto`` is missing or damaged in this copy (torn
        # mid-write, or damaged on disk): a later copy brings it.
        damaged = next((d.what for d in result.damaged if d.seq in (None, upto + 1)), None)
        stopped = damaged or f"entry {upto + 1} is missing from the copy"
        break
    _carry_losses(source, dest)
    dest.set_meta(K_SOURCE_PATH, {"path": str(source.path), "imported_upto": upto})
    return Imported(entries=count, upto=upto, source_end=end, stopped=stopped)


def _append_in_order(dest: Journal, entries: list[Entry]) -> None:
    """Append ``entries`` (consecutive seqs, dest's next) grouped by kind,
    checking that each lands under its own number."""
    start = 0
    while start < len(entries):
        kind: EntryKind = entries[start].kind
        stop = start
        while stop < len(entries) and entries[stop].kind == kind:
            stop += 1
        group = entries[start:stop]
        result = dest.append(kind, [e.payload for e in group], essential=True)
        if result.dropped or result.first_seq != group[0].seq:
            raise JournalError(
                f"the sync journal {dest.path} could not take entries {group[0].seq}-"
                f"{group[-1].seq} ({'full' if result.dropped else 'out of order'}): "
                "free disk space there and sync again"
            )
        start = stop


def _carry_losses(source: Journal, dest: Journal) -> None:
    seen = dest.get_meta(K_SOURCE_LOSSES) or {}
    if not isinstance(seen, dict):
        seen = {}
    changed = False
    for sink, loss in source.losses().items():
        count = loss.get("count", 0) if isinstance(loss, dict) else 0
        if not isinstance(count, int) or isinstance(count, bool):
            continue
        before = seen.get(sink, 0) if isinstance(seen.get(sink), int) else 0
        if count > before:
            reasons = loss.get("reasons") or []
            reason = str(reasons[-1]) if reasons else "counted by the producer"
            dest.record_loss(sink, count - before, reason)
            seen[sink] = count
            changed = True
    if changed:
        dest.set_meta(K_SOURCE_LOSSES, seen)
