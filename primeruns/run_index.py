"""Which journals of a runs directory log to a platform run: an index by run.

A run's primary looks for the run's other processes at its close-out
(``ranks.others_of``) and a process attaching to a run by id for the
journals of its earlier processes (``ship.uplink.earlier_journals``). Read
from every journal's meta, that look cost what the runs directory's history
holds (a second per thousand past runs, on every torchrun job's start and
finish): DESIGN invariant 12. So the runs directory keeps, under
``.runs/``, one folder per run (named by a digest of the run's id, so no id
can name a path outside it) holding one empty file per journal that logs to
the run, and ``.runs/.known/``, one empty file per journal already entered.
A journal ``init()`` or a forked child makes is entered as it is made
(``enter``: under the run it attaches to, if any) and again as it binds to
a run (``note``). A look reads the run's folder, and the journals not
entered: those an older version made or that were copied here (from
another host), each read once and entered once no process holds it (its
meta no longer changes). A copy can change still: brought again after its
journal bound on its node, its meta names the run the first copy did not.
So a journal a look entered that names no run and was not written here (a
copy, or one that does not say where it was written) is entered in
``.runs/.seen/``, its marker's time that of its data file as read; a look
reads it again once that differs (``_brought_again``). A journal naming a
run names it for good. What a look costs is the run's journals and those
not entered yet, plus the names of the directory's entries (a listing of
names, never opened) and a ``stat`` of the data file of each copy that
named no run.

The index is a hint: each journal it names is still read and matched by its
meta, as before; a marker of a deleted journal is passed over (``primeruns
gc`` deletes those, ``prune``). Nothing here follows a symlink: the folders
are made 0700 and checked as ours (``trust``), files are opened
``O_NOFOLLOW``. An index that cannot be used (a read-only runs directory, a
folder another user planted) falls back to reading every journal.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from pathlib import Path

from primeruns.logs import get_logger

from .exceptions import JournalError
from .journal import JournalInfo, list_journals
from .journal.lock import lock_held
from .journal.store import DATA_NAME
from .journal.trust import check_dir
from .spec import listed_spec

__all__ = ["enter", "journals_of", "note", "prune", "runs_of"]

log = get_logger("primeruns")

FOLDER = ".runs"
_KNOWN = ".known"  # (run folders are hex digests: no clash)
_SEEN = ".seen"  # entered by a look, not written here: read again once brought again
# A marker's folder gc deleted as empty between its making and the marker's
# open is made again, at most this often.
_TRIES = 5


def _digest(run_id: str) -> str:
    """The run's folder: any id, even one with lone surrogates (an id from
    the environment), names one folder and no path."""
    import hashlib  # here: OpenSSL's start-up (~10 ms) is no listing's (``ranks`` imports this)

    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _plain(name: str) -> bool:
    """Whether ``name`` can name a journal of the runs directory (no path)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _folder(path: Path) -> None:
    """Make ``path`` 0700 if missing, and check it is a folder of ours."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_dir(path, "run index folder")


def _mark(
    root: Path, sub: str, name: str, *, stamp: int | None = None, made: set[str] | None = None
) -> None:
    """The empty file ``root/sub/name`` (its time ``stamp``, in ns, if given).
    ``made``: the folders of ``root`` a look made and checked already (a look
    entering thousands of journals checks each folder once). Raises
    ``OSError``, ``JournalError``."""
    if not _plain(name):
        raise JournalError(f"{name!r} is not a journal's name")
    done = made if made is not None else set()
    for _ in range(_TRIES):
        if sub not in done:
            _folder(root)
            _folder(root / sub)
            done.add(sub)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(os.path.join(root, sub, name), flags, 0o600)
            try:
                if stamp is not None:
                    os.utime(fd, ns=(stamp, stamp))
            finally:
                os.close(fd)
            return
        except FileNotFoundError:
            done.discard(sub)  # gc deleted the empty folder meanwhile (``prune``)
    raise OSError(f"the run index folder {root / sub} was deleted each time it was made")


def _names(folder: Path) -> set[str]:
    """The markers in ``folder`` (none if it is missing)."""
    try:
        check_dir(folder, "run index folder")
        with os.scandir(folder) as entries:
            return {e.name for e in entries if _plain(e.name) and e.is_file(follow_symlinks=False)}
    except FileNotFoundError:
        return set()


def _stamp(journal: str) -> int | None:
    """The time of the data file of the journal at ``journal`` (a copy
    brought again changes it). Plain strings and os calls: a look stamps
    each copy of the runs directory."""
    try:
        return os.stat(os.path.join(journal, DATA_NAME), follow_symlinks=False).st_mtime_ns
    except (OSError, ValueError):
        return None


def _brought_again(folder: Path, runs_dir: Path) -> tuple[set[str], set[str]]:
    """The journals entered in ``folder`` (``.seen``), and of those the ones
    whose data file changed since they were read (none if it is missing)."""
    seen: set[str] = set()
    changed: set[str] = set()
    base = os.fspath(runs_dir)
    try:
        check_dir(folder, "run index folder")
        with os.scandir(folder) as entries:
            for entry in entries:
                name = entry.name
                if not _plain(name) or not entry.is_file(follow_symlinks=False):
                    continue
                seen.add(name)
                try:
                    if entry.stat(follow_symlinks=False).st_mtime_ns == _stamp(
                        os.path.join(base, name)
                    ):
                        continue
                except OSError:
                    pass
                changed.add(name)
    except FileNotFoundError:
        pass
    return seen, changed


def _written_here(info: JournalInfo) -> bool:
    """Whether the listed journal is where it was written (not a copy)."""
    from .ship.copies import origin_of

    origin = origin_of(info.path, info.meta)
    return origin is not None and origin.is_original(info.path)


def enter(journal_path: Path, run_id: str | None) -> None:
    """Enter the journal just made at ``journal_path``, attached to run
    ``run_id`` if any: a look reads it only for that run, and for the run it
    binds to (``note``). Never raises: a journal left out is read by looks."""
    root = journal_path.parent / FOLDER
    try:
        if run_id:
            _mark(root, _digest(run_id), journal_path.name)
        _mark(root, _KNOWN, journal_path.name)
    except (OSError, JournalError) as exc:
        log.info("prime-runs: could not enter the journal in the run index: %s", exc)


def note(journal_path: Path, run_id: str) -> None:
    """Enter the journal at ``journal_path`` as logging to run ``run_id`` (on
    its binding). Never raises: a journal it could not enter is taken out of
    the entered ones (``.known``), so that looks read it."""
    root = journal_path.parent / FOLDER
    try:
        _mark(root, _digest(run_id), journal_path.name)
    except (OSError, JournalError) as exc:
        log.info("prime-runs: could not enter the journal in the run index: %s", exc)
        _unmark(root, _KNOWN, journal_path.name)


def _unmark(root: Path, sub: str, name: str) -> None:
    """Delete ``root/sub/name`` if there, through no symlink (``root`` may be
    one a neighbour planted: that is why the marking failed)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError, ValueError):
        top = os.open(root, flags)
        try:
            inner = os.open(sub, flags, dir_fd=top)
            try:
                os.unlink(name, dir_fd=inner)
            finally:
                os.close(inner)
        finally:
            os.close(top)


