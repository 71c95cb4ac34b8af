"""Which journals ship where they are, and which through a sync journal: what a listing asks.

``backlog`` ships a journal through its sync journal (``mirror``) when it is
a copy, or when a sync journal ships its run already; ``ls``, ``gc`` and the
dashboard say so of every journal they list. That question needs a journal's
meta, its lock file and the sync root's names only, so it lives here, apart
from the shipping (the uplink, the platform's client and httpx), which a
listing never loads.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..exceptions import JournalError
from ..journal.lock import read_owner
from ..journal.meta import K_LOCAL_ID
from ..journal.origin import K_ORIGIN, Origin
from ..journal.store import DATA_NAME
from ..journal.trust import UntrustedPathError, check_dir, check_file, make_private_dirs
from ..journal.types import as_count
from ..settings import default_sync_root

if TYPE_CHECKING:
    from ..journal import Journal

__all__ = [
    "K_COPIED_FROM",
    "K_SOURCE_LOSSES",
    "K_SOURCE_PATH",
    "check_sync_folder",
    "check_sync_root",
    "copied_from",
    "is_copy",
    "make_sync_root",
    "note_copy",
    "origin_of",
    "read_record",
    "sync_name",
    "sync_names",
    "sync_path",
    "sync_root",
    "uncarried",
    "valid_local_id",
]

K_SOURCE_PATH = "sync.source"  # a sync journal's meta: the copy last imported from
# A sync journal's meta, per sink: the copy's loss count already carried over
# (``mirror._carry_losses``); a listing adds what the copy counted since.
K_SOURCE_LOSSES = "sync.source_losses"
# A sync journal's meta: where the journals it imported from were (its
# ``K_SOURCE_PATH`` names the private snapshot read, gone since). The sync
# root is one for every runs directory: ``gc`` of one of them prunes no sync
# journal that a journal in another still holds entries beyond.
K_COPIED_FROM = "sync.copied_from"
_COPIES_KEPT = 16  # the latest: a copy is mostly refreshed under one name


def note_copy(journal: Journal, path: Path) -> None:
    """Add ``path``, a journal just imported into the sync journal
    ``journal``, to those it names (``K_COPIED_FROM``)."""
    known = journal.get_meta(K_COPIED_FROM)
    where = str(path.absolute())
    if isinstance(known, list) and known and known[-1] == where:
        return  # (a copy synced again and again, by ``sync --watch``: no write)
    paths = (
        [p for p in known if isinstance(p, str) and p != where] if isinstance(known, list) else []
    )
    journal.set_meta(K_COPIED_FROM, [*paths, where][-_COPIES_KEPT:])


def copied_from(meta: Mapping[str, Any]) -> list[Path]:
    """The journals a sync journal's ``meta`` names as imported from."""
    known = meta.get(K_COPIED_FROM)
    return [Path(p) for p in known if isinstance(p, str)] if isinstance(known, list) else []


def uncarried(counts: Mapping[str, int], carried: Any) -> dict[str, int]:
    """Per sink, what a copy counted lost (``counts``: ``loss_counts``) beyond
    what its sync journal carried over already (``carried``: its
    ``K_SOURCE_LOSSES``, read back as untrusted: a value that is not a count
    carried nothing), for the sinks with more. What the import carries
    (``mirror._carry_losses``) and what a listing of the copy adds to its
    sync journal's losses (``RunStatus.losses``) are this one difference."""
    before = carried if isinstance(carried, dict) else {}
    out: dict[str, int] = {}
    for sink, count in counts.items():
        more = count - (as_count(before.get(sink)) or 0)
        if more > 0:
            out[sink] = more
    return out


def sync_root(environ: Mapping[str, str] | None = None) -> Path:
    """Where sync journals live (:func:`primeruns.settings.default_sync_root`)."""
    return default_sync_root(environ)


#: How to fix a sync root another user could write into (``check_sync_root``).
_OWN_ROOT = (
    "make it a folder of your own that only you can write (chmod 700), not a link, "
    "or point XDG_STATE_HOME at a private folder"
)


def check_sync_root(root: Path) -> None:
    """UntrustedPathError (naming the folder and the fix) unless the sync
    root is a private folder of the user's, as a runs directory must be
    (``journal.trust``), or is not there yet. The root holds each run's
    registration and offsets and the records of what shipped: planted,
    swapped or read by another user, records would land in another run or be
    skipped. For the default root the ``prime-runs`` folder holding it is
    checked too (whoever can write there can put a root of their own in
    place of the user's), and the state folder above (``_check_state_home``)
    is held to what ``/tmp``, shared and sticky, is: a fine ``XDG_STATE_HOME``."""
    if root == default_sync_root():
        _check_state_home(root.parent.parent)
        check_dir(root.parent, "state folder", advice=_OWN_ROOT)
    check_dir(root, "sync root", advice=_OWN_ROOT)


