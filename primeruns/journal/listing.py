"""Where runs live, and what the CLI's ``ls``/``rm`` need: listing and deletion.

Listing takes no lock and opens each journal read-only, so it works while runs
are live; a journal that cannot be read is listed with its damage instead of
raising. Deletion takes the owner lock first, so a live run is never removed.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primeruns.exceptions import JournalError
from primeruns.journal.journal import Journal
from primeruns.journal.lock import LOCK_NAME, OwnerLock, owner_alive, read_owner
from primeruns.journal.meta import K_LOCAL_ID
from primeruns.journal.probe import probe_many
from primeruns.journal.spool import list_segments
from primeruns.journal.store import DATA_NAME
from primeruns.journal.trust import check_dir, why_unreadable
from primeruns.journal.types import Damage
from primeruns.settings import default_runs_dir  # PRIME_RUNS_DIR, read there

_SALVAGE_PREFIX = "primeruns-salvage-"  # store._salvage's folder, left by an interrupted salvage

__all__ = [
    "JournalInfo",
    "default_runs_dir",
    "delete_journal",
    "journal_dirs",
    "journal_info",
    "list_journals",
]


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


#: How ``list_journals`` reads meta values: (largest value decoded, applied to each), or None.
MetaBounds = tuple[int, Callable[[Any], Any]] | None


def _info(path: Path, *, verify: bool, tally: bool, meta_bounds: MetaBounds = None) -> JournalInfo:
    owner = read_owner(path)
    try:
        data = (path / DATA_NAME).stat()
        modified, size = data.st_mtime, data.st_size
    except OSError:
        modified, size = 0.0, 0
    for _, name in list_segments(path):  # the newest entries may be spooled still
        with contextlib.suppress(OSError):
            segment = (path / name).stat()
            modified, size = max(modified, segment.st_mtime), size + segment.st_size
    base: dict[str, Any] = {
        "path": path,
        "local_id": path.name,
        "meta": {},
        "last_seq": 0,
        "cursors": {},
        "losses": {},
        "size_bytes": size,
        "modified": modified,
        "owner": owner.describe() if owner else None,
        "owner_alive": owner_alive(owner),
    }
    try:
        with Journal.open(path, owner=False) as journal:
            meta = journal.all_meta(*meta_bounds) if meta_bounds else journal.all_meta()
            local_id = meta.get(K_LOCAL_ID)
            damage = journal.damage() if verify else journal.structural_damage()
            cursors = journal.cursors()
            return JournalInfo(
                **{
                    **base,
                    "local_id": local_id if isinstance(local_id, str) else path.name,
                    "meta": meta,
                    "last_seq": journal.last_seq(),
                    "cursors": cursors,
                    "losses": journal.losses(),
                    "damage": damage,
                    "after": _tallies(journal, cursors, damage) if tally else {},
                }
            )
    except Exception as exc:  # a listing never raises for one bad run
        return JournalInfo(**base, damage=[Damage(None, f"{path.name}: {exc}")])


def journal_info(path: Path, *, verify: bool = False, tally: bool = False) -> JournalInfo:
    """One journal's state, as ``list_journals`` gives it (never raises for damage)."""
    path = Path(path)
    probe_many([path])
    return _info(path, verify=verify, tally=tally)


def list_journals(
    runs_dir: Path,
    *,
    verify: bool = False,
    skip_live: bool = False,
    tally: bool = False,
    skip: Collection[Path] = (),
    meta_bounds: MetaBounds = None,
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
    """
    left_out = {Path(p) for p in skip}
    found, untrusted = journal_dirs(runs_dir)
    children = [p for p in found if p not in left_out]
    if skip_live:
        children = [p for p in children if p in untrusted or not owner_alive(read_owner(p))]
    probe_many([p for p in children if p not in untrusted])  # one child walks them all (probe)
    return [
        (
            _untrusted(p, untrusted[p])
            if p in untrusted
            else _info(p, verify=verify, tally=tally, meta_bounds=meta_bounds)
        )
        for p in children
    ]


def journal_dirs(runs_dir: Path) -> tuple[list[Path], dict[Path, str]]:
    """The journals under ``runs_dir`` (sorted, never opened), and of those,
    each one not to open with why: a journal another user could have
    planted or linked (trust), or a folder this user cannot look into.

    A shared runs directory may hold another user's private (0700) folder:
    looking for ``data.mdb`` in it fails with EACCES, which must not hide
    every journal beside it. Such a folder is listed as not opened, since
    whether it is a journal cannot be known."""
    runs_dir = Path(runs_dir)
    found: list[Path] = []
    untrusted: dict[Path, str] = {}
    try:
        children = sorted(runs_dir.iterdir())
    except OSError:
        return [], {}
    for child in children:
        try:
            if not (child / DATA_NAME).is_file():
                continue
        except OSError as exc:  # EACCES: a folder we may not enter
            if not child.is_dir():
                continue
            untrusted[child] = why_unreadable(child, exc)
            found.append(child)
            continue
        found.append(child)
        try:
            check_dir(child, "journal directory")
        except JournalError as exc:
            untrusted[child] = str(exc)
    return found, untrusted


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
    )


def delete_journal(path: Path) -> None:
    """Delete a run directory; JournalLockedError while its owner lives.

    Raises JournalError if ``path`` is not a journal (nothing else is removed).
    """
    path = Path(path)
    if not (path / DATA_NAME).is_file() or not (path / LOCK_NAME).exists():
        raise JournalError(f"{path} is not a prime-runs journal; not deleting it")
    check_dir(path, "journal directory")
    files, salvage_dirs = _journal_files(path)  # before anything is removed: all or nothing
    lock = OwnerLock(path, record=False)  # raises JournalLockedError naming the owner
    try:
        for directory, inside in salvage_dirs:
            for name in inside:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
            os.rmdir(directory)
        for name in sorted(files, key=lambda n: n == LOCK_NAME):  # the lock file last
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path / name)
        os.rmdir(path)
    finally:
        lock.release()


def _journal_files(path: Path) -> tuple[list[str], list[tuple[Path, list[str]]]]:
    """What deleting the journal at ``path`` removes: its files (a link is
    removed, never followed), and the folders an interrupted salvage left,
    with their files. JournalError for anything else (a folder a journal
    never has, nested folders): nothing is deleted then, and nothing recurses."""
    files: list[str] = []
    salvage: list[tuple[Path, list[str]]] = []
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_symlink() or entry.is_file(follow_symlinks=False):
                files.append(entry.name)
            elif entry.is_dir(follow_symlinks=False) and entry.name.startswith(_SALVAGE_PREFIX):
                with os.scandir(entry.path) as inner:
                    names = []
                    for item in inner:
                        if not (item.is_symlink() or item.is_file(follow_symlinks=False)):
                            raise JournalError(
                                f"{entry.path} holds {item.name!r}: not deleting {path}"
                            )
                        names.append(item.name)
                salvage.append((Path(entry.path), names))
            else:
                raise JournalError(
                    f"{path} holds {entry.name!r}, which is no part of a journal: not deleting it"
                )
    return files, salvage
