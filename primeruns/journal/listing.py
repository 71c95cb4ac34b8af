"""Where runs live, and what the CLI's ``ls``/``rm`` need: listing and deletion.

Listing takes no lock and opens each journal read-only, so it works while runs
are live; a journal that cannot be read is listed with its damage instead of
raising. What it read of a journal is kept as the journal's summary
(``summary``), and a journal whose files did not change since is not opened
again: a listing costs what changed, not the runs directory's history (a
listing of the whole directory reads its summaries from one index of them:
``summary_index``).
Deletion takes the owner lock first, so a live run is never removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primeruns import jsonbound
from primeruns.exceptions import JournalError
from primeruns.journal import summary
from primeruns.journal.frames import EntryKind
from primeruns.journal.layout import dumps
from primeruns.journal.lock import (
    LOCK_NAME,
    OwnerInfo,
    OwnerLock,
    dead_for_good,
    owner_alive,
    read_owner,
)
from primeruns.journal.memo import Memo
from primeruns.journal.meta import K_OVERSIZED, K_UNREADABLE, MAX_META_BYTES, MAX_META_VALUES
from primeruns.journal.origin import boot_id
from primeruns.journal.probe import probe_many, unwalked, vouch
from primeruns.journal.stamps import STAMP_LEN, STAMPED
from primeruns.journal.store import DATA_NAME
from primeruns.journal.summary import WALKED_IN, Seen, Shelf
from primeruns.journal.summary_fields import (
    MetaBounds,
    fields_of,
    info_from,
    local_id_of,
    verified_in,
)
from primeruns.journal.summary_index import DeadOwner, Index, dead_owner_of
from primeruns.journal.trust import check_dir, check_dir_as, why_unreadable
from primeruns.journal.types import Damage, JournalInfo
from primeruns.logs import get_logger
from primeruns.settings import default_runs_dir  # PRIME_RUNS_DIR, read there

if TYPE_CHECKING:
    from primeruns.journal.journal import Journal

log = get_logger("primeruns")

_SALVAGE_PREFIX = "primeruns-salvage-"  # store._salvage's folder, left by an interrupted salvage

__all__ = [
    "MAX_FINISH_BYTES",
    "JournalInfo",
    "Memo",
    "default_runs_dir",
    "delete_journal",
    "finishes",
    "journal_dirs",
    "journal_info",
    "journal_infos",
    "list_journals",
    "made_before",
    "made_since",
]


#: The largest finish entry decoded: a finish record is a status, an error and
#: a summary, a few KB; one declaring more is never decompressed (a hostile
#: journal's 128 MiB entry took every listing through it).
MAX_FINISH_BYTES = 4 << 20


#: The entries a listing looks back through for the run's finish.
_FINISH_LOOKS_BACK = 16


def _finish_record(journal: Journal, last_seq: int) -> dict[str, Any] | None:
    """The run's last intact finish entry, if any. It is the last thing a
    run appends, so only the journal's tail is read (cheap on a long run),
    from its end.

    An entry at a time: one passed over by its header is paged in whole all
    the same (py-lmdb touches a value's pages as it hands it out), and the
    map is dropped between reads, never within one. A read of the last 16
    held 16 large episodes resident at once."""
    try:
        for seq in _finishes(journal, last_seq):
            tail = journal.read(
                seq - 1, kinds={EntryKind.FINISH}, max_entries=1, max_entry_bytes=MAX_FINISH_BYTES
            )
            if tail.oversized and tail.oversized[0][0] == seq:
                size = tail.oversized[0][2]
                return {
                    "status": "finished",
                    "error": f"its finish record ({size} bytes) is not read",
                }
            if tail.entries and tail.entries[0].seq == seq:
                try:
                    record = jsonbound.loads(tail.entries[0].payload, MAX_FINISH_BYTES)
                except ValueError:
                    return None
                return record if isinstance(record, dict) else None
    except Exception:  # damage is reported elsewhere; the state falls back to "crashed"
        return None
    return None


def finishes(journal: Journal) -> bool:
    """Whether ``journal`` holds the run's finish entry (its tail read as a
    listing reads it): for a journal opened without a listing (a copy read
    from a private snapshot)."""
    return _finish_record(journal, journal.last_seq()) is not None


def _finishes(journal: Journal, last_seq: int) -> Iterator[int]:
    """The seqs of the ``FINISH`` entries among the journal's last
    ``_FINISH_LOOKS_BACK``, last first, by their headers, one read each."""
    for seq in range(last_seq, max(0, last_seq - _FINISH_LOOKS_BACK), -1):
        head = journal.read(seq - 1, max_entries=1, max_entry_bytes=0)
        kinds = [kind for at, kind, _ in head.oversized if at == seq]
        if EntryKind.FINISH in kinds:
            yield seq


def _tallies(
    journal: Journal, cursors: dict[str, int], damage: list[Damage]
) -> dict[int, Counter[int]]:
    cuts = sorted({c for c in cursors.values() if c > 0})
    try:
        intervals = journal.tally(cuts)
    except JournalError as exc:  # reported; the listing keeps what it read
        damage.append(Damage(None, f"counting entries failed: {exc}"))
        return {}
    after: dict[int, Counter[int]] = {}
    running: Counter[int] = Counter()
    for start, counts in zip(reversed([0, *cuts]), reversed(intervals), strict=True):
        running = running + counts
        after[start] = running
    return after


#: A journal's owner as a listing found it: the one its lock file names, or
#: that one's description when the runs directory's index vouches that it is
#: dead for good (``summary_index.Index.dead_owner``), or None.
_Owner = OwnerInfo | str | None


@dataclass(frozen=True)
class _Look:
    """A journal as seen before it is opened: its files, its owner, and the
    summary kept of it when that is of its files as they are (``summary``)."""

    files: summary.Files
    owner: _Owner
    kept: dict[str, Any] | None
    remembered: JournalInfo | None = None  # from the caller's memo
    row: bool = False  # ``kept`` is the index's listing row (``summary_index``)

    def covers(self, *, verify: bool, tally: bool) -> bool:
        """Whether the kept summary holds all a listing asks for."""
        if self.remembered is not None:
            return True
        kept = self.kept
        if kept is None:
            return False
        return (not tally or kept.get("after") is not None) and (
            not verify or verified_in(kept) is not None
        )


def _look(
    path: Path,
    shelf: Shelf | None,
    owner: _Owner,
    memo: Memo | None = None,
    index: Index | None = None,
    *,
    verify: bool = False,
    tally: bool = False,
    seen: Seen | None = None,
    rows: bool = False,
) -> _Look:
    hit = memo.get(path) if memo is not None else None
    name = path.name  # (a property of Path made anew each time: a listing looks at thousands)
    if hit is None and index is not None:  # the stamp as the index has it
        known = index.files(name)
    else:
        known = hit[0] if hit is not None else None
    found = summary.files(path, known, seen)
    if hit is not None and found.stamp is not None and hit[0].stamp == found.stamp:
        return _Look(found, owner, None, hit[1])
    kept = None
    if shelf is not None:
        if rows and hit is None and index is not None:
            kept = index.row(name, found.stamp)  # (its meta: ``ROW_META``)
            if _Look(found, owner, kept).covers(verify=verify, tally=tally):
                return _Look(found, owner, kept, row=True)
            kept = None
        if kept is None and hit is None and index is not None:
            kept = shelf.load_text(name, found.stamp, index.summary_text(name))
            if not _Look(found, owner, kept).covers(verify=verify, tally=tally):
                kept = None  # its summary file may hold more (a scan gc made since)
        if kept is None:
            kept = shelf.load(name, found.stamp)
    return _Look(found, owner, kept)


def _info(
    path: Path,
    *,
    verify: bool,
    tally: bool,
    meta_bounds: MetaBounds = None,
    look: _Look | None = None,
    shelf: Shelf | None = None,
    written_here: bool = False,
    tally_most: int | None = None,
) -> JournalInfo:
    """The journal's state: from its summary when that is current and holds
    what is asked, else read from the journal (and kept in ``shelf``).
    ``written_here``: as ``Journal.open``'s. ``tally_most``: when the journal
    is read, ``tally`` holds only if it shows no damage and at most that many
    entries (``keep_summary``: one open decides and counts)."""
    look = look if look is not None else _look(path, shelf, read_owner(path))
    owner: str | None
    if isinstance(look.owner, str):  # dead for good, its lock file unchanged
        owner, alive = look.owner, False
    else:
        owner = look.owner.describe() if look.owner else None
        alive = owner_alive(look.owner, path)
    remembered = look.remembered
    if remembered is not None:
        if (
            remembered.owner == owner
            and remembered.owner_alive == alive
            and remembered.size_bytes == look.files.size_bytes
            and remembered.modified == look.files.modified
        ):
            return remembered  # as it was: a reload of thousands copies none
        return replace(
            remembered,
            size_bytes=look.files.size_bytes,
            modified=look.files.modified,
            owner=owner,
            owner_alive=alive,
        )
    base: dict[str, Any] = {
        "path": path,
        "local_id": path.name,
        "meta": {},
        "last_seq": 0,
        "cursors": {},
        "losses": {},
        "size_bytes": look.files.size_bytes,
        "modified": look.files.modified,
        "owner": owner,
        "owner_alive": alive,
    }
    if look.kept is not None and look.covers(verify=verify, tally=tally):
        kept = info_from(look.kept, base, verify=verify, meta_bounds=meta_bounds)
        if kept is not None:
            return kept
        if look.row and shelf is not None:
            # A row not as written: the journal's summary, else the journal.
            whole = replace(look, kept=shelf.load(path.name, look.files.stamp), row=False)
            if whole.kept is not None and whole.covers(verify=verify, tally=tally):
                kept = info_from(whole.kept, base, verify=verify, meta_bounds=meta_bounds)
                if kept is not None:
                    return kept
    # Imported here: a listing whose summaries are all current opens no
    # journal, and the writing side is half of ``primeruns ls``'s start-up.
    from primeruns.journal.journal import Journal

    try:
        with Journal.open(path, owner=False, written_here=written_here) as journal:
            meta, as_read = _read_meta(journal, meta_bounds)
            # Read before the damage is: a loss record that is not one is
            # named among it (``losses_in``).
            losses = journal.losses()
            structural = journal.structural_damage()
            verified = journal.damage() if verify else None
            damage = list(verified if verified is not None else structural)
            if meta_bounds is None:  # a bounded reader names what it left out itself
                damage.extend(_left_out(path, meta.pop(K_OVERSIZED, None)))
            cursors = journal.cursors()
            last_seq = journal.last_seq()
            counted = len(damage)
            if tally_most is not None:
                tally = not damage and last_seq <= tally_most
            after = _tallies(journal, cursors, damage) if tally else {}
            fields: dict[str, Any] = {
                "last_seq": last_seq,
                "cursors": cursors,
                "losses": losses,
                "finish": _finish_record(journal, last_seq),
            }
    except Exception as exc:  # a listing never raises for one bad run
        return JournalInfo(**base, damage=[Damage(None, f"{path.name}: {exc}")])
    if shelf is not None and as_read is not None and not structural and len(damage) == counted:
        # Only a journal read whole and without trouble is kept: damage met
        # while opening may be this moment's (a probe out of time), and is
        # looked for again.
        read = {**fields, "meta": as_read}
        if written_here or not unwalked(path):
            # Opened unwalked (no child could start), it serves listings but
            # vouches for nothing (``journal_infos``).
            read[WALKED_IN] = boot_id()
        _keep(shelf, path, look, read, after if tally else None, verified)
    return JournalInfo(
        **{
            **base,
            **fields,
            "local_id": local_id_of(meta, path),
            "meta": meta,
            "damage": damage,
            "after": after,
        }
    )


#: The most entries a finish counts for its run's summary (``keep_summary``):
#: about 3 µs an entry, so at most ~30 ms, whatever the run's length (a long
#: run whose shipping kept up finishes fast, and must not pay for its length
#: there); a longer run's counts are read by the first listing that shows
#: them, as before.
TALLY_AT_FINISH_MOST = 10_000


def keep_summary(path: Path) -> None:
    """Keep the summary of the journal at ``path``, which this process wrote
    and has just closed, for the next listing to read.

    A journal's files changed in the last seconds have no current summary,
    so the next listing probed it in a child and opened it: a 40-190 ms
    probe at the close-out of the next run of a sweep (looking for the run's
    other processes), and at ``ls`` right after a run. The journal is this
    process's own, written and closed by it, so it is read here without a
    probe, with its counts (what ``ls`` shows) up to ``TALLY_AT_FINISH_MOST``
    entries. Never raises: a listing reads it anyway.

    One open reads it and, where it is short enough, counts it: a second
    open to count cost ~3 ms of a 2,000-episode run's close-out.
    """
    try:
        shelf = Shelf(path.parent)
        _info(
            path,
            verify=False,
            tally=True,
            shelf=shelf,
            written_here=True,
            tally_most=TALLY_AT_FINISH_MOST,
        )
    except Exception as exc:  # a summary is an optimisation, never a failure
        log.debug("prime-runs: no summary kept of %s: %s", path, exc)


def _read_meta(
    journal: Journal, meta_bounds: MetaBounds
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The journal's meta as the caller asked for it, and as it is (for its
    summary; None when a value was left out or it is too large to keep)."""
    if meta_bounds is None:
        meta = journal.all_meta(MAX_META_BYTES)
        return meta, None if K_OVERSIZED in meta else meta
    most, shape = meta_bounds
    raw = _AsRead(shape)
    shown = journal.all_meta(most, raw)
    if raw.values is None or K_OVERSIZED in shown or K_UNREADABLE in shown:
        return shown, None  # (the names ``all`` adds went through no ``shape``)
    return shown, dict(zip(shown, raw.values, strict=True))