def _check_state_home(state: Path) -> None:
    """UntrustedPathError unless nobody else can move the ``prime-runs``
    folder out of ``state`` (``XDG_STATE_HOME``), or swap it between a check
    and a use: ``state`` is the user's or root's, as the link it may be is
    (``~/.local/state`` linked to a scratch disk's folder is fine), and one
    anyone may write in is sticky (``/tmp``). A folder another user owns, or
    made first where the user meant to (``/tmp/$USER-state``), is not: its
    owner may rename anything in it, sticky or not."""
    mine = (os.geteuid(), 0)
    fix = "point XDG_STATE_HOME at a folder of your own"
    try:
        st = os.lstat(state)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in mine:
                raise UntrustedPathError(
                    f"the state folder {state} (XDG_STATE_HOME) is a link another user "
                    f"owns (uid {st.st_uid}), who can point it elsewhere: {fix}"
                )
            st = os.stat(state)
    except FileNotFoundError:
        return  # nothing there yet (or a link to nothing): made private, or failing, later
    except OSError as exc:
        raise JournalError(f"cannot inspect the state folder {state}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        return  # (no folder can be made in it: that fails, naming it)
    if st.st_uid not in mine:
        raise UntrustedPathError(
            f"the state folder {state} (XDG_STATE_HOME) belongs to another user "
            f"(uid {st.st_uid}), who can move the prime-runs folder in it away or swap it: {fix}"
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UntrustedPathError(
            f"the state folder {state} (XDG_STATE_HOME) is writable by every user and "
            f"not sticky (mode {stat.S_IMODE(st.st_mode):o}), so anyone can move the "
            f"prime-runs folder in it away or swap it: chmod +t {state}, or {fix}"
        )


def check_sync_folder(root: Path, *under: str) -> Path:
    """The folder ``root/*under`` (the sync root itself without ``under``),
    checked as ``check_sync_root`` checks the root (both, if it exists)."""
    check_sync_root(root)
    folder = root.joinpath(*under)
    if under:
        check_dir(folder, "sync folder", advice=_OWN_ROOT)
    return folder


def make_sync_root(root: Path, *under: str) -> Path:
    """The folder ``root/*under`` (the sync root itself without ``under``),
    checked, made 0700 where missing (the root too), and checked again:
    made meanwhile by someone else?"""
    check_sync_folder(root, *under)
    make_private_dirs(root.joinpath(*under))
    return check_sync_folder(root, *under)


def read_record(root: Path, *under: str, limit: int) -> dict[str, Any] | None:
    """The JSON object in the file ``root/*under`` (at most ``limit`` bytes
    read), or None (none, unreadable, not an object). What the records in
    the sync root hold decides which run records go to and which are
    skipped: UntrustedPathError for a root or folder another user could have
    planted, or a file that is a link or not the user's; and none is opened
    through a link that appeared since the check, nor waited on (a FIFO)."""
    path = check_sync_folder(root, *under[:-1]) / under[-1]
    check_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            value = json.loads(handle.read(limit))
        except (OSError, ValueError, RecursionError):  # RecursionError: nested past json's reach
            return None
    return value if isinstance(value, dict) else None


def origin_of(path: Path, meta: Mapping[str, Any]) -> Origin | None:
    """Where the journal at ``path`` was written: its origin, or for a
    journal written before origins were recorded, the last owner its lock
    file names (taken as having written it here)."""
    origin = Origin.from_json(meta.get(K_ORIGIN))
    if origin is not None:
        return origin
    owner = read_owner(path)
    if owner is None:
        return None
    return Origin(
        host=owner.host,
        pid=owner.pid,
        proc_start=owner.proc_start,
        boot=None,
        path=str(path.absolute()),
        created=owner.started,
    )


def valid_local_id(local_id: object) -> str:
    """``local_id`` as a folder name under the sync root; JournalError for one
    that is not (a copy is untrusted input: ``../x`` or ``/x`` would name
    another journal)."""
    if (
        not isinstance(local_id, str)
        or not local_id
        or local_id in (".", "..")
        or any(c in local_id for c in "/\\\0")
        or local_id.startswith(".")
    ):
        raise JournalError(f"the copy names an invalid local run id {local_id!r}; not syncing it")
    return local_id


def sync_name(path: Path, meta: Mapping[str, Any]) -> str | None:
    """The name of the journal's sync journal: its local id, else its
    folder's; None where that is no folder name (``valid_local_id``: a
    crafted copy's ``../x`` names another journal), which no sync journal
    has (syncing such a copy is refused, naming it)."""
    local_id = meta.get(K_LOCAL_ID)
    name = local_id if isinstance(local_id, str) and local_id else path.name
    try:
        return valid_local_id(name)
    except JournalError:
        return None


def sync_path(path: Path, meta: Mapping[str, Any], root: Path) -> Path | None:
    """Where the journal's sync journal is (or would be) under ``root``;
    None for one whose name is not a folder's (``sync_name``)."""
    name = sync_name(path, meta)
    return None if name is None else root / name


def is_copy(
    path: Path,
    meta: Mapping[str, Any],
    root: Path | None = None,
    *,
    in_root: Collection[str] | None = None,
    origin: Origin | Literal[False] | None = False,
) -> bool:
    """Whether the journal at ``path`` (its ``meta``) ships through its sync
    journal: a copy, or one whose run a sync journal ships already (so that
    the two never both ship it). ``in_root``: the names in ``root``, listed
    once by a caller asking of many journals (``sync_names``), so that a
    journal with no sync journal costs no ``stat``. ``origin``: its
    ``origin_of``, when the caller read it already (a listing describes
    thousands); False: read here."""
    name = sync_name(path, meta)
    # A name not in the root has no sync journal, nor has one that is no
    # folder's name (a path a copy's meta holds: it would name another's).
    if name is not None and (in_root is None or name in in_root):
        mine = (root if root is not None else sync_root()) / name
        if path.absolute() == mine.absolute():
            return False  # the sync journal itself (a replay of it)
        if (mine / DATA_NAME).exists():
            return True
    # A journal that does not say where it was written (damaged beyond its
    # meta) is shipped where it is, repaired, as before origins existed.
    if origin is False:
        origin = origin_of(path, meta)
    return isinstance(origin, Origin) and not origin.is_original(path)


def sync_names(root: Path) -> frozenset[str]:
    """The names in the sync root (none when it is absent, or another user
    could have put them there: ``check_sync_root``), for ``is_copy``'s ``in_root``."""
    try:
        check_sync_root(root)
        return frozenset(os.listdir(root))
    except (OSError, JournalError):
        return frozenset()
