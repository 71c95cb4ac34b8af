"""The owner lock: one writing process per journal, named when it refuses another.

``flock(2)`` on ``owner.lock`` in the journal directory. The kernel drops it
when the owner dies however it dies (SIGKILL, OOM), so a stale lock cannot
exist and there is nothing to clean up. The file's content names the owner
(pid, host, start time) for the message a refused process shows; it is only
informative and never decides anything on its own.

Fork: a child inherits the open file description, and so shares the flock.
The child must never unlock it (``flock(LOCK_UN)`` in the child would free
the parent's lock); ``release`` therefore does nothing outside the process
that took the lock. It closes its copy instead (``_after_fork_in_child``),
which leaves the parent's hold (the flock ends with the last descriptor of
its open file): kept, a child outliving its parent (a data loader's worker
of a rank killed out of memory) held the dead parent's journal as if its
producer still wrote it, and the run's primary waited for that journal as
for a process still logging; ``replay`` and a requeued job's takeover of
it were refused. A descriptor of a lock file is opened, and closed, only
under ``_REGISTRY``, which a fork waits for (``hooks``' before-fork handler,
``hold_for_fork``): a child forked by another thread meanwhile would have
kept a copy of one not yet (or no longer) among those it closes. So does a
descriptor a thread holds while it waits for the flock of a lock file its
partner made again (``restore``): the child closes its copy (``_WAITING``).

The uplink: a live run's producer hands its lock descriptor to the uplink
process it starts (``share``), so the two hold one flock together: ``replay``
is refused while either lives, and the lock ends when the last of them closes
it. Neither unlocks it explicitly (``LOCK_UN`` by one would free it for both).
The producer names the uplink in the file (``add_helper``), so listings call a run
whose producer died "running" while its uplink still ships it. A command
(``primeruns sync``, ``replay``, ``gc``) names itself too (``acting_as``): a
second sync refused a journal another sync ships says which process that is,
not only a pid a user cannot tell from a producer's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import stat
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from primeruns.exceptions import JournalLockedError
from primeruns.journal.trust import UntrustedPathError

__all__ = [
    "LOCK_NAME",
    "OwnerInfo",
    "OwnerLock",
    "dead_for_good",
    "forks_wait",
    "lock_held",
    "names_this_file",
    "owner_alive",
    "plain_files",
    "read_owner",
    "remove_unheld",
    "this_host",
]

LOCK_NAME = "owner.lock"
# A command's name as a lock file may give it: printed in refusals, and the
# file is anyone's to write, so nothing else of it is shown.
_COMMAND_NAME = re.compile(r"[a-z][a-z-]{0,23}")


class _ActingAs(threading.local):
    """The command this thread runs (``acting_as``): per thread, as a
    command may be run by ``cli.main`` in one thread of a user's process
    while another logs a run, whose locks are no command's."""

    command: str | None = None