def _left_out(path: Path, oversized: Any) -> list[Damage]:
    """The damage of the meta values ``Journal.all_meta`` left out for their
    size (``journal.oversized``): a journal is untrusted, and a value of
    megabytes (a zstd bomb of a few KB on disk) is not decoded for a listing."""
    return [
        Damage(
            None,
            f"{path}: meta key {key!r} holds {size} bytes, over what is read of a "
            f"journal's meta ({MAX_META_BYTES} bytes, {MAX_META_VALUES} values): not read",
        )
        for key, size in (oversized.items() if isinstance(oversized, dict) else ())
    ]


class _AsRead:
    """A ``shape`` for ``Journal.all_meta`` that also keeps each value as it
    was read, in order, while they fit in a summary (a bounded reader must
    not hold a hostile journal's meta whole)."""

    def __init__(self, shape: Callable[[Any], Any]) -> None:
        self.shape = shape
        self.values: list[Any] | None = []
        self.room = summary.MAX_BYTES

    def __call__(self, value: Any) -> Any:
        if self.values is not None:
            try:
                self.room -= len(dumps(value))
            except (RecursionError, ValueError):
                self.room = -1
            if self.room < 0:
                self.values = None
            else:
                self.values.append(value)
        return self.shape(value)


def _keep(
    shelf: Shelf,
    path: Path,
    look: _Look,
    read: dict[str, Any],
    after: dict[int, Counter[int]] | None,
    verified: list[Damage] | None,
) -> None:
    """Keep what was read of the journal as its summary, with what an earlier
    summary of the same files held and this read did not ask for."""
    fields = fields_of(read, after, verified, look.kept)
    if fields is not None:
        shelf.save(path.name, look.files.stamp, fields)