def runs_of(info: JournalInfo) -> set[str]:
    """The platform runs a listed journal logs to, by its meta (attached to,
    bound to), read as untrusted: a meta of the wrong shape names none."""
    spec = listed_spec(info.meta)
    bound = info.meta.get("platform")
    found = {spec.attach_id if spec else None}
    found.add(bound.get("run_id") if isinstance(bound, dict) else None)
    return {r for r in found if isinstance(r, str) and r}


def journals_of(runs_dir: Path, run_id: str, *, skip: Collection[Path] = ()) -> list[JournalInfo]:
    """The journals of ``runs_dir`` that may log to run ``run_id``, read
    (``list_journals``; the caller matches them by their meta): those the
    index names for the run, and those not entered yet, which are entered
    here once no process holds them. ``skip``: as ``list_journals``."""
    runs_dir = Path(runs_dir)
    root = runs_dir / FOLDER
    try:
        _folder(root)
        known = _names(root / _KNOWN)
        seen, changed = _brought_again(root / _SEEN, runs_dir)
        marked = _names(root / _digest(run_id))
        names = os.listdir(runs_dir)
    except (OSError, JournalError) as exc:
        log.info("prime-runs: the run index of %s is not used: %s", runs_dir, exc)
        return list_journals(runs_dir, skip=skip)
    # (folders that are no journal are passed over)
    new = {n for n in names if n not in known and n not in seen} | changed
    # Stamped before the read: a change after it is seen by the next look.
    stamps = {n: _stamp(os.path.join(runs_dir, n)) for n in new}
    listed = list_journals(runs_dir, skip=skip, names=marked | new)
    made: set[str] = set()
    for info in listed:
        name = info.path.name
        if name in new and info.meta and not lock_held(info.path):
            try:
                runs = runs_of(info)
                for run in runs:
                    _mark(root, _digest(run), name, made=made)
                # A journal's run, once named, is its run for good (an attach
                # id, a binding): only a copy naming none yet can change so.
                if runs or _written_here(info):
                    _mark(root, _KNOWN, name, made=made)
                    if name in seen:  # else each look would find it changed
                        _unmark(root, _SEEN, name)
                elif stamps.get(name) is not None:  # read again once brought again
                    _mark(root, _SEEN, name, stamp=stamps[name], made=made)
            except (OSError, JournalError) as exc:
                log.info("prime-runs: could not enter %s in the run index: %s", info.path, exc)
                break
    return listed


def prune(runs_dir: Path) -> int:
    """For ``primeruns gc``: delete the markers of journals no longer in
    ``runs_dir``, and the folders left empty. How many markers went."""
    root = Path(runs_dir) / FOLDER
    gone = 0
    try:
        check_dir(root, "run index folder")
        with os.scandir(root) as entries:
            folders = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except (OSError, JournalError):
        return 0
    for folder in folders:
        try:
            names = _names(folder)
        except (OSError, JournalError):
            continue
        for name in names:
            if not os.path.lexists(runs_dir / name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)
                    gone += 1
        with contextlib.suppress(OSError):  # not empty: a journal's, or one just entered
            os.rmdir(folder)
    return gone
