"""The sync journal: where a copied journal is shipped from, so copies can come again.

On a cluster the runs directory is copied from compute nodes to a login node
(rsync, scp, ``cp -a``), usually again and again while the job runs, and
synced there. A copy cannot hold its own shipping state: the next copy
overwrites it, and with it the registration and the acknowledged offsets, so
the next sync would register the run again and ship everything twice.

So a copy is never written, nor is the original by the commands that ship
it (a copy taken before the original shipped would hold none of that
state). Its entries are imported, in order and under
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
  stopped). A final copy (its producer gone) is imported past it: no copy
  will bring it, and the sync journal's sinks count it lost (damage that
  ends the copy, past the sync journal's end where no sink reads, is
  counted for each of them at the import).
- A copy of a journal that was already shipping (an online run: its uplink
  registered it and acknowledged offsets) hands that state over once, when
  the sync journal is created, so what the uplink shipped is not shipped again
  (what it compacted once every sink acknowledged it is not looked for).
- Losses the producer counted (its byte budget, a full disk) are carried over
  as they grow, so the sync journal's report is the run's; so is the run's
  spec from a copy no older than what was imported (an evaluation's config
  edited before ``finish()`` is stored in it then, and the close-out sends it).

- A damaged journal that will not change (its producer gone) and that no
  sync journal took yet becomes one itself (:func:`adopt_repaired`): its
  private snapshot, rebuilt from what is intact.

The sync root is trusted as a runs directory is (``journal.trust``): nothing
is made, read or renamed in one that is a link, or that another user owns or
could write into (``copies.check_sync_root``): they could read what is
synced, or swap or plant sync journals, and with them registrations and
offsets (records shipped to another run, or skipped). A copy is read only
from a journal directory a journal may live in: not through a link, not
another user's.

The sequence numbers of the sync journal and of every copy of one journal
are the same numbers; that is what makes a later copy's entries line up.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from primeruns.logs import get_logger

from ..exceptions import JournalCorruptError, JournalError
from ..journal import CursorState, Damage, Entry, EntryKind, Journal, ReadResult
from ..journal.capacity import K_COMPACTED_KINDS
from ..journal.frames import FLAG_ZSTD, peek_header
from ..journal.origin import K_ORIGIN, ORIGIN_FILE, Origin
from ..journal.store import DATA_NAME
from ..journal.tail import K_FLOOR, as_floor
from ..journal.trust import UntrustedPathError, check_dir
from ..journal.types import as_count, loss_counts
from ..sinks.kinds import SINK_KINDS, sink_names
from ..spec import SPEC_KEY, SpecError, stored_spec
from . import lineage, sync_records
from .copies import (
    K_SOURCE_LOSSES,
    K_SOURCE_PATH,
    check_sync_root,
    make_sync_root,
    sync_root,
    uncarried,
    valid_local_id,
)
from .workfolders import working_folder

__all__ = [
    "K_SOURCE_ORIGIN",
    "Imported",
    "adopt_repaired",
    "fingerprint",
    "import_new",
    "open_sync_journal",
    "snapshot",
    "sync_root",
]

log = get_logger("primeruns.ship")

K_SOURCE_ORIGIN = "sync.origin"  # the copied journal's origin (who may still write it)
# The last entry of the damage ending a final copy that was counted lost.
K_SOURCE_DAMAGE = "sync.source_damage_at_end"

_READ_ENTRIES = 1000
_READ_BYTES = 16 << 20


@dataclass(frozen=True)
class Imported:
    """What one import did: ``entries`` new entries; the sync journal now
    holds the copy's entries up to ``upto``; ``stopped`` says why it did not
    go further when the copy holds more (a missing or damaged entry)."""

    entries: int
    upto: int
    source_end: int
    stopped: str | None = None
    passed: tuple[Damage, ...] = ()
    """What a final import passed over (``import_new``)."""


# Meta that is the journal's own (format, ids, owner, budget, dictionaries,
# compaction): never handed from a copy to the sync journal.
_OWN_META = ("journal.",)
# Nor how far its own shipping went (``state``: shipped): the sync journal
# says so of itself once it shipped, and a take-over or a sync that finds it
# so passes the journal over (``ranks.shipped_through_sync``). Whether the
# run was closed (``finalized``) is the run's, and is handed over: it is not
# closed again. A claim planted in a copy cannot be told from a real one
# without asking the platform, and closing again is not harmless: an
# evaluation's finalize is not idempotent (it enqueues the platform's
# statistics task; a repeat's answer is unspecified), and the SDK never
# sends it twice. A claim that is not a close-out's (``{}``, damage) closes
# nothing (``Lifecycle.finalized``).
_OWN_KEYS = frozenset({"state"})


def open_sync_journal(source: Journal, root: Path) -> tuple[Journal, bool]:
    """The sync journal of ``source`` (a copy, or an original whose producer
    is gone, opened read-only), created on first use: (journal, created).
    Raises JournalLockedError while another sync ships it, JournalError if it
    cannot be made, belongs to another journal of the same local id, or was
    one that shipped and is gone (:mod:`primeruns.ship.sync_records`).

    It is made whole under a temporary name (the copy's state handed over)
    and renamed into place: a sync interrupted while making it leaves no
    sync journal that lacks the offsets its copy had shipped."""
    local_id = valid_local_id(source.local_id)
    check_sync_root(root)
    path = root / local_id
    made = not (path / DATA_NAME).exists()
    written_here = False
    if made:
        # One that shipped and is gone (deleted, or pruned by gc): a new one
        # would ship everything again.
        sync_records.refuse_if_shipped(root, local_id, bound=_bound(source))
        written_here = _create(source, root, local_id)
    # One this process just made is not walked in a child first (``probe``:
    # ~80 ms, a third of a sync's start), one another sync made meanwhile is.
    journal = Journal.open(path, owner=True, written_here=written_here)
    claimed = Origin.from_json(journal.get_meta(K_SOURCE_ORIGIN))
    mine = Origin.from_json(source.get_meta(K_ORIGIN))
    if claimed is not None and mine is not None and claimed != mine:
        journal.close()
        raise JournalError(
            f"{source.path} is not the journal {path} syncs (both say local id "
            f"{local_id!r}, written by {mine.describe()} and {claimed.describe()}): not syncing it"
        )
    if (claimed is None or mine is None) and not made:
        # No origin to compare on one side: the records both hold tell.
        differs = lineage.differs_at(source, journal)
        if differs is not None:
            journal.close()
            raise JournalError(
                f"{source.path} is not the journal {path} syncs (both say local id "
                f"{local_id!r}, but entry {differs} is another record in each, and "
                f"{'the copy' if mine is None else 'the sync journal'} names no origin): "
                "not syncing it"
            )
    return journal, made


def _bound(source: Journal) -> bool | None:
    """Whether ``source`` ships into a platform run its sync journal does not
    choose (online, attached by id, or keyed): a new sync journal of it
    ships, and closes, that run again. None where its meta cannot tell."""
    try:
        if isinstance(source.get_meta("platform"), dict):
            return True
        spec = source.get_meta(SPEC_KEY)
    except JournalError:
        return None
    if not isinstance(spec, dict):
        return None
    return bool(spec.get("attach_id") or spec.get("run_key"))


def adopt_repaired(
    taken: Path, copy: Path, origin: Origin, root: Path, local_id: str, end: int
) -> Journal:
    """Make ``taken``, a private snapshot of the damaged ``copy`` (of the
    journal ``origin`` wrote, ending at ``end``), the sync journal of
    ``local_id``: rebuilt from what is intact (the damaged file kept beside
    it), then renamed into place and opened as owner. Its shipping state, if
    the copy had any, is the copy's own. JournalError as ``open_sync_journal``."""
    local_id = valid_local_id(local_id)
    check_sync_root(root)
    sync_records.refuse_if_shipped(root, local_id)
    with Journal.open(taken, owner=True, repair=True) as journal:
        journal.set_meta(K_SOURCE_ORIGIN, origin.to_json())
        journal.set_meta(K_SOURCE_PATH, {"path": str(copy), "imported_upto": end})
        # The losses it holds are the copy's own: a later copy of the same
        # journal counts them again unless they are marked carried over.
        journal.set_meta(K_SOURCE_LOSSES, loss_counts(journal.losses()))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(taken / ORIGIN_FILE)  # it is no one's original now
    try:
        os.rename(taken, root / local_id)
    except OSError:
        raise JournalError(
            f"{root / local_id} appeared while {copy} was repaired: sync again"
        ) from None
    return Journal.open(root / local_id, owner=True)


def _create(source: Journal, root: Path, local_id: str) -> bool:
    """Make the sync journal; whether this process's is the one in place
    (False: another sync's was renamed there first)."""
    meta = {
        key: value
        for key, value in source.all_meta().items()
        if not key.startswith(_OWN_META) and key not in _OWN_KEYS
    }
    meta[K_SOURCE_ORIGIN] = source.get_meta(K_ORIGIN)
    budget = source.get_meta("journal.max_bytes")
    kwargs: dict[str, Any] = {}
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        kwargs["max_bytes"] = budget
    make_sync_root(root)
    with working_folder(root, ".creating-") as staging:
        journal = Journal.create(staging, local_id=local_id, meta=meta, **kwargs)
        try:
            _hand_over_shipping(source, journal)
        finally:
            journal.close()
        try:
            os.rename(staging / local_id, root / local_id)
        except OSError as exc:
            if not (root / local_id / DATA_NAME).exists():  # not a sync that made it meanwhile
                raise JournalError(
                    f"cannot make the sync journal {root / local_id} ({exc.strerror}): "
                    "something that is not a sync journal is there; move it away and sync again"
                ) from None
            return False
        return True


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
    through = _compacted_through(source, cursors)
    if through:
        _carry_kept(source, dest, through)
    done = import_new(source, dest, after=through)
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


def _compacted_through(source: Journal, cursors: dict[str, CursorState]) -> int:
    """The last of the entries before the copy's first that its uplink
    compacted away (its byte budget) once every sink acknowledged them, or
    0: nothing to import there. Entries missing that a sink did not
    acknowledge were not compacted: the copy lacks them."""
    if not cursors:
        return 0
    first = source.read(0, max_entries=1).entries
    through = first[0].seq - 1 if first else 0
    # Compaction keeps the run's spec, finish and last summary: the first
    # entry of a compacted copy is its spec, and the floor says how far the
    # entries after it were compacted.
    with contextlib.suppress(JournalError):
        through = max(through, as_floor(source.get_meta(K_FLOOR)))
    return through if through <= min(c.acked for c in cursors.values()) else 0


def _carry_kept(source: Journal, dest: Journal, through: int) -> None:
    """Import the entries compaction kept up to ``through`` (the run's spec,
    finish and last summary; a crash is closed out with that summary) under
    their own seqs, and take ``through`` as ``dest``'s compaction floor, with
    the copy's compacted counts, so the entries between them are compacted
    ones there too, not missing. Of the summaries a journal compacted before
    superseded ones were removed, the last alone is imported."""
    kept: list[Entry] = []
    summary: Entry | None = None
    summaries = 0
    after = 0
    while after < through:
        result = source.read(after, max_entries=_READ_ENTRIES, max_bytes=_READ_BYTES)
        for entry in result.entries:
            if entry.seq > through:
                break
            if entry.kind == EntryKind.SUMMARY:
                summary, summaries = entry, summaries + 1
            else:
                kept.append(entry)
        if result.next_after <= after:
            break
        after = result.next_after
    if summary is not None:
        kept = sorted([*kept, summary], key=lambda e: e.seq)
    for entry in kept:
        dest.appends_follow(entry.seq - 1)
        _append_in_order(dest, [entry])
    counts = source.compacted()
    counts[int(EntryKind.SUMMARY)] += max(0, summaries - 1)
    compacted = {str(kind): n for kind, n in (+counts).items()}
    dest.compact(())  # compacts nothing: moves what was appended into LMDB, under the floor
    dest.update_meta({K_FLOOR: through, K_COMPACTED_KINDS: compacted})


def import_new(
    source: Journal,
    dest: Journal,
    *,
    final: bool = False,
    after: int = 0,
    held_elsewhere: Callable[[int], bool] | None = None,
) -> Imported:
    """Append to ``dest`` the entries ``source`` holds beyond ``dest``'s end,
    under the same sequence numbers, stopping at the first one missing or
    damaged in ``source``; carry over the losses ``source`` counted since.
    ``final``: no later copy will bring what this one lacks (its producer
    is gone): such an entry, followed by one the copy holds, is passed
    over, missing in ``dest``, where each sink counts it lost, as in a
    damaged copy made the sync journal (``adopt_repaired``); one at the
    copy's end is passed over too, nothing after it imported. ``after``: the
    seq the copy's entries begin past, none before it to import
    (``_compacted_through``). ``held_elsewhere(seq)``: whether the copy's
    original still holds intact an entry the copy lacks or holds damaged; a
    final import stops there too, as a copy that is not final does (the
    copy is behind its original, which a later copy brings whole)."""
    upto = max(dest.last_seq(), after)
    dest.appends_follow(upto)  # the copy's entries, under their own seqs
    # Past the copy's last entry, those damage cost its newest spool segment
    # (``SpoolView.lost_at_end``): the import stops at them as at any other
    # damage, rather than take the damage for the copy's end.
    end = source.damaged_end()
    if end >= upto:  # not older than what was imported before
        _carry_spec(source, dest)
    count = 0
    stopped: str | None = None
    passed: list[Damage] = []
    dictionaries = _Dictionaries(source, dest)
    while upto < end:
        result = source.read(upto, max_entries=_READ_ENTRIES, max_bytes=_READ_BYTES, frames=True)
        run: list[Entry] = []
        for entry in result.entries:
            if entry.seq != upto + len(run) + 1:
                break
            run.append(entry)
        if run:
            _import_run(dest, run, result.frames, dictionaries)
            upto += len(run)
            count += len(run)
            continue  # the next read starts right after, and meets any gap first
        skipped = source.skipped_after(upto)
        if skipped > upto:
            # Lost past its end, its owner appended after them: no copy brings them.
            dest.appends_follow(skipped)
            upto = skipped
            continue
        # The entry after ``upto`` is missing or damaged in this copy (torn
        # mid-write, or damaged on disk): a later copy brings it, if any will.
        gap = _gap_after(upto, end, result)
        if not final or gap.seq is None or (held_elsewhere is not None and held_elsewhere(gap.seq)):
            stopped = gap.what
            break
        passed.append(gap)
        if upto + gap.entries >= end:
            # The copy's last entries, damaged for good (a job killed while
            # it wrote them): nothing follows to import. Stopped there, the
            # run would stay open for good. Past the sync journal's end no
            # sink reads them, so they are counted lost here, as a sink
            # counts damage it reads (as the shippers of a repaired copy
            # made the sync journal count them: ``adopt_repaired``).
            _count_lost_at_end(source, dest, upto, gap)
            break
        dest.appends_follow(upto + gap.entries)
        upto += gap.entries
    _carry_losses(source, dest)
    dest.set_meta(K_SOURCE_PATH, {"path": str(source.path), "imported_upto": upto})
    return Imported(entries=count, upto=upto, source_end=end, stopped=stopped, passed=tuple(passed))


def _count_lost_at_end(source: Journal, dest: Journal, upto: int, gap: Damage) -> None:
    """Count ``gap``, damage that ends the final copy ``source`` after entry
    ``upto``, lost for each of the run's sinks that a read of its own kinds
    reports it to, with its reason: as its shipper counts damage it reads
    (``Shipper._count_damage``: an entry whose header still names its kind
    is damage to the sinks of that kind alone, a missing one or one whose
    header is gone to every sink). Once: a later copy damaged the same way
    counts nothing again (``K_SOURCE_DAMAGE``: the last entry counted)."""
    assert gap.seq is not None
    last = gap.seq + gap.entries - 1
    through = max(upto, as_count(dest.get_meta(K_SOURCE_DAMAGE)) or 0)
    if through >= last:
        return
    for sink in _run_sinks(dest):
        kinds = SINK_KINDS.get(sink)
        if kinds is None:
            continue
        result = source.read(upto, kinds=kinds, max_entries=_READ_ENTRIES, max_bytes=_READ_BYTES)
        lost, reasons = 0, []
        for damage in result.damaged:
            if damage.seq is None:
                continue
            first, final = max(damage.seq, through + 1), min(damage.seq + damage.entries - 1, last)
            if final >= first:
                lost += final - first + 1
                reasons.append(damage.what)
        if lost:
            dest.record_loss(sink, lost, f"damaged: {'; '.join(reasons[:3])}")
    dest.set_meta(K_SOURCE_DAMAGE, last)


def _run_sinks(journal: Journal) -> list[str]:
    """The sinks the run of ``journal`` ships to (by its spec's kind; those
    that shipped from it already where the spec cannot be read)."""
    try:
        return sink_names(stored_spec(journal.get_meta(SPEC_KEY)).kind)
    except (SpecError, JournalCorruptError):  # of another shape, or not JSON
        return sorted(journal.cursors())


def _gap_after(upto: int, end: int, result: ReadResult) -> Damage:
    """What stands in the copy (ending at ``end``) where the entry after
    ``upto`` is not, read in ``result``: its damage, or the entries missing
    up to the next one it holds (seq None: damage of its structure, which
    tells no entry)."""
    # Its own damage first: a read lists the damage of the structure (a key
    # no entry has) as its walk meets it, before what decoding finds, so
    # such a key anywhere past the entry came first, and a final copy
    # stopped at an entry it passes over, taken for structure.
    damaged = next((d for d in result.damaged if d.seq == upto + 1), None)
    if damaged is None:
        damaged = next((d for d in result.damaged if d.seq is None), None)
    if damaged is not None:
        return replace(damaged, entries=min(max(damaged.entries, 1), end - upto))
    following = result.entries[0].seq if result.entries else end + 1
    return Damage(upto + 1, f"entry {upto + 1} is missing from the copy", following - upto - 1)


def _carry_spec(source: Journal, dest: Journal) -> None:
    """The run's spec as the copy's producer last stored it: an evaluation's
    config edited before ``finish()`` is stored then, in a journal whose
    sync journal was made from a copy taken earlier, and the close-out
    sends it. One that cannot be read (damage: not JSON, or of another
    shape) is not carried: the sync journal keeps what it holds (the
    user's ``--spec``)."""
    try:
        spec = source.get_meta(SPEC_KEY)
    except JournalCorruptError:
        return
    if spec is None or spec == dest.get_meta(SPEC_KEY):
        return
    try:
        stored_spec(spec)
    except SpecError:
        return
    dest.set_meta(SPEC_KEY, spec)


class _Dictionaries:
    """Which of the copy's zstd dictionaries the sync journal holds under
    the same id (adopted on first use): the frames that name one are
    stored as they are."""

    def __init__(self, source: Journal, dest: Journal) -> None:
        self._source = source
        self._dest = dest
        self._held: dict[int, bool] = {0: True}

    def held(self, dict_id: int) -> bool:
        found = self._held.get(dict_id)
        if found is None:
            data = self._source.dictionary(dict_id)
            found = data is not None and self._dest.adopt_dictionary(dict_id, data)
            self._held[dict_id] = found
        return found


def _import_run(
    dest: Journal, run: list[Entry], frames: dict[int, bytes], dictionaries: _Dictionaries
) -> None:
    """Append ``run`` (consecutive seqs, dest's next), each entry's
    compressed frame stored as it is where it can be: decoded (so verified)
    by the read, it need not be compressed again (a replay of 20,000 gsm8k
    episodes: 12.8-13.7 s of its own CPU, 10.9-11.4 s so; the mover's
    compression of them was most of the difference). The others (raw
    in the copy: its spool's; naming a dictionary the sync journal holds
    another of under its id) are appended as payloads, compressed here."""
    start = 0
    while start < len(run):
        whole = _stored_as_is(frames.get(run[start].seq), dictionaries)
        stop = start + 1
        while stop < len(run) and (_stored_as_is(frames.get(run[stop].seq), dictionaries) == whole):
            stop += 1
        part = run[start:stop]
        if not (whole and dest.put_frames([(e.seq, frames[e.seq]) for e in part])):
            _append_in_order(dest, part)
        start = stop


def _stored_as_is(frame: bytes | None, dictionaries: _Dictionaries) -> bool:
    """Whether ``frame`` (verified) goes into the sync journal as it is: a
    compressed one whose dictionary, if any, the sync journal holds."""
    if frame is None:
        return False
    head = peek_header(frame)
    return bool(head.flags & FLAG_ZSTD) and dictionaries.held(head.dict_id)


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
    """Count in ``dest`` what ``source`` counted lost beyond what earlier
    imports carried over (``uncarried``), and remember how far that is."""
    losses = source.losses()
    counts = loss_counts(losses)
    seen = dest.get_meta(K_SOURCE_LOSSES)
    more = uncarried(counts, seen)
    if not more:
        return
    for sink, count in more.items():
        said = losses[sink].get("reasons") or []
        reason = str(said[-1]) if said else "counted by the producer"
        dest.record_loss(sink, count, reason)
    kept = seen if isinstance(seen, dict) else {}
    dest.set_meta(K_SOURCE_LOSSES, {**kept, **{sink: counts[sink] for sink in more}})


def _files(directory: Path | int) -> dict[str, tuple[int, int]]:
    """The regular files of a copied journal (name: size, mtime), LMDB's lock
    file aside (a reader of the copy may write it; it holds no data).
    ``directory``: its path, or a descriptor of it open."""
    out: dict[str, tuple[int, int]] = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name == "lock.mdb" or not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            out[entry.name] = (st.st_size, st.st_mtime_ns)
    return out


def fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a copy is refreshed (its files' names, sizes and times)."""
    try:
        return tuple(sorted((name, *state) for name, state in _files(directory).items()))
    except OSError:
        return ()


#: How to fix a copy that is a link, or that another user could write into.
_OWN_COPY = (
    "name the journal's real directory, in a folder of your own that only you can "
    "write (copy it there with cp -a if it is not)"
)


@contextlib.contextmanager
def snapshot(copy: Path, root: Path) -> Iterator[Path]:
    """A private copy of a copied journal's files, to read from instead of the
    copy itself: a copy refreshed in place (``cp -a``) may be truncated under
    a reader's memory map (SIGBUS), and a reader writes LMDB's lock file; a
    snapshot is neither. Taken again while the copy changes under it (three
    tries, then JournalError: sync again once the copy is done).
    UntrustedPathError for a copy reached through a link or another user's
    (as ``Journal.open`` refuses a journal directory), or an untrusted root."""
    check_dir(copy, "journal directory", advice=_OWN_COPY)
    make_sync_root(root)
    # Read through a descriptor of the folder checked: in a folder others
    # may write in, its name may be given to another folder, or a link,
    # once it is checked (what it holds is its owner's alone).
    folder = _open_checked(copy)
    try:
        for _ in range(3):
            before = _files(folder)
            with working_folder(root, ".snapshot-") as holder:
                target = holder / copy.name
                target.mkdir(mode=0o700)
                for name in before:
                    _copy_file(copy / name, target / name, folder)
                if _files(folder) == before:
                    # Its tree is walked in a child when opened (``probe``), even
                    # if its original's was as ``stat`` still sees it: bytes can
                    # change unseen by ``stat`` (a write through a shared mapping
                    # to a page already dirty; a network filesystem's cached
                    # attributes). Walked here, the bytes walked are the bytes
                    # mapped: no one else writes a snapshot.
                    yield target
                    return
    finally:
        os.close(folder)
    raise JournalError(f"{copy} kept changing while it was read: sync again once it is copied")


def _open_checked(copy: Path) -> int:
    """A descriptor of the folder ``copy`` names, checked as ``check_dir``
    checked the name (UntrustedPathError if it is no longer that folder)."""
    try:
        fd = os.open(copy, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        check_dir(copy, "journal directory", advice=_OWN_COPY)  # (a link now: says so)
        raise JournalError(f"cannot read {copy}: {exc.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise UntrustedPathError(
            f"the journal directory {copy} was replaced while it was read: {_OWN_COPY}"
        )
    return fd


def _copy_file(source: Path, dest: Path, folder: int) -> None:
    # ``source`` is opened in ``folder`` (a descriptor of its folder, by its
    # name there), never through its path's folders. A copy's file swapped
    # for a FIFO after the listing would block the open (O_NONBLOCK: it
    # returns at once), and a device would be read for ever: only a regular
    # file is copied.
    fd = os.open(
        source.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder
    )
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise JournalError(f"{source} is not a regular file: not syncing this copy")
    with os.fdopen(fd, "rb") as src:
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