def journal_info(
    path: Path, *, verify: bool = False, tally: bool = False, meta_bounds: MetaBounds = None
) -> JournalInfo:
    """One journal's state, as ``list_journals`` gives it (never raises for damage)."""
    (info,) = journal_infos([path], verify=verify, tally=tally, meta_bounds=meta_bounds)
    return info


def journal_infos(
    paths: Collection[Path],
    *,
    verify: bool = False,
    tally: bool = False,
    meta_bounds: MetaBounds = None,
) -> list[JournalInfo]:
    """``journal_info`` of each of ``paths``, in order, with one probe child
    for all that need one (``gc`` verifies its candidates so)."""
    shelves: dict[Path, Shelf] = {}
    looks = []
    for path in map(Path, paths):
        shelf = shelves.setdefault(path.parent, Shelf(path.parent))
        look = _look(path, shelf, read_owner(path))
        walked_in = None if look.kept is None else look.kept.get(WALKED_IN)
        if walked_in is not None and walked_in == boot_id() and look.files.stamp is not None:
            # A current summary of a file walked clean in this boot, so the
            # journal these callers open next (the dashboard's run page) is
            # not walked again in a child (~0.3 s for 20,000 episodes).
            vouch(path, look.files.stamp)
        looks.append((path, shelf, look))
    probe_many([p for p, _, look in looks if not look.covers(verify=verify, tally=tally)])
    return [
        _info(p, verify=verify, tally=tally, meta_bounds=meta_bounds, look=look, shelf=shelf)
        for p, shelf, look in looks
    ]


