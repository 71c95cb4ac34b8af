"""Where a run's journal goes when its runs directory cannot take it.

A read-only home on a cluster node, a runs directory on a full or
read-only disk, another user's folder: the vendor's SDK ships such a run
(it keeps nothing on disk), and a caller such as verifiers turns an error
from ``init()`` into a silently disabled run. So rather than refuse, the
journal goes to a private folder elsewhere, checked by the same trust rules
(:mod:`primeruns.journal.trust`), and one warning names both folders, how
long the journal lasts there and the fix.

When no folder takes it at all (no temporary directory is writable either,
nor ``/dev/shm``), the journal is kept in memory
(:class:`~primeruns.journal.memory.MemoryJournal`), with one warning naming
every folder tried and what the run then risks: the vendor's SDK keeps
nothing on disk either, and a run that ships beats a run refused.

Online runs only: there the journal is the way to the platform, and a run
that ships is worth a journal that may not outlive a reboot. An offline run
is kept for a later ``primeruns sync``; it is refused at ``init()``,
naming the fix, rather than kept where a reboot may clear it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from primeruns.logs import get_logger

from .exceptions import JournalError
from .journal import Journal
from .journal.trust import check_dir, make_private_folder
from .settings import homeless_folder, prime_runs_folder

__all__ = ["check_prime_runs_folder", "create_journal", "prime_runs_folder_of", "refuges"]

log = get_logger("primeruns")

# /dev/shm outlives the process (a crash loses nothing) but not a reboot;
# TMPDIR comes first: it is where a site puts scratch space it wants used.
_SHM = Path("/dev/shm")
_FOLDER = "prime-runs folder"
#: How to fix a ``prime-runs`` folder others could write into.
_OWN_FOLDER = (
    "make it a folder of your own that only you can write (chmod 700), not a link, "
    "or point PRIME_RUNS_DIR (or runs_dir=) at a private directory"
)


#: An online run's journal is not made on a disk with less free than this:
#: its reserve (256 KiB), its first LMDB pages and spool segment would
#: leave nothing for records, and every append was dropped (128 KiB free:
#: 0 of 100 gsm8k episodes kept) where the vendor's SDK, keeping nothing on
#: disk, ships them all. A fallback folder on another disk ships them.
LEAST_FREE_BYTES = 1 << 20


def short_of_room(where: Path) -> str | None:
    """Why the disk under ``where`` (or its nearest existing folder above)
    cannot take a new journal, or None (enough room, or not known)."""
    for folder in (where, *where.parents):
        try:
            found = os.statvfs(folder)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        if found.f_blocks == 0:
            # No size at all (a FUSE file system without a statfs of its
            # own answers zeros): its room is not known, not nil.
            return None
        free = found.f_bavail * found.f_frsize
        if free >= LEAST_FREE_BYTES:
            return None
        return (
            f"the disk under {folder} has {free // 1024} KiB free, less than the "
            f"{LEAST_FREE_BYTES >> 20} MiB a journal needs to start"
        )
    return None


def prime_runs_folder_of(runs_dir: Path) -> Path | None:
    """The folder this package made above ``runs_dir`` where that is the
    default runs directory (None: named elsewhere). It is held to the runs
    directory's rule (as the sync root's is, ``ship.copies``): whoever can
    write it can rename "runs" away and plant their own. (Both sides
    absolute: settings make a relative XDG_STATE_HOME's so.)"""
    try:
        default = prime_runs_folder() / "runs"
    except RuntimeError:  # no home directory: there is no default runs directory
        return None
    return runs_dir.parent if runs_dir.absolute() == default.absolute() else None


def check_prime_runs_folder(folder: Path) -> None:
    """UntrustedPathError naming the fix unless ``folder`` (a prime-runs
    folder, ``prime_runs_folder_of``) is one init takes: for ``doctor``."""
    check_dir(folder, _FOLDER, advice=_OWN_FOLDER)


def refuges() -> list[Path]:
    """The places tried, in order, when the runs directory is refused: a
    folder of this uid in the temporary directory (TMPDIR, else the first
    writable of /tmp, /var/tmp, the working directory: ``tempfile``'s
    choice), then in /dev/shm."""
    first = homeless_folder()
    folders = dict.fromkeys([first, _SHM / first.name])  # TMPDIR may be /dev/shm
    return [folder / "runs" for folder in folders]


def create_journal(
    runs_dir: Path,
    create: Callable[[Path], Journal],
    *,
    online: bool,
    in_memory: Callable[[], Journal] | None = None,
) -> Journal:
    """``create(runs_dir)``, or, for an ``online`` run the runs directory
    refuses, ``create`` in the first refuge that takes it, with one warning;
    when none does, ``in_memory()``, with one warning. Raises JournalError
    naming every folder tried when no refuge takes it and there is no
    ``in_memory``. An online run's journal is made only where the disk has
    room for it to start (``short_of_room``)."""
    if online:
        create = _with_room(create)
    try:
        folder = prime_runs_folder_of(runs_dir)
        if folder is not None:
            make_private_folder(folder, _FOLDER, advice=_OWN_FOLDER)
        return create(runs_dir)
    except JournalError as refused:
        if not online:
            raise
        first = refused
    tried = refuges()
    for refuge in tried:
        try:
            # The folder above "runs" is this uid's too: checked, so that no
            # one else can swap "runs" for a link of theirs once made.
            make_private_folder(refuge.parent, "fallback folder")
            journal = create(refuge)
        except (JournalError, OSError) as exc:
            log.debug("prime-runs: the fallback %s refused the journal too: %s", refuge, exc)
            continue
        log.warning(
            "prime-runs: the runs directory %s cannot take this run's journal (%s); it is "
            "kept in %s instead and the run ships from there, but that folder outlives a "
            "crash, not necessarily a reboot or the cleaning of temporary files. Fix: point "
            "PRIME_RUNS_DIR (or runs_dir=) at a directory of your own you can write to, on a "
            "node-local disk. Should the run not ship, replay it with: "
            "primeruns replay --all --runs-dir %s",
            runs_dir,
            first,
            refuge,
            refuge,
        )
        return journal
    if in_memory is not None:
        log.warning(
            "prime-runs: no folder could take this run's journal: the runs directory %s "
            "(%s), nor %s. The run ships all the same, but its records are kept in this "
            "process's memory until shipped: a crash or a kill loses what is not shipped "
            "yet, no 'primeruns replay' can reach it, and what finish() cannot ship is "
            "counted in run.failed_records. Fix: point PRIME_RUNS_DIR (or runs_dir=) at a "
            "directory of your own you can write to, on a node-local disk.",
            runs_dir,
            first,
            ", ".join(map(str, tried)) or "any temporary directory",
        )
        return in_memory()
    raise JournalError(
        f"{first}; no fallback folder took the journal either "
        f"({', '.join(map(str, tried))}): point PRIME_RUNS_DIR (or runs_dir=) at a directory "
        "of your own you can write to, on a node-local disk"
    ) from first


def _with_room(create: Callable[[Path], Journal]) -> Callable[[Path], Journal]:
    """``create``, refusing (JournalError) a folder on a disk short of room."""

    def made(where: Path) -> Journal:
        short = short_of_room(where)
        if short is not None:
            raise JournalError(short)
        return create(where)

    return made