_acting_as = _ActingAs()
# What a terminal may act on rather than show (C0, DEL, C1): the host a lock
# file gives is described with these escaped, as the CLI's ``inert`` does;
# the SDK's own warnings (who ships a predecessor's copy) reach a terminal
# through no CLI.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class OwnerInfo:
    pid: int
    host: str
    started: float
    proc_start: int | None  # /proc start time in ticks: tells a reused pid apart
    helper_pid: int | None = None  # the uplink sharing the lock, if any
    helper_start: int | None = None
    producer_done: bool = False  # the producer let go: only the uplink may hold it
    command: str | None = None  # the ``primeruns`` command holding it, if one does
    pid_ns: int | None = None  # its PID namespace (``_pid_ns``): where its pids mean anything
    # The boot of the kernel it ran on (``origin.boot_id``): a pid, a start
    # time and a flock mean something only in that boot of that machine, and
    # two machines (two containers) may share a host name.
    boot: str | None = None
    # The lock file it locked, (st_dev, st_ino): a copy of the journal (rsync,
    # ``cp -a``) carries this record but is another file, whose flock nobody
    # holds (``names_this_file``).
    file: tuple[int, int] | None = None

    def describe(self) -> str:
        if self.host == this_host() and _another_boot(self):
            # Its pid is another kernel's: here it names another process or none.
            where = "another boot of it, or another machine of that name"
            return f"pid {self.pid} on {self.host} ({where}: not a pid here)"
        if self.host == this_host() and _elsewhere(self):
            return self._described_elsewhere()
        if self.helper_pid is not None and (
            self.producer_done or not _pid_alive(self.pid, self.proc_start)
        ):
            return f"the uplink of pid {self.pid} (pid {self.helper_pid} on {self.host})"
        if self.command is not None:
            return f"`primeruns {self.command}` (pid {self.pid} on {self.host})"
        return f"pid {self.pid} on {self.host}"

    def _described_elsewhere(self) -> str:
        """An owner in another PID namespace of this host (a container's):
        its pids are that namespace's, and here name another process or none,
        which a user told "pid 1 on this host" would kill. Whether its
        producer still runs cannot be asked here, so only a producer that
        said it let go is told apart from its uplink."""
        where = f"another PID namespace (a container) on {self.host}"
        if self.helper_pid is not None and self.producer_done:
            return f"an uplink in {where} (its pid there: {self.helper_pid}; not a pid here)"
        who = f"`primeruns {self.command}`" if self.command is not None else "a process"
        return f"{who} in {where} (its pid there: {self.pid}; not a pid here)"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pid": self.pid,
            "host": self.host,
            "started": self.started,
            "proc_start": self.proc_start,
        }
        if self.helper_pid is not None:
            out["helper_pid"] = self.helper_pid
            out["helper_start"] = self.helper_start
        if self.producer_done:
            out["producer_done"] = True
        if self.command is not None:
            out["command"] = self.command
        if self.pid_ns is not None:
            out["pid_ns"] = self.pid_ns
        if self.boot is not None:
            out["boot"] = self.boot
        if self.file is not None:
            out["file"] = list(self.file)
        return out


def _proc_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("Z", "X")


#: How a lock file is opened to be read or tested: never through a link, and
#: without waiting, since a journal folder is untrusted input and its lock
#: file may be a named pipe nobody writes (which a plain open waits on for
#: ever: ``ls``, ``show``, ``gc`` and ``sync`` of its runs directory hung).
_READING = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def current_owner() -> OwnerInfo:
    import socket  # here, as in this_host: a listing never calls this

    # Imported here: ``origin`` imports this module.
    from primeruns.journal.origin import boot_id

    pid = os.getpid()
    return OwnerInfo(
        pid,
        socket.gethostname(),
        time.time(),
        _proc_start(pid),
        command=_acting_as.command,
        pid_ns=_pid_ns(),
        boot=boot_id(),
    )


#: ``_pid_ns``'s answer in this process (a list: unread), dropped in a forked child.
_own_pid_ns: list[int | None] = []


def _pid_ns() -> int | None:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``), or
    None where there is none to read (no ``/proc``: macOS). Two containers
    of one pod share a host name and a disk but not their pids: a pid one
    names in a lock file means nothing in the other.

    Read once per process: a listing compares it with every journal's owner,
    and a ``stat`` in ``/proc`` was a third of judging one (~25 µs, 3,000
    past runs). A process never changes its own namespace (``unshare`` and
    ``setns`` move its children only); a child forked after
    ``unshare(CLONE_NEWPID)`` lives in another, so a forked child reads it
    anew (``_after_fork_in_child``)."""
    if not _own_pid_ns:
        try:
            _own_pid_ns.append(os.stat("/proc/self/ns/pid").st_ino)
        except OSError:
            _own_pid_ns.append(None)
    return _own_pid_ns[0]


def _elsewhere(info: OwnerInfo) -> bool:
    """Whether the lock file names its owner in another PID namespace than
    this process's, or in another boot (of this machine before it restarted,
    or of another machine of the same host name, whose namespaces' inodes
    may well equal ours): its pids mean nothing here. A file naming neither,
    an older version's, is judged here."""
    return (info.pid_ns is not None and info.pid_ns != _pid_ns()) or _another_boot(info)