def list_journals(
    runs_dir: Path,
    *,
    verify: bool = False,
    skip_live: bool = False,
    tally: bool = False,
    skip: Collection[Path] = (),
    meta_bounds: MetaBounds = None,
    unread_most: int | None = None,
    newest: int | None = None,
    since: str | None = None,
    names: Collection[str] | None = None,
    memo: Memo | None = None,
    rows: bool = False,
) -> list[JournalInfo]:
    """Every journal under ``runs_dir``, oldest first (ids sort by creation time).

    Takes no lock; never raises for a damaged journal (its ``damage`` says
    what is wrong). ``verify=True`` also scans every entry (slower).
    ``skip_live=True`` leaves out journals whose owner is alive, unopened.
    ``tally=True`` fills ``after`` (a scan of every entry's header: for the
    commands that show counts, never for ``init``). ``skip``: journals left
    out unopened (a journal this process opens read-only cannot be opened to
    write in it meanwhile: a predecessor its uplink threads take over).
    ``meta_bounds``: (the largest meta value decoded, a function each decoded
    one goes through), for a reader that shows them (the dashboard).

    What was read of each journal is kept (``summary``): a journal whose
    files did not change since is not opened again, so a listing costs what
    changed, not what the runs directory holds. ``unread_most``: open at most
    this many journals that have no current summary, the newest, and leave
    the others out (a caller beside a user's loop bounds its work so, the
    first time too). ``newest``: only that many journals, the last made.
    ``since``: only those made no earlier than the journal of that name.
    ``names``: only the journals of those names (``run_index``).
    ``memo``: kept by a caller that lists again and again (``Memo``).
    ``rows``: the caller reads no meta value but ``summary_index.ROW_META``
    (``primeruns ls``), so a journal's meta may be only those, as its
    listing row keeps them: read so wherever the row is current (a listing
    of the whole directory, with no ``meta_bounds``, ``verify`` or ``memo``).
    """
    left_out = {Path(p) for p in skip}
    seen: dict[Path, Seen] = {}
    found, untrusted = journal_dirs(runs_dir, newest=newest, since=since, names=names, seen=seen)
    whole = newest is None and since is None and names is None  # a listing of them all
    shelf = Shelf(runs_dir, texts=whole)
    # The summaries of them all in one file (summary_index), for a listing of them all.
    index = Index(shelf.folder) if whole and shelf.usable() else None
    rows = rows and not verify and meta_bounds is None and memo is None
    looks: dict[Path, _Look] = {}
    dead: dict[str, DeadOwner] = {}  # the owners dead for good, for the index
    for p in found:
        # (Empty, nearly always: a Path's hash is a call, a listing looks at thousands.)
        if (left_out and p in left_out) or (untrusted and p in untrusted):
            continue
        owner = read_owner(p) if index is None else _owner(p, index, dead)
        if skip_live and not isinstance(owner, str) and owner_alive(owner, p):
            left_out.add(p)
            continue
        looks[p] = _look(
            p, shelf, owner, memo, index, verify=verify, tally=tally, seen=seen.get(p), rows=rows
        )
    unread = [p for p, look in looks.items() if not look.covers(verify=verify, tally=tally)]
    if unread_most is not None and len(unread) > unread_most:
        left_out.update(unread[: len(unread) - unread_most])  # names sort by creation time
        unread = unread[len(unread) - unread_most :]
    probe_many(unread)  # one child walks every journal not read before (probe)
    listed = [
        (
            _untrusted(p, untrusted[p])
            if untrusted and p in untrusted
            else _info(
                p, verify=verify, tally=tally, meta_bounds=meta_bounds, look=looks[p], shelf=shelf
            )
        )
        for p in found
        if not left_out or p not in left_out
    ]
    if whole:  # which summaries have no journal
        shelf.prune({p.name for p in found})
    if (
        index is not None
        and index.read
        and shelf.texts is not None
        and shelf.fields_read is not None
    ):
        stamped = {p.name: look.files for p, look in looks.items() if look.files.stamp is not None}
        index.refresh(stamped, shelf.texts, shelf.fields_read, dead)
    if memo is not None:
        memo.refill(
            (info.path, looks[info.path].files, info)
            for info in listed
            if info.path in looks and looks[info.path].files.stamp is not None and not info.damage
        )
    return listed


