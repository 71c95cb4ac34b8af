"""Which directories and files a journal may live in: ours, private, no symlinks.

Runs directories are often on shared disks (a team's scratch space, a login
node with hundreds of users). A journal-shaped folder planted there by
another user, or a symlink where ``lock.mdb`` or ``owner.lock`` should be,
would make any command that opens it write into the target of the link
(LMDB writes its lock file even to read; the owner lock is truncated when
taken). So before anything is opened:

- the runs directory and the journal's directory must be real directories
  (not symlinks) owned by the current user and not writable by group or
  others: nobody else can then add, replace or link a file in them;
- the files LMDB opens (``data.mdb``, ``lock.mdb``) must be regular files
  owned by the current user (LMDB opens them by name and follows links);
- the files this package opens itself are opened with ``O_NOFOLLOW``.

Directories this package creates are 0700, intermediate ones included
(``Path.mkdir(parents=True)`` gives those the umask's mode instead).

The checks hold for what is in the runs directory, not for the runs
directory's own name: a folder above it that other users may write into
without the sticky bit (a shared scratch folder made group-writable for a
team), or that another user owns, lets them rename the runs directory (or a
folder or link on the way to it) away and put their own, or a symlink, in
its place, between a check and the next open. Refusing
would stop runs on many a cluster disk that work; so a new journal warns
once per runs directory, naming the folder and the fix
(``warn_if_swappable``).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import threading
import warnings
from pathlib import Path

from primeruns.exceptions import JournalError

__all__ = [
    "SwappableRunsDirWarning",
    "UntrustedPathError",
    "check_dir",
    "check_file",
    "make_private_dirs",
    "make_private_folder",
    "swappable_by",
    "warn_if_swappable",
    "why_unreadable",
]


class UntrustedPathError(JournalError):
    """A runs directory or journal another user could write into, or a symlink
    where a journal's file or folder should be."""


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parents, each 0700 whatever the umask."""
    path = Path(path)
    missing: list[Path] = []
    current = path
    while not current.exists() and not current.is_symlink():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue  # made meanwhile by another process: checked below
        os.chmod(directory, 0o700)


def make_private_folder(path: Path, what: str, *, advice: str | None = None) -> None:
    """Create ``path`` as ``make_private_dirs`` does, checked as ``check_dir``
    checks it before and after (made meanwhile by someone else?): for a
    folder whose owner could rename what it holds away and plant their own.
    JournalError if it cannot be made."""
    check_dir(path, what, advice=advice)
    try:
        make_private_dirs(path)
    except OSError as exc:
        raise JournalError(f"cannot create the {what} {path}: {exc}") from exc
    check_dir(path, what, advice=advice)


def check_dir(path: Path, what: str, *, advice: str | None = None) -> None:
    """Raise UntrustedPathError unless ``path`` is a directory of ours that
    nobody else can write into (``what`` names it in the message, which ends
    with ``advice`` if given, else with how to fix a runs directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # nothing there yet: whoever creates it creates it private
    except OSError as exc:
        raise JournalError(f"cannot inspect the {what} {path}: {exc}") from None
    check_dir_as(path, st, what, advice=advice)


def check_dir_as(path: Path, st: os.stat_result, what: str, *, advice: str | None = None) -> None:
    """``check_dir`` of ``path`` as ``st`` (its ``lstat``, taken by the caller) found it."""
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPathError(
            f"the {what} {path} is a symbolic link; prime-runs follows none there: "
            + (advice or "point PRIME_RUNS_DIR (or runs_dir=) at the real directory")
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPathError(f"the {what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UntrustedPathError(
            f"the {what} {path} belongs to another user (uid {st.st_uid}); "
            + (
                advice
                or "use a runs directory of your own, e.g. PRIME_RUNS_DIR=/tmp/$USER/prime-runs"
            )
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedPathError(
            f"the {what} {path} is writable by other users (mode "
            f"{stat.S_IMODE(st.st_mode):o}), who could plant files in it: "
            + (advice or f"chmod go-w {path}, or use a private PRIME_RUNS_DIR")
        )


def check_file(path: Path) -> None:
    """Raise UntrustedPathError if ``path`` exists and is not a regular file
    of ours (a symlink, a device, another user's file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise JournalError(f"cannot inspect {path}: {exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise UntrustedPathError(f"{path} is {kind}; a journal's files must be plain files")
    if st.st_uid != os.geteuid():
        raise UntrustedPathError(f"{path} belongs to another user (uid {st.st_uid})")


def why_unreadable(folder: Path, exc: OSError) -> str:
    """Why ``folder`` could not be looked into (``exc``, EACCES): most often
    another user's private folder in a shared runs directory, said so."""
    try:
        check_dir(folder, "folder")
    except JournalError as untrusted:
        return f"{untrusted}; cannot look into it ({exc.strerror})"
    return f"cannot look into {folder} ({exc.strerror})"


class SwappableRunsDirWarning(UserWarning):
    """A folder above the runs directory lets other users rename what it holds:
    one of them could put their own runs directory in its place."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def swappable_by(runs_dir: Path) -> tuple[Path, str] | None:
    """The first folder above ``runs_dir`` whose writers other than us may
    rename an entry of it (the runs directory, or a folder or link on the
    way to it), with why, in words; None if there is none.

    Such a folder is one that users other than its owner may write into
    without the sticky bit (with it, ``/tmp``'s way, only an entry's owner
    may; a group-writable folder whose group is its owner's private group,
    ``_owners_own_group``, has no other writer), or one that belongs to
    another user than us and root, who may rename what it holds whatever
    its mode. The folders are those of the path as given, looked at without
    following a link (a link's folder is what may swap it), then those of
    the real path the links lead to. A folder that cannot be looked at is
    passed over (whoever made it so is not the neighbour this is about)."""
    given = Path(os.path.abspath(runs_dir))
    real = Path(os.path.realpath(runs_dir))
    folders = [*given.parents, *(f for f in real.parents if f not in given.parents)]
    me = os.geteuid()
    for folder in folders:
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue  # a link on the given path: its folder, next, is what may swap it
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (me, 0):
            return folder, f"which belongs to another user (uid {st.st_uid}, mode {mode:o})"
        if st.st_mode & stat.S_ISVTX:
            continue
        if st.st_mode & stat.S_IWOTH or (
            st.st_mode & stat.S_IWGRP and not _owners_own_group(st.st_uid, st.st_gid)
        ):
            return folder, f"which other users can write into (mode {mode:o}, no sticky bit)"
    return None


def _owners_own_group(uid: int, gid: int) -> bool:
    """Whether ``gid`` is the user private group of ``uid``: a group of the
    user's own name, their primary one, naming no other member. Red Hat and
    Debian make one for each user, with a umask of 002 that leaves every
    folder the user makes group-writable (``~/.local`` holding the default
    runs directory among them): writable by the user alone, no neighbour.
    Looked up only for such a folder, once per new journal."""
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except (KeyError, OSError):
        return False
    return (
        group.gr_name == user.pw_name and user.pw_gid == gid and set(group.gr_mem) <= {user.pw_name}
    )


def warn_if_swappable(runs_dir: Path) -> None:
    """Warn once per runs directory when a folder above it lets other users
    swap it (``swappable_by``), naming the folder and the fix."""
    found = swappable_by(runs_dir)
    if found is None:
        return
    key = str(runs_dir)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    folder, why = found
    if why.startswith("which belongs"):
        fix = "Put runs in a folder of your own"
    else:
        fix = (
            f"Set the sticky bit (chmod +t {folder}) or remove their write access "
            "(chmod go-w), or put runs in a private folder"
        )
    warnings.warn(
        f"the runs directory {runs_dir} is under {folder}, {why}: they could rename the "
        "runs directory, or a folder or link on the way to it, away and put their own in "
        f"its place. {fix} (runs_dir= or PRIME_RUNS_DIR, e.g. ~/.local/state/prime-runs)",
        SwappableRunsDirWarning,
        stacklevel=3,
    )