def _another_boot(info: OwnerInfo) -> bool:
    """Whether the lock file names a boot and it is not this one."""
    if info.boot is None:
        return False
    from primeruns.journal.origin import boot_id

    current = boot_id()
    return current is not None and info.boot != current


def names_this_file(info: OwnerInfo | None, found: os.stat_result | None) -> bool | None:
    """Whether the lock file ``found`` (its ``lstat``) is the very file
    ``info``'s owner locked, so that its flock speaks for that owner; False
    for a copy of the journal (its record names the original's file); None
    where the record cannot tell (none, an older version's naming no file,
    or no boot known here).

    A host name and a path cannot tell: two containers (a reused pod name,
    "localhost") may both keep runs at /scratch/runs, and a copy of a live
    run from one to the other, taken for the original, read "crashed" by a
    flock nobody holds. Within one boot a file is its (st_dev, st_ino).
    Across boots (this machine restarted, or another machine of the same
    name) device numbers are not kept, so the inode alone tells: the same
    file here is the original of a writer gone with its boot (its flock,
    free, says so), another is a copy."""
    if info is None or info.file is None or info.boot is None or found is None:
        return None
    from primeruns.journal.origin import boot_id

    current = boot_id()
    if current is None:
        return None
    if info.boot == current:
        return (found.st_dev, found.st_ino) == info.file
    return found.st_ino == info.file[1]


def _lock_stat(directory: Path) -> os.stat_result | None:
    try:
        return os.lstat(os.path.join(directory, LOCK_NAME))
    except OSError:
        return None