def _owner(path: Path, index: Index, dead: dict[str, DeadOwner]) -> _Owner:
    """The owner of the journal at ``path``: described, where ``index``
    vouches that its lock file is as it was when a listing found that owner
    dead for good; else read from the file (and put in ``dead`` if it is
    dead for good, for the index: ``summary_index.dead_owner_of``)."""
    taken = summary.taken_now()
    try:
        found = os.lstat(os.path.join(path, LOCK_NAME))
    except OSError:
        return None  # (as ``read_owner``)
    name = path.name
    kept = index.dead_owner(name, found)
    if kept is not None:
        dead[name] = kept
        described: str = kept[-1]
        return described
    owner = read_owner(path, found)
    if owner is not None and dead_for_good(owner):
        entry = dead_owner_of(found, taken, owner.describe())
        if entry is not None:
            dead[name] = entry
    return owner


def made_before(name: str, since: str) -> bool:
    """Whether the journal named ``name`` was made before the one named
    ``since`` (names start with their creation time, to the second, never
    earlier than a journal made before them: ``default_local_id``). A name
    without that stamp is not known to be: it is kept, to be safe."""
    return bool(STAMPED.match(name)) and name[:STAMP_LEN] < since[:STAMP_LEN]


def made_since(runs_dir: Path, own: Path) -> list[Path]:
    """The journals made no earlier than ``own`` (names start with their
    creation time, to the second): a child's is made after its parent's, and
    finish() must not open every past run of the runs dir (its cost would
    grow with history). A name without that stamp is kept, to be safe."""
    since = own.name[:STAMP_LEN]
    found = []
    with os.scandir(runs_dir) as entries:
        for entry in entries:
            if entry.name == own.name or not entry.is_dir(follow_symlinks=False):
                continue
            if made_before(entry.name, since):
                continue
            if os.path.exists(os.path.join(entry.path, DATA_NAME)):
                found.append(Path(entry.path))
    return found


