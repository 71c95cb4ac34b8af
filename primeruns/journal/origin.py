"""Where a journal was written, and whether its producer may still write it.

A journal travels: cluster users copy runs directories from compute nodes to
a login node (rsync, scp, ``cp -a``), again and again while the job runs, and
sync from there. The owner lock (``lock``) cannot speak for a copy: a flock is
not copied, and a copy's lock file names a process of another machine. So
``Journal.create`` records the journal's *origin* once, in its meta (never
rewritten): the host, its boot, the producer's pid and start time, and the
path. From it, any process can tell:

- whether the directory it looks at is the journal where it was written, or
  a copy (another path, or another host);
- whether the producer may still be writing the original: ``alive`` or
  ``dead`` (the original is on this machine, and its owner lock is held or
  not), or ``unknown`` (another host, another boot, or the original is not
  here: nothing here can tell).

A copy whose producer may be alive must never be closed out as crashed: its
original may be growing, and a later copy will bring the rest.

The origin is also written as a small file in the journal's folder
(``origin.json``), so that a copy can be recognised as one without opening
its LMDB file: a copy being refreshed in place (``cp -a``) can be truncated
under a reader's memory map, and even a read-only open writes LMDB's lock file.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from primeruns.journal.lock import LOCK_NAME, _file_of, _proc_start, lock_held, this_host

__all__ = ["K_ORIGIN", "ORIGIN_FILE", "Origin", "ProducerState", "boot_id"]

K_ORIGIN = "journal.origin"
ORIGIN_FILE = "origin.json"
#: How ``origin.json`` is read: never through a link, and without waiting, since
#: a journal folder is untrusted input and the file may be a named pipe nobody
#: writes (which a plain open waits on for ever: ``sync`` and ``replay`` hung).
_READING = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

ProducerState = Literal["alive", "dead", "unknown"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


#: ``boot_id``'s answer, with the file it was read from: a boot does not
#: change under a running process, and a listing asked once per journal
#: (3,000 reads of /proc for ``ls``). Keyed by the file, which tests replace.
_read_boot: tuple[Path, str | None] | None = None


def _as_pathlib_writes(text: str) -> bool:
    """Whether ``text`` is an absolute path as pathlib writes one: no empty
    or "." part, no slash at its end. Two such are the same ``Path`` exactly
    when they are the same text."""
    return (
        text.startswith("/")
        and "//" not in text
        and "/./" not in text
        and (text == "/" or not (text.endswith("/") or text.endswith("/.")))
    )


def boot_id() -> str | None:
    """This boot of this machine (Linux); None where the kernel does not say."""
    global _read_boot
    source = _BOOT_ID
    if _read_boot is not None and _read_boot[0] is source:
        return _read_boot[1]
    try:
        found = source.read_text().strip() or None
    except OSError:
        found = None
    _read_boot = (source, found)
    return found


@dataclass(frozen=True)
class Origin:
    """The process and place that created a journal."""

    host: str
    pid: int
    proc_start: int | None
    boot: str | None
    path: str
    created: float
    # The journal's folder, (st_dev, st_ino), as it was made: a copy at the
    # very path (another container's disk) is another folder. Not part of
    # what the origin is (``==``: a sync journal compares the origins its
    # copies name): a journal re-made at its path (``rehome``) is the same
    # journal in a new folder, and names that one.
    place: tuple[int, int] | None = field(default=None, compare=False)

    @classmethod
    def here(cls, path: Path) -> Origin:
        """The calling process, creating a journal at ``path``."""
        import socket  # here, where a journal is made: a listing never needs it

        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            proc_start=_proc_start(pid),
            boot=boot_id(),
            path=str(Path(path).absolute()),
            created=time.time(),
        )

    def placed_at(self, directory: Path) -> Origin:
        """This origin, naming ``directory`` (the journal's new folder) as its place.

        ``lstat``: nothing in a runs directory is followed. The folder was
        made by ``mkdir`` an instant before (a link there fails it, and a
        runs directory that is a link is refused), so this is the folder's
        own (st_dev, st_ino) as ``stat`` would say; were a link put there
        meanwhile, its place is the link's, which no folder matches."""
        try:
            found = os.lstat(directory)
        except OSError:
            return replace(self, place=None)
        return replace(self, place=(found.st_dev, found.st_ino))

    def write_beside(self, directory: Path) -> None:
        """Write ``origin.json`` into a journal's new folder (never through a link)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(Path(directory) / ORIGIN_FILE, flags, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(self.to_json(), handle)
            handle.flush()
            os.fsync(fd)  # once per journal: a power cut would leave it empty

    @classmethod
    def read_beside(cls, directory: Path) -> Origin | None:
        """The origin a journal's folder names in ``origin.json`` (None: none, or not one).

        The file is untrusted input, read wherever journals are listed (a
        ``sync --watch`` for days): one that is no regular file (a folder,
        or a FIFO, opened without waiting for a writer), or nested past
        what ``json`` reads, is no origin, not an error out of the listing."""
        try:
            fd = os.open(Path(directory) / ORIGIN_FILE, _READING)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return cls.from_json(json.loads(os.read(fd, 1 << 16)))
        except (OSError, ValueError, RecursionError):
            return None
        finally:
            os.close(fd)

    def to_json(self) -> dict[str, Any]:
        out = {
            "host": self.host,
            "pid": self.pid,
            "proc_start": self.proc_start,
            "boot": self.boot,
            "path": self.path,
            "created": self.created,
        }
        if self.place is not None:
            out["place"] = list(self.place)
        return out

    @classmethod
    def from_json(cls, value: Any) -> Origin | None:
        """The origin a journal's meta holds; None when absent or malformed
        (a journal is untrusted input: a wrong type never raises)."""
        if not isinstance(value, dict):
            return None
        host, pid, path = value.get("host"), value.get("pid"), value.get("path")
        start, boot, created = value.get("proc_start"), value.get("boot"), value.get("created")
        if not isinstance(host, str) or not isinstance(path, str):
            return None
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        return cls(
            host=host,
            pid=pid,
            proc_start=start if isinstance(start, int) and not isinstance(start, bool) else None,
            boot=boot if isinstance(boot, str) else None,
            path=path,
            created=float(created) if isinstance(created, int | float) else 0.0,
            place=_file_of(value.get("place")),
        )

    @property
    def on_this_host(self) -> bool:
        return self.host == this_host()

    def is_original(self, path: Path) -> bool:
        """Whether ``path`` is where this journal was written (not a copy).

        The host name and the path must be this one's, and the folder there
        the one it was made in (``place``): two containers may share both a
        host name ("localhost", a requeued job's reused pod name) and a runs
        path (/scratch/runs), and a copy taken from one to the other, read as
        the original, was judged by its own flock, which nobody holds: a live
        run read "crashed". Within the boot it was made in, a folder is its
        (st_dev, st_ino); in another (this machine restarted, or another
        machine of that name) device numbers are not kept, so the inode
        tells: the same folder is the original of a writer gone with its
        boot. An origin naming no place (an older version's) leaves the host
        name and path to tell, as before."""
        if not self.on_this_host:
            return False
        # The same text is the same path (what almost every listed journal
        # finds: parsing a path, even a Path again, is a listing's cost per journal).
        text = os.fspath(path)
        if not (text == self.path and os.path.isabs(text)):
            # Where both are written as pathlib writes a path, the texts
            # tell (a copy's, nearly always): ``absolute`` and two parses
            # were a third of ``ls`` of 3,000 copies' path handling.
            here_text = text if os.path.isabs(text) else os.path.join(os.getcwd(), text)
            if _as_pathlib_writes(here_text) and _as_pathlib_writes(self.path):
                if here_text != self.path:
                    return False
            else:
                here = (path if isinstance(path, Path) else Path(path)).absolute()
                if not (os.fspath(here) == self.path or here == Path(self.path)):
                    return False
        if self.place is None:
            return True
        try:
            found = os.stat(path)
        except OSError:
            return True  # nothing here to tell by: as before places were named
        current = boot_id()
        if self.boot is not None and current is not None and self.boot == current:
            return (found.st_dev, found.st_ino) == self.place
        return found.st_ino == self.place[1]

    def producer_state(self) -> ProducerState:
        """Whether the producer may still write the original (see module doc).

        Only the original's owner lock can say, and only on this machine:
        a pid is not (a container's pid names another process outside it),
        nor is a host name (two machines may share one; another boot of this
        one cannot tell either). Where the original is not here to ask, the
        answer is ``unknown``."""
        if not self.on_this_host:
            return "unknown"
        current = boot_id()
        if self.boot is not None and current is not None and self.boot != current:
            return "unknown"
        original = Path(self.path)
        if not (original / LOCK_NAME).exists():
            return "unknown"
        if not self._original_lies_at(original):
            # A copy lies at the original's path (another container's
            # filesystem): its flock is nobody's, whatever its writer does.
            return "unknown"
        return "alive" if lock_held(original) else "dead"

    def _original_lies_at(self, original: Path) -> bool:
        """Whether the folder at ``original`` (this origin's path) is this
        journal's original, as the origin it holds says: a journal re-made
        there (``rehome``) names its new folder, which an origin read from a
        copy taken before does not; that copy's writer is judged by the
        re-made journal's flock (before, "unknown": it read alive for good).
        Where that folder names no origin, by this one's place."""
        there = Origin.read_beside(original)
        if there is None:
            return self.is_original(original)
        # Another journal's (equality leaves the place out): not this one's original.
        return there == self and there.is_original(original)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"