def _ns_of(value: Any) -> int | None:
    """A namespace's inode as a lock file gives it; None for anything else
    (a file an older version wrote names none: its pids are judged as ever)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@contextlib.contextmanager
def acting_as(command: str) -> Iterator[None]:
    """Locks this thread takes meanwhile name this process as ``primeruns
    COMMAND`` (the command line's dispatch, around a command's work)."""
    before, _acting_as.command = _acting_as.command, command
    try:
        yield
    finally:
        _acting_as.command = before


def _command_of(value: Any) -> str | None:
    return value if isinstance(value, str) and _COMMAND_NAME.fullmatch(value) else None


def _boot_of(value: Any) -> str | None:
    """A boot id as a lock file gives it (a UUID's text); None for anything else."""
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


def _file_of(value: Any) -> tuple[int, int] | None:
    """A file's (st_dev, st_ino) as a lock file (or an origin) gives it; None
    for anything else."""
    # Exact types, no generator: a listing reads every journal's origin.
    if type(value) is not list or len(value) != 2:
        return None
    dev, ino = value
    if type(dev) is not int or type(ino) is not int or dev < 0 or ino < 0:
        return None
    return dev, ino


def read_owner(
    directory: Path, found: os.stat_result | None = None, *, within: int | None = None
) -> OwnerInfo | None:
    """The owner named in the lock file (informative; None if absent or
    unreadable). ``found``: the file's ``lstat``, taken by the caller;
    ``within``: the directory's descriptor, the file read in it by name."""
    try:
        # os calls on a plain path: listings read the lock file of every journal.
        path = os.path.join(directory, LOCK_NAME) if within is None else LOCK_NAME
        if found is None:
            found = os.lstat(path, dir_fd=within)
        if stat.S_ISREG(found.st_mode) and found.st_size == 0:
            return None  # no owner named (a past run's, mostly): one call, not three
        fd = os.open(path, _READING, dir_fd=within)
        try:
            raw = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        if not raw:  # no owner named (a past run's, mostly): no JSON to parse
            return None
        # orjson: the standard library's decoder takes about ten times as
        # long, once a journal (an online run's uplink leaves its name in
        # the file). What it refuses (NaN, integers past 64 bits) names no owner.
        data = orjson.loads(raw)
        if not isinstance(data, dict):
            return None
        return OwnerInfo(
            _pid_of(data["pid"]),
            _CONTROLS.sub(_escaped, str(data["host"])),
            float(data["started"]),
            None if data.get("proc_start") is None else int(data["proc_start"]),
            None if data.get("helper_pid") is None else _pid_of(data["helper_pid"]),
            None if data.get("helper_start") is None else int(data["helper_start"]),
            data.get("producer_done") is True,
            _command_of(data.get("command")),
            _ns_of(data.get("pid_ns")),
            _boot_of(data.get("boot")),
            _file_of(data.get("file")),
        )
    # The file is anyone's to write, and read where a run is closed (who
    # ships a predecessor's sync journal): an infinity (OverflowError) or
    # nesting past what json reads is no owner, not an error out of it.
    except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return None


def _escaped(control: re.Match[str]) -> str:
    return f"\\x{ord(control.group()):02x}"


def _pid_of(value: Any) -> int:
    """A pid as a lock file gives it; ValueError for none a process could
    have (``os.kill`` raised OverflowError for one past a C int, and a
    pid of 0 or below names a process group)."""
    pid = int(value)
    if not 0 < pid < 2**31:
        raise ValueError(f"not a pid: {pid}")
    return pid


#: ``this_host``'s answer, with the function that gave it (tests replace it).
_host_name_asked: tuple[Any, str] | None = None


def this_host() -> str:
    """This machine's name (``socket.gethostname``), asked once per process:
    a listing compares it with every journal's owner and origin (a ``uname``
    call each, twice per journal)."""
    global _host_name_asked
    import socket  # (here: ``import prime_runs`` alone needs none of it)

    ask = socket.gethostname
    if _host_name_asked is None or _host_name_asked[0] is not ask:
        _host_name_asked = (ask, ask())
    return _host_name_asked[1]


def owner_alive(info: OwnerInfo | None, directory: Path | None = None) -> bool:
    """Whether the named owner still writes the journal (for listings: ``ls``,
    ``show``, ``gc``'s keep-or-delete, the dashboard, the crashed-run hint).

    Another host's is alive: nothing here can tell, and it is the safe
    answer for deletion. On this host, a process the file names in this PID
    namespace that is gone (by pid and start time) is dead, and the lock is
    not touched: a look at it, shared, makes a replay's or requeue's take
    of a crashed journal, which never waits, fail for that instant. One
    that runs may not be the writer (the file is anyone's to write: one
    naming the user's shell read "running" for ever, and ``gc`` never
    deleted the journal), and a pid of another namespace (another container
    of a pod: one host name and disk) means nothing here; so where
    ``directory`` is the journal's original (its ``origin.json``: this host,
    this path), its flock decides (the kernel drops it with its last
    holder, producer or uplink). A copy (rsynced to a login node, ``cp -a``)
    holds no flock while its producer writes the original: its owner is
    judged by pid and start time, or, named in another namespace, by the
    original's flock where that is here (``Origin.producer_state``). Where
    nothing can tell (no ``directory``, a flock that cannot be asked), the
    answer is alive."""
    if info is None:
        return False
    if info.host != this_host():
        return True  # cannot tell from here: assume alive, the safe answer for deletion
    elsewhere = _elsewhere(info)
    if not elsewhere and not _named_alive(info):
        return False
    if directory is None:
        return True
    # Imported here: ``origin`` reads the lock, and is asked only of a
    # journal whose named owner runs (a listing's few live ones).
    from primeruns.journal.origin import Origin

    origin = Origin.read_beside(directory)
    # Whether this is the file its owner locked: by the record where it
    # names that file (``names_this_file``), else by where the journal was
    # written (an older version's record).
    said = names_this_file(info, _lock_stat(directory))
    if said or (said is None and origin is not None and origin.is_original(directory)):
        return _held(directory) is not False
    if not elsewhere:
        return True  # a copy: its producer, by pid and start time, runs
    if origin is None:
        # An older version's journal: its own flock, as ever; but a copy
        # (its record says so) cannot be asked here: alive, the safe answer.
        return said is not None or _held(directory) is not False
    return origin.producer_state() != "dead"


def _named_alive(info: OwnerInfo) -> bool:
    """Whether a process the lock file names, producer or uplink, runs here
    with the start time it gives."""
    if not info.producer_done and _pid_alive(info.pid, info.proc_start):
        return True
    return info.helper_pid is not None and _pid_alive(info.helper_pid, info.helper_start)


def dead_for_good(info: OwnerInfo) -> bool:
    """Whether ``info``'s owner is dead, judged by its pids with their start
    times on this host and in this PID namespace: no later look finds it alive
    while its lock file is as it was (within one boot, a pid and its start
    time never name another process). Not one judged otherwise: another
    host's (never judged), another namespace's (by its flock, which a process
    may take without writing the file), one naming no namespace (an older
    version's: judged by its pid in each listing's own namespace, where
    another container of this host may find it alive), or a pid named
    without its start time (any process that takes that pid later is taken
    for it)."""
    if info.host != this_host() or info.pid_ns is None or info.pid_ns != _pid_ns():
        return False
    if _another_boot(info):
        return False
    if info.proc_start is None or (info.helper_pid is not None and info.helper_start is None):
        return False
    return not owner_alive(info)


def lock_held(directory: Path) -> bool:
    """Whether some process holds the owner lock of the journal at ``directory``
    (its producer or uplink): true across PID namespaces, where a pid is not."""
    return _held(directory) is True


def _held(directory: Path) -> bool | None:
    """``lock_held``, or None where the flock cannot be asked (a lock file
    this user may not open, a filesystem without locks): not a free lock."""
    with _REGISTRY:  # a child forked meanwhile would keep our shared lock
        try:
            fd = os.open(os.path.join(directory, LOCK_NAME), _READING)
        except FileNotFoundError:
            return False  # no lock file: nobody's lock
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            return True if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
        finally:
            os.close(fd)  # our own shared lock, if taken, ends with its descriptor
        return False


def remove_unheld(path: Path, *companions: Path, dry_run: bool = False) -> bool:
    """Delete the file at ``path`` (``companions`` first) unless a process
    holds a ``flock`` on it: whether it was deleted (with ``dry_run``: would
    be). Its exclusive lock, taken without waiting, proves nobody holds it,
    and is held while it is deleted; a file that lost its name meanwhile (a
    process made it anew) is left."""
    try:
        fd = os.open(path, _READING)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return False  # a link: nobody's lock, nor a file of ours (never followed)
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_ino != os.stat(path, follow_symlinks=False).st_ino:
                return False
        except FileNotFoundError:
            return False  # deleted meanwhile, by another
        if not dry_run:
            for companion in companions:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(companion)
            os.unlink(path)
        return True
    finally:
        os.close(fd)


def plain_files(folder: Path, suffix: str) -> list[Path]:
    """The regular files in ``folder`` whose names end with ``suffix``, in
    order of name, for gc to look at: a link among them is never followed
    (nor deleted: not a file a process made there)."""
    with os.scandir(folder) as entries:
        names = [
            e.name for e in entries if e.name.endswith(suffix) and e.is_file(follow_symlinks=False)
        ]
    return [folder / name for name in sorted(names)]


def _pid_alive(pid: int, proc_start: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _zombie(pid):
        return False  # dead, not yet reaped (an init that reaps slowly, or never)
    now = _proc_start(pid)
    return proc_start is None or now is None or now == proc_start


@contextlib.contextmanager
def forks_wait() -> Iterator[None]:
    """Held while another module opens a lock file's descriptor and records
    it among those its after-fork handler closes (``ranks``): a fork by
    another thread meanwhile would give the child a copy it never closes."""
    with _REGISTRY:
        yield


def hold_for_fork() -> None:
    """Run by ``hooks``' before-fork handler, last: the fork waits for a
    thread opening or closing a lock's descriptor (module doc)."""
    _REGISTRY.acquire()


def let_go_after_fork() -> None:
    """Run by ``hooks``' after-fork handler in the parent."""
    _REGISTRY.release()


def _after_fork_in_child() -> None:
    """Run by ``hooks``' after-fork handler: a forked child closes its copy
    of each owner lock its parent held (module doc)."""
    global _REGISTRY
    _REGISTRY = threading.RLock()  # held by the parent's forking thread
    _own_pid_ns.clear()  # its namespace may be another (``_pid_ns``)
    for lock in list(_HELD):
        lock.forget_in_child()
    _HELD.clear()
    for fd in _WAITING:  # no thread waits here: a flock the parent's took would live on
        with contextlib.suppress(OSError):
            os.close(fd)
    _WAITING.clear()


def _write_record(fd: int, record: dict[str, Any]) -> None:
    """Write ``record`` as the lock file's content, so that a listing
    reading the file meanwhile finds the record before or the one after,
    never none (cut to nothing first, a live run's file read "no owner")
    nor a cut one (a shorter record over a longer one, the end of the
    longer after it: not JSON). It goes over the one before padded with
    spaces to its length (JSON past its end may be blank), then the file
    is cut to its own length."""
    encoded = json.dumps(record).encode()
    before = os.fstat(fd).st_size
    os.pwrite(fd, encoded.ljust(before), 0)
    if before > len(encoded):
        os.ftruncate(fd, len(encoded))


def _locked_descriptor(path: Path, within: int | None = None) -> int | None:
    """``path`` opened and flocked, exclusively; None: another process holds
    it. ``within``: the folder's descriptor, the file opened in it by name,
    never made (FileNotFoundError: see ``OwnerLock``)."""
    # Never through a link: one planted here would be truncated (trust).
    made = os.O_CREAT if within is None else 0
    try:
        fd = os.open(
            path if within is None else path.name,
            os.O_RDWR | made | os.O_CLOEXEC | os.O_NOFOLLOW,
            0o600,
            dir_fd=within,
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedPathError(f"{path} is a symbolic link: not opened") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        # A named pipe flocks as a file does, but no owner ever locked one:
        # taken, it spoke for nobody (gc deleted the live run it replaced).
        os.close(fd)
        raise UntrustedPathError(f"{path} is not a regular file: not locked")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return None
    return fd


class OwnerLock:
    """An exclusive, non-blocking flock on ``<directory>/owner.lock``."""

    def __init__(self, directory: Path, *, record: bool = True, within: int | None = None) -> None:
        """Take the lock or raise JournalLockedError naming the live owner.

        ``record`` writes this process as the owner into the lock file.
        ``within``: a descriptor of ``directory`` the caller opened (and
        checked): the lock is the one in that folder, whatever the path
        names by now (``delete_journal``: a folder moved aside and a link
        put in its place had the linked run's lock taken instead), and
        never made there: one gone since the caller looked (a tmp
        cleaner's) may be a live owner's, held unnamed until it makes the
        file again (``restore``), and a new one taken spoke for nobody.
        """
        self.path = directory / LOCK_NAME
        self._pid = os.getpid()
        with _REGISTRY:  # opened and known as held at once (module doc)
            fd = _locked_descriptor(self.path, within)
            if fd is not None:
                self._fd: int | None = fd
                _HELD.add(self)
        if fd is None:
            info = read_owner(directory, within=within)
            who = info.describe() if info else "another process"
            raise JournalLockedError(
                f"journal {directory} is owned by {who}, which is still running",
                owner=info.describe() if info else None,
            )
        self._shared = False
        self.inherited = False  # the uplink's copy, from its producer
        self._helper: tuple[int, int | None] | None = None  # the uplink named (``add_helper``)
        self._waiting: int | None = None  # the partner's file, flock awaited (``restore``)
        found = os.fstat(fd)
        self.owner = dataclasses.replace(current_owner(), file=(found.st_dev, found.st_ino))
        if record:
            try:
                _write_record(fd, self.owner.to_json())
                os.fchmod(fd, 0o600)
            except OSError:
                # A full disk: the caller gives the directory up, so must we.
                self.release()
                raise

    @classmethod
    def inherit(cls, directory: Path, fd: int) -> OwnerLock:
        """The lock a producer shared with this process (its uplink), as descriptor ``fd``."""
        self = cls.__new__(cls)
        self.path = directory / LOCK_NAME
        self._pid = os.getpid()
        self._fd = fd
        _HELD.add(self)
        self._shared = True
        self.inherited = True
        self._helper = None
        self._waiting = None
        os.set_inheritable(fd, False)
        info = read_owner(directory)
        self.owner = info or current_owner()
        return self

    def share(self) -> int:
        """The descriptor to hand to the uplink process; from now on this
        process closes its copy without unlocking (see module doc)."""
        if self._fd is None:
            raise ValueError("the lock is released")
        self._shared = True
        return self._fd

    def unshare(self) -> None:
        self._shared = False

    def add_helper(self, pid: int) -> None:
        """Name process ``pid`` in the lock file as the uplink sharing the lock."""
        self._helper = (pid, _proc_start(pid))
        # Not the record of the file ``restore`` replaced meanwhile.
        with _REGISTRY:
            data = {**self.owner.to_json(), "helper_pid": pid, "helper_start": self._helper[1]}
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    _write_record(self._fd, data)

    def restore(self) -> bool:
        """Give the lock file its name back if it lost it (a tmp cleaner, a
        ``find -delete`` of old files, took ``owner.lock`` alone): whether
        this process now holds a new one at the path.

        The flock lives on with the unnamed file, but nobody else can ask it:
        a live run read "crashed" (``ls``, ``show``, the crashed-run hint),
        ``gc --force`` offered to delete it, and ``replay`` or a requeued job
        took over a journal still written. So the holder makes the file
        again and locks it, with its record naming the new file (a record
        naming another file reads as a copy's). One fstat while the name is
        there. A file made at the path meanwhile is taken only if free: its
        flock held is our partner's (the producer's or its uplink's, which
        share the unnamed one) or a taker's, which this does not undo. The
        partner's is waited for (``_wait_for_partner``): the two no longer
        share a flock at the path, and the one that made it may go first."""
        with _REGISTRY:  # swapped as a fork would see it whole (module doc)
            fd = self._fd
            if fd is None or os.getpid() != self._pid:
                return False
            try:
                if os.fstat(fd).st_nlink > 0:
                    return False
                new = _locked_descriptor(self.path)
            except (OSError, UntrustedPathError):
                # A full or read-only disk, a link or a named pipe planted
                # (never followed nor taken, and no error out of the
                # background sync, whose thread it ended): looked at again
                # at the next write.
                return False
            if new is None:
                self._wait_for_partner()
                return False
            self._take(new)
            return True

    def _take(self, new: int) -> None:
        """Hold ``new``, a locked file at the path, in place of the unnamed
        one (under ``_REGISTRY``), its record naming it."""
        fd = self._fd
        assert fd is not None
        found = os.fstat(new)
        self.owner = dataclasses.replace(self.owner, file=(found.st_dev, found.st_ino))
        record = self.owner.to_json()
        if self.inherited:
            # The uplink, after its producer let go of the file it made
            # again: its record (``producer_done``), naming this uplink.
            there = read_owner(self.path.parent)
            if there is not None and there.pid == self.owner.pid:
                record = {**there.to_json(), "file": record["file"]}
            record.update(helper_pid=self._pid, helper_start=_proc_start(self._pid))
        elif self._helper is not None:
            record.update(helper_pid=self._helper[0], helper_start=self._helper[1])
        with contextlib.suppress(OSError):  # its flock speaks all the same
            _write_record(new, record)
        # The unnamed file's flock is let go with this descriptor only (a
        # partner keeps its own): replaced, never unlocked (``release``).
        # Put in its place, under its number: ``share`` handed that number
        # to an uplink's spawn, which passes it a moment later (closed
        # meanwhile, the uplink was given no lock, or the file opened next
        # under that number: its log).
        os.dup2(new, fd, inheritable=False)
        os.close(new)

    def _wait_for_partner(self) -> None:
        """The file at the path is held, and its record names this run's
        owner (the producer, as each of the two writes it): our partner made
        it again and holds it alone, while this process holds the unnamed
        one. Wait for its flock in a thread (under ``_REGISTRY``), so this
        process takes it the instant the partner lets go: the producer's
        exit (or SIGKILL) while its uplink still ships, or the uplink's
        death while its producer writes on. Looked at only at this
        process's next write, the file was free meanwhile (for as long as
        the uplink waited on a platform down): the run read "crashed", ``gc
        --force`` deleted it and a requeued job took it over under its
        shipping uplink. One thread, blocked in the kernel: no wake-up."""
        if self._waiting is not None:
            return
        there = read_owner(self.path.parent)
        mine = self.owner
        if there is None or (there.pid, there.proc_start, there.started) != (
            mine.pid,
            mine.proc_start,
            mine.started,
        ):
            return  # a taker's, or not yet written: the next write looks again
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != there.file:
            os.close(fd)  # replaced meanwhile: the next write looks again
            return
        waiter = threading.Thread(
            target=self._await_partner, args=(fd,), name="primeruns-lock-wait", daemon=True
        )
        self._waiting = fd
        _WAITING.add(fd)
        try:
            waiter.start()
        except RuntimeError:  # at interpreter shutdown, or out of threads
            self._waiting = None
            _WAITING.discard(fd)
            os.close(fd)

    def _await_partner(self, fd: int) -> None:
        """The waiting thread: flock ``fd``'s file once the partner lets go,
        and hold it if this process still holds the run's unnamed lock file
        and the file still has its name; else close it (only here: its
        number is never closed under a flock waiting on it)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            got = True
        except OSError:
            got = False
        with _REGISTRY:
            held, wanted = self._fd, got and self._waiting == fd
            if self._waiting == fd:
                self._waiting = None
            _WAITING.discard(fd)
            if wanted and held is not None and os.getpid() == self._pid:
                with contextlib.suppress(OSError):
                    if os.fstat(fd).st_nlink > 0 and os.fstat(held).st_nlink == 0:
                        self._take(fd)
                        return
            os.close(fd)

    def _mark_producer_done(self, fd: int) -> None:
        info = read_owner(self.path.parent)
        if info is None or info.pid != self._pid:
            return
        with contextlib.suppress(OSError):
            _write_record(fd, {**info.to_json(), "producer_done": True})

    def forget_in_child(self) -> None:
        """In a forked child: close this process's copy of the descriptor,
        never unlocking it (the parent holds it on)."""
        if os.getpid() == self._pid:
            return
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def release(self) -> None:
        """Release the lock; idempotent, and a no-op in a forked child (see module doc)."""
        with _REGISTRY:  # a child forked meanwhile would keep the descriptor
            self._let_go()

    def _let_go(self) -> None:
        fd, self._fd = self._fd, None
        self._waiting = None  # its thread closes its descriptor (``_await_partner``)
        _HELD.discard(self)
        if fd is None or os.getpid() != self._pid:
            return
        if self._shared:
            if not self.inherited:
                # The producer lets go first or last; either way only its
                # uplink may still hold the lock now, so listings must judge
                # by the uplink alone. Otherwise a finished run whose producer
                # lives on (a notebook, a script of several evaluations) would
                # be listed as running for as long as it does.
                self._mark_producer_done(fd)
            os.close(fd)  # the flock ends with the last holder's close
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no owner any more: listings show none
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# The owner locks this process holds, taken or inherited from its producer
# (its uplink): a forked child closes its copies (``_after_fork_in_child``).
_HELD: weakref.WeakSet[OwnerLock] = weakref.WeakSet()
# Held while a lock's descriptor is opened or closed, and by a fork (module doc).
_REGISTRY = threading.RLock()
# The descriptors a thread of this process waits to flock (``_wait_for_partner``),
# held or not by a lock any more: a forked child closes its copies.
_WAITING: set[int] = set()