# What ``Path.is_file`` takes for "no such file" rather than raising.
_NOT_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def journal_dirs(
    runs_dir: Path,
    *,
    newest: int | None = None,
    since: str | None = None,
    names: Collection[str] | None = None,
    seen: dict[Path, Seen] | None = None,
) -> tuple[list[Path], dict[Path, str]]:
    """The journals under ``runs_dir`` (sorted, never opened), and of those,
    each one not to open with why: a journal another user could have
    planted or linked (trust), or a folder this user cannot look into.
    ``newest``: only that many, the last by name (ids sort by creation time).
    ``since``: only those made no earlier than the journal of that name
    (``made_before``), whatever else the runs directory holds. ``names``:
    only those of these names (the runs directory is not listed).
    ``seen``: filled with what was seen of each journal not untrusted, its
    stamp's start (``summary.files``): a listing does not ``stat`` it again.

    A shared runs directory may hold another user's private (0700) folder:
    looking for ``data.mdb`` in it fails with EACCES, which must not hide
    every journal beside it. Such a folder is listed as not opened, since
    whether it is a journal cannot be known."""
    runs_dir = Path(runs_dir)
    found: list[Path] = []
    untrusted: dict[Path, str] = {}
    try:
        listed = os.listdir(runs_dir) if names is None else [n for n in names if _plain(n)]
    except OSError:
        return [], {}
    folder = os.fspath(runs_dir)
    for name in sorted(listed, reverse=newest is not None):
        if newest is not None and len(found) >= newest:
            break
        if since is not None and made_before(name, since):
            continue
        # Plain strings and os calls: a runs directory may hold thousands. The
        # folder's and data.mdb's lstat are the journal's stamp's too
        # (``summary.files``), so taken in the order and way it takes them.
        inside = os.path.join(folder, name)
        taken = summary.taken_now()
        here: os.stat_result | None = None
        with contextlib.suppress(OSError):
            here = os.lstat(inside)
        try:
            data_path = os.path.join(inside, DATA_NAME)
            data = os.lstat(data_path)
            # A link is followed only to tell whether a journal is there, as
            # ever: it is listed, and never opened through the link (damage).
            found_as = os.stat(data_path) if stat.S_ISLNK(data.st_mode) else data
        except OSError as exc:
            if exc.errno in _NOT_THERE:
                continue
            if name.startswith("."):
                # Another user's private folder of the runs directory's own
                # (.runs, .primary, .summaries): no journal's name starts
                # with a dot (``valid_local_id``), so it is none.
                continue
            child = runs_dir / name  # EACCES: a folder we may not enter
            if not child.is_dir():
                continue
            untrusted[child] = why_unreadable(child, exc)
            found.append(child)
            continue
        if not stat.S_ISREG(found_as.st_mode):
            continue
        child = runs_dir / name
        found.append(child)
        try:
            if here is None:
                check_dir(child, "journal directory")  # it says why it cannot look
            else:
                # A link here (a run's folder moved and linked back, a
                # ``latest``) is listed, as not opened, and left alone.
                linked = stat.S_ISLNK(here.st_mode)
                advice = _LINK_ADVICE if linked else None
                check_dir_as(child, here, "journal directory", advice=advice)
        except JournalError as exc:
            untrusted[child] = str(exc)
            continue
        if seen is not None:
            seen[child] = (taken, here, data)
    if newest is not None:
        found.reverse()
    return found, untrusted


# What ``ls`` says of a link in a runs directory (``check_dir_as``'s advice,
# which says it is one): pointing PRIME_RUNS_DIR at a run's folder is no fix.
_LINK_ADVICE = (
    "it is left alone, never read through, shipped or deleted; to have prime-runs "
    "list, ship or collect the run, move its folder here in the link's place"
)


def _plain(name: str) -> bool:
    """Whether ``name`` names an entry of the runs directory itself (no path)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _untrusted(path: Path, reason: str) -> JournalInfo:
    return JournalInfo(
        path=path,
        local_id=path.name,
        meta={},
        last_seq=0,
        cursors={},
        losses={},
        size_bytes=0,
        modified=0.0,
        owner=None,
        owner_alive=False,
        damage=[Damage(None, f"not opened: {reason}")],
        not_opened=reason,
    )


def delete_journal(path: Path) -> None:
    """Delete a run directory; JournalLockedError while its owner lives.

    Raises JournalError if ``path`` is not a journal (nothing else is removed).
    """
    path = Path(path)
    if not (path / DATA_NAME).is_file() or not (path / LOCK_NAME).exists():
        raise JournalError(f"{path} is not a prime-runs journal; not deleting it")
    check_dir(path, "journal directory")
    # Everything is removed within the folder just checked, held open: by
    # its path, a link put in its place meanwhile had what it named removed.
    folder = _open_folder(path)
    try:
        # What was opened is checked, not only what the path named a moment
        # before: a folder put in its place meanwhile (another user's, one
        # others can write into) had its files removed.
        check_dir_as(path, os.fstat(folder), "journal directory")
        files, salvage_dirs = _journal_files(path, folder)  # all or nothing: first
        # The lock in that folder too, never by path (JournalLockedError naming the owner).
        lock = OwnerLock(path, record=False, within=folder)
        try:
            for name, inside in salvage_dirs:
                salvage = _open_folder(name, folder)
                try:
                    for item in inside:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(item, dir_fd=salvage)
                finally:
                    os.close(salvage)
                os.rmdir(name, dir_fd=folder)
            for name in sorted(files, key=lambda n: n == LOCK_NAME):  # the lock file last
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=folder)
            os.rmdir(path)  # (a link there now is no folder: ENOTDIR)
        finally:
            lock.release()
    finally:
        os.close(folder)
    Shelf(path.parent).forget(path.name)


def _open_folder(path: Path | str, within: int | None = None) -> int:
    """A descriptor of the folder at ``path`` (in the folder ``within``),
    never through a link (OSError for one, or anything else)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, dir_fd=within)


def _journal_files(path: Path, folder: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """What deleting the journal at ``path`` (open as ``folder``) removes:
    its files (a link is removed, never followed), and the folders an
    interrupted salvage left, by name, with their files. JournalError for
    anything else (a folder a journal never has, nested folders): nothing
    is deleted then, and nothing recurses."""
    files: list[str] = []
    salvage: list[tuple[str, list[str]]] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                files.append(entry.name)
            elif entry.is_dir(follow_symlinks=False) and entry.name.startswith(_SALVAGE_PREFIX):
                inside = _open_folder(entry.name, folder)
                try:
                    with os.scandir(inside) as inner:
                        names = []
                        for item in inner:
                            if not (item.is_symlink() or item.is_file(follow_symlinks=False)):
                                raise JournalError(
                                    f"{path / entry.name} holds {item.name!r}: not deleting {path}"
                                )
                            names.append(item.name)
                finally:
                    os.close(inside)
                salvage.append((entry.name, names))
            else:
                raise JournalError(
                    f"{path} holds {entry.name!r}, which is no part of a journal: not deleting it"
                )
    return files, salvage
