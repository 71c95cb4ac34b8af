"""One step's metrics row, merged across the processes that log into one run.

The platform keeps one metrics row per step of a run, and a later row for a
step replaces the earlier one (the local platform does so; the real
platform's choice is not known from its clients, contract §8.4, so nothing
here relies on a merge there). Ranks of one run each log their own row for a
step: sent as they are, the last to land would be the step's row, and the
other ranks' keys would be lost.

So every row a process sends for a step carries every key the run's
processes on this host logged for that step. Each process's rows go into a
small table beside the journals (``<runs dir>/.steps/<run>.sqlite3``,
``StepRows.merge``: one transaction, its own keys over its earlier ones for
the step), and the merged row is what is sent. After its request was
answered the sender looks at the step's version again, and if another
process changed the step meanwhile, sends the merged row again. Why that
keeps every key: the last request to land for a step was answered after it
landed, and its sender looked at the step after that; every change to the
step was made before its maker's own request landed, so before that look.
The look sees the final version, or the sender sends it again.

Two processes that log one key for one step with different values keep
both: the primary's (else the lowest rank's) under the key, each other's
under ``<key>@<label>`` (``loss@rank3``; a process with no rank: its journal
id). ``_timestamp`` is the latest. One process logging a step twice keeps
the union of its keys, the later value of each.

Not merged: processes on other hosts (each host's table is its own), and a
row without a step (the platform keeps each as its own row). If the table
cannot be used (a full disk), rows are sent as they were logged, with one
warning.

A table made anew starts from what the platform holds for the run (the
``landed`` reader: every step's row, read before the table takes its name, a
new run's one empty page): ``rm -rf`` of the runs directory (a scratch wipe)
takes the table with the journals while the processes go on logging, each
re-creating its journal (``rehoming``), and a table that started empty had
the next row of a step sent before lose the keys the other processes logged
for it. The platform's row fills in only keys no process gave (the part
``(landed)``, never under ``<key>@<label>``); its ``<key>@<label>`` of a
process that gives ``<key>`` again is that process's part to say, and its
``<key>`` beside it was the value of a process that outranks that one.
A process whose table lost its name while it had it open (each
transaction looks: an ``fstat`` and a ``stat``; one that SQLite failed as
the name went, or whose table was wiped while it was made, is done again)
goes on in the one at the path, and a step it sent through the old one
goes again through the new one. Where the platform gives no read of a
run's rows, what landed before cannot be put back: a process that saw its
table go says so, once, whichever process made the new one (the table says
it was made without a read).

A table names the run it merges (its ``about`` row), and each process holds
a shared ``flock`` on its file while it has it open: ``primeruns gc`` deletes
the tables of runs it collected (``tables``, ``delete_table``) only under an
exclusive lock it takes without waiting, so never one a live process uses;
a process that opened the file as it was deleted opens the new one instead.
A table being made (its draft, ``drafts``) is locked by its maker while it
is filled: gc deletes only those a killed process left (``delete_draft``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from primeruns.logs import get_logger

from ..exceptions import JournalError
from ..journal.lock import plain_files, remove_unheld
from ..journal.trust import check_dir, make_private_dirs
from ..records import encode_parsed

__all__ = [
    "Landed",
    "StepRows",
    "delete_draft",
    "delete_table",
    "drafts",
    "merged_row",
    "table_name",
    "table_run",
    "tables",
]

log = get_logger("primeruns.uplink")

_FOLDER = ".steps"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS steps ("
    " step INTEGER PRIMARY KEY, parts TEXT NOT NULL, version INTEGER NOT NULL)"
)
_ABOUT = "CREATE TABLE IF NOT EXISTS about (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
# Said by a table made where the platform gave no read of the run's rows.
_UNREAD = "INSERT OR IGNORE INTO about (name, value) VALUES ('landed', 'none')"
_SUFFIX = ".sqlite3"
# A table being made: ``<table's name>.<random>`` and this (``StepRows._make``).
_DRAFT = ".new"
# Waits for another process's transaction on the table at most this long.
_BUSY_S = 30.0
# Steps looked up per query (SQLite's bound on parameters is far higher).
_IN_LIMIT = 500
# The table's parts are written compact; one encoder for all (``json.dumps``
# with arguments makes a new one for each call).
_COMPACT = json.JSONEncoder(separators=(",", ":"))
# Opening a file gc deleted meanwhile is tried again this many times.
_OPEN_TRIES = 5
# SQLite's page cache for a table, in KiB (its default: 2,000).
_CACHE_KIB = 256
# The part of a step holding the row the platform held when the table was
# made (no process's label: those are ``rank<N>`` or a journal's id).
_LANDED = "(landed)"
# A step's version reported for a step sent through a table that was then
# deleted or replaced: never one a merge gives (those start at 1).
_GONE = -1

_T = TypeVar("_T")

Landed = Callable[[str], "Iterable[list[dict[str, Any]]] | None"]
"""The metrics rows the platform holds for the run of a table's key, each
with its step, a page at a time; None where the platform offers no such read."""


def table_name(key: str) -> str:
    """The file name of the table of ``key`` (a platform's API root and a run id)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32] + _SUFFIX


def _held_open(path: Path, make: Callable[[], None]) -> int:
    """A descriptor of the table file at ``path`` (``make`` puts one there
    when there is none), with a shared lock on it that says a process uses
    the table (gc leaves it)."""
    for _ in range(_OPEN_TRIES):
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            make()
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # gc holds it only to unlink the file
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return fd
        except OSError:
            pass  # deleted between the open and the stat: open the new file
        os.close(fd)
    raise OSError(f"the step table {path} was deleted each time it was opened")


class StepRows:
    """The merged rows of the steps of one platform run on this host, for
    one process (``label``, and whether it is the run's ``primary``).
    Thread-safe; opened on first use."""

    def __init__(
        self,
        folder: Path,
        *,
        label: str,
        primary: bool,
        rank: int | None,
        landed: Landed | None = None,
        shipped_before: bool = False,
    ) -> None:
        """``landed``: what a table made anew starts from (module doc); None:
        nothing (a table read only locally). ``shipped_before``: this
        process's journal shipped rows before (through a table: one it has
        to make replaces a lost one, a journal re-created under its run)."""
        self._folder = Path(folder) / _FOLDER
        self._part = {"primary": primary, "rank": rank}
        self._label = label
        self._landed = landed
        self._lock = threading.Lock()
        self._conns: dict[str, sqlite3.Connection] = {}
        self._held: dict[str, int] = {}  # the tables' files, locked shared while open
        self._broken = False
        self._loss_said = False
        self._shipped_before = shipped_before
        # The keys whose table this process used lost its name, and whose
        # new table it has not opened yet (a wipe again while it made it).
        self._gone: set[str] = set()

    def _conn(self, key: str) -> tuple[sqlite3.Connection, bool]:
        """The table of ``key``, and whether it is another file than the one
        this process had open for it (deleted or replaced meanwhile)."""
        conn = self._conns.get(key)
        if conn is not None and not self._replaced(key):
            return conn, False
        if conn is not None:
            self._let_go(key)
            self._gone.add(key)
        conn = self._open(key)
        replaced = key in self._gone
        self._gone.discard(key)
        return conn, replaced

    def _open(self, key: str) -> sqlite3.Connection:
        """The table of ``key`` opened, made when there is none, held shared."""
        make_private_dirs(self._folder)
        check_dir(self._folder, "step table folder")  # never a symlink, never another's
        path = self._folder / table_name(key)
        made = False

        def make() -> None:
            nonlocal made
            self._make(path, key)
            made = True

        fd = _held_open(path, make)
        try:
            # Never made here (``mode=rw``): a file SQLite made at a path
            # wiped since the check would be a table empty of what landed.
            conn = sqlite3.connect(
                f"{path.absolute().as_uri()}?mode=rw",
                uri=True,
                timeout=_BUSY_S,
                isolation_level=None,
                check_same_thread=False,
            )
        except BaseException:
            os.close(fd)
            raise
        self._held[key] = fd
        # The default rollback journal, not WAL: switching a new file to
        # WAL while another rank opens it fails at once with "database is
        # locked" (no busy wait; 26 of 150 trials of four at once), and
        # that rank's rows then went unmerged, losing its keys at the step.
        conn.execute("PRAGMA synchronous=NORMAL")
        # A step's row is looked up and written near the table's end:
        # SQLite's default cache (2 MB) filled with the pages of the steps
        # before, resident in a long run's shipping process for nothing.
        conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        _initialise(conn, key)  # (an older version's process made the file empty)
        self._conns[key] = conn
        # One this process's rows went through was there (it saw it go, or
        # its journal shipped before the table it made), and this one holds
        # nothing of what landed: said, whichever process made it.
        lost = key in self._gone or (self._shipped_before and made)
        if lost and self._landed is not None and _made_unread(conn):
            self._say_lost(path)
        return conn

    def _say_lost(self, path: Path) -> None:
        if self._loss_said:
            return
        self._loss_said = True
        log.warning(
            "prime-runs: the table that merges the metrics rows of this host's processes "
            "(%s) was deleted while the run used it, and the platform gave no read of "
            "the run's rows to start the new one from: a step logged again by one process "
            "loses the keys the others logged for it before",
            path,
        )

    def _make(self, path: Path, key: str) -> None:
        """Put a table at ``path`` holding what the platform holds for the
        run (``landed``), made whole under another name first, so no process
        merges into it before (another process's may take the name first).
        One made without a read of the run's rows says so (``_made_unread``).

        Read after the old table lost its name, that holds every row sent
        through it: a process that sent one looked at its step after it
        landed, and saw the table still there (it landed before this read)
        or gone (it sends the row again: ``versions``)."""
        landed = None if self._landed is None else self._landed(key)
        draft = path.with_name(f"{path.name}.{secrets.token_hex(8)}{_DRAFT}")
        fd = os.open(
            draft, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        # Held while it is filled: gc deletes a draft only a killed process left.
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            conn = sqlite3.connect(str(draft), isolation_level=None)
            try:
                _initialise(conn, key)
                if landed is None:
                    conn.execute(_UNREAD)
                for page in landed or ():
                    _put_landed(conn, page)
            finally:
                conn.close()
            with contextlib.suppress(FileExistsError):
                os.link(draft, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(draft)
            # Let go, not only closed: a child forked meanwhile shares the
            # lock, and the table the draft became would stay locked for as
            # long as it lived (every process opening it waiting).
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _replaced(self, key: str) -> bool:
        """Whether the table file this process holds for ``key`` lost its
        name (``rm -rf`` of the runs directory, or gc's delete and a new one)."""
        held = os.fstat(self._held[key])
        try:
            now = os.stat(self._folder / table_name(key), follow_symlinks=False)
        except FileNotFoundError:
            return True
        return (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino)

    def _let_go(self, key: str) -> None:
        conn = self._conns.pop(key)
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        with contextlib.suppress(OSError):
            os.close(self._held.pop(key))

    def merge(
        self, run: str, step: int, row: Mapping[str, Any]
    ) -> tuple[dict[str, Any], int] | None:
        """Put ``row`` (this process's, for ``step`` of ``run``: the platform
        and run id) into the table; the step's merged row and its version, or
        None when the table cannot be used (then the row goes as it is)."""
        merged = self.merge_many(run, [(step, row)])
        return None if merged is None else merged[0]

    def merge_many(
        self, run: str, rows: Sequence[tuple[int, Mapping[str, Any]]]
    ) -> list[tuple[dict[str, Any], int]] | None:
        """``merge`` of several rows (``(step, row)``, in the order logged) in
        one transaction: a backlog pays one commit for many rows, not one
        each. Each row's merged row and version, as ``merge`` gives them (a
        step met twice: the second includes the first); None when the table
        cannot be used."""

        def merge(conn: sqlite3.Connection, _: bool) -> list[tuple[dict[str, Any], int]]:
            out: list[tuple[dict[str, Any], int]] = []
            with _transaction(conn):
                stored = _stored(conn, {step for step, _ in rows})
                for step, row in rows:
                    out.append(self._merge_in(conn, step, row, stored))
            return out

        return self._in_table(run, merge)

    def _merge_in(
        self,
        conn: sqlite3.Connection,
        step: int,
        row: Mapping[str, Any],
        stored: dict[int, tuple[str, int]],
    ) -> tuple[dict[str, Any], int]:
        """One row into the table, inside the caller's transaction; ``stored``:
        the table's ``(parts, version)`` of the transaction's steps, as read at
        its start and kept up to date here (what a read of the step now gives)."""
        found = stored.get(step)
        parts: dict[str, Any] = json.loads(found[0]) if found else {}
        version = int(found[1]) if found else 0
        mine = parts.get(self._label) or {}
        ours = {**(mine.get("row") or {}), **row}
        if ours != mine.get("row") or found is None:
            parts[self._label] = {**self._part, "row": ours}
            version += 1
            stored[step] = _put(conn, step, parts, version)
        return merged_row(step, parts), version

    def version(self, run: str, step: int) -> int | None:
        """The step's version now (None: the table cannot be read)."""
        found = self.versions(run, [step])
        return None if found is None else found[step]

    def versions(self, run: str, steps: Collection[int]) -> dict[int, int] | None:
        """The versions of ``steps`` now, in one read (0: a step not in the
        table; None: the table cannot be read)."""

        def read(conn: sqlite3.Connection, replaced: bool) -> dict[int, int]:
            if replaced:  # what was sent through the old table goes again
                return dict.fromkeys(steps, _GONE)
            out = dict.fromkeys(steps, 0)
            wanted = list(out)
            for start in range(0, len(wanted), _IN_LIMIT):
                chunk = wanted[start : start + _IN_LIMIT]
                marks = ",".join("?" * len(chunk))
                for step, version in conn.execute(
                    f"SELECT step, version FROM steps WHERE step IN ({marks})", chunk
                ):
                    out[int(step)] = int(version)
            return out

        return self._in_table(run, read)

    def _in_table(self, key: str, work: Callable[[sqlite3.Connection, bool], _T]) -> _T | None:
        """``work`` on the table of ``key`` (given whether it replaces one
        that lost its name), under the lock. None when the table cannot be
        used (given up: rows go as logged from then on); but a table that
        lost its name during ``work`` (SQLite: "disk I/O error", "readonly
        database"), or while it was opened or made, is no reason: ``work`` is
        done again in the one at the path."""
        if self._broken:
            return None
        for _ in range(2):
            try:
                with self._lock:
                    conn, replaced = self._conn(key)
                    return work(conn, replaced)
            except (sqlite3.Error, OSError, ValueError, JournalError) as exc:
                error = exc
                if not self._lost_name(key):
                    break
        self._give_up(error)
        return None

    def _lost_name(self, key: str) -> bool:
        """Whether the table of ``key`` lost its name: the one this process
        holds, or one it failed to open or make (the folder or the file
        went meanwhile: a wipe during the read of the run's rows)."""
        with self._lock:
            try:
                return key not in self._held or self._replaced(key)
            except OSError:
                return False

    def _give_up(self, exc: BaseException) -> None:
        self._broken = True
        log.warning(
            "prime-runs: the table that merges the metrics rows of this host's processes "
            "(%s) cannot be used (%s); rows are sent as logged, and where two processes "
            "log one step the later row replaces the earlier on the platform",
            self._folder,
            exc,
        )

    def close(self) -> None:
        with self._lock:
            for key in list(self._conns):
                self._let_go(key)


# -- for gc -------------------------------------------------------------------------------


def tables(runs_dir: Path) -> list[Path]:
    """The step tables kept beside the journals of ``runs_dir``."""
    return _files(runs_dir, _SUFFIX)


def drafts(runs_dir: Path) -> list[Path]:
    """The tables being made beside the journals of ``runs_dir``, or left
    unfinished by a process killed while it made one (``StepRows._make``)."""
    return _files(runs_dir, _DRAFT)


def _files(runs_dir: Path, suffix: str) -> list[Path]:
    """The files named ``*<suffix>`` in the step table folder of ``runs_dir``
    (none in one that is not the user's own: never followed, never listed)."""
    folder = Path(runs_dir) / _FOLDER
    try:
        check_dir(folder, "step table folder")
        return plain_files(folder, suffix)
    except (OSError, JournalError):
        return []


def delete_draft(path: Path, *, dry_run: bool) -> bool:
    """Delete the draft at ``path`` unless a process is filling it (its lock):
    False, kept (``dry_run``: whether it would be deleted)."""
    return remove_unheld(path, Path(f"{path}-journal"), dry_run=dry_run)


def table_run(path: Path) -> str | None:
    """The key of the run the table at ``path`` merges (its platform's API
    root and the run id), read without writing; None when it does not say
    (a table made before tables said it) or cannot be read."""
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None
    try:
        found = conn.execute("SELECT value FROM about WHERE name = 'run'").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return str(found[0]) if found else None


def delete_table(path: Path) -> bool:
    """Delete the table at ``path`` unless a process has it open (its shared
    lock): False, kept. Its rollback journal, if a writer left one, goes too."""
    return remove_unheld(path, Path(f"{path}-journal"))


def _initialise(conn: sqlite3.Connection, key: str) -> None:
    """The table's schema, and which run it merges (gc collects it with the run's journals)."""
    conn.execute(_SCHEMA)
    conn.execute(_ABOUT)
    conn.execute("INSERT OR IGNORE INTO about (name, value) VALUES ('run', ?)", (key,))


def _made_unread(conn: sqlite3.Connection) -> bool:
    """Whether the table was made without a read of the run's rows (a table
    an older version made says nothing: not said, as it was not before)."""
    return (
        conn.execute("SELECT 1 FROM about WHERE name = 'landed' AND value = 'none'").fetchone()
        is not None
    )


def _put_landed(conn: sqlite3.Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """The platform's rows into each step's ``(landed)`` part, in one
    transaction; a step whose part changed gets a new version (a process
    that sent it meanwhile sends it again)."""
    if not rows:
        return
    by_step = {row["step"]: row for row in rows}
    with _transaction(conn):
        stored = _stored(conn, by_step)
        for step, row in by_step.items():
            found = stored.get(step)
            parts: dict[str, Any] = json.loads(found[0]) if found else {}
            before = (parts.get(_LANDED) or {}).get("row") or {}
            now = {**before, **row}
            if found is not None and now == before:
                continue
            parts[_LANDED] = {"row": now}
            _put(conn, step, parts, int(found[1]) + 1 if found else 1)


def _put(
    conn: sqlite3.Connection, step: int, parts: Mapping[str, Any], version: int
) -> tuple[str, int]:
    """Store a step's parts and version; what a read of the step now gives."""
    try:
        # orjson where it writes what reads back the same (a fifth of
        # ``json``'s CPU, once for every row a sync ships); the parts are
        # parsed rows (``encode_parsed``)
        text = encode_parsed(parts).decode()
    except ValueError:  # NaN or an infinity (a landed row's): written as json writes it
        text = _COMPACT.encode(parts)
    conn.execute(
        "INSERT INTO steps (step, parts, version) VALUES (?, ?, ?)"
        " ON CONFLICT (step) DO UPDATE SET parts = excluded.parts,"
        " version = excluded.version",
        (step, text, version),
    )
    return text, version


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, taken at once (two merges of a step never interleave)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _given_by_its_label(key: str, parts: Mapping[str, Any]) -> bool:
    """Whether ``key`` is ``<key>@<label>`` of a process whose part gives ``<key>``."""
    name, at, label = key.rpartition("@")
    part = parts.get(label) if at and label != _LANDED else None
    return part is not None and name in (part.get("row") or {})


def _order(item: tuple[str, Any]) -> tuple[int, int, str]:
    label, part = item
    if label == _LANDED:  # the platform's row fills in last
        return (2, 0, label)
    rank = part.get("rank")
    return (
        0 if part.get("primary") else 1,
        rank if isinstance(rank, int) else 1 << 62,
        label,
    )


def _stored(conn: sqlite3.Connection, steps: Collection[int]) -> dict[int, tuple[str, int]]:
    """The ``(parts, version)`` the table holds for each of ``steps`` it has:
    read in a few queries for a whole window of a backlog's rows, not one
    per row (a query is a few µs of the sync's CPU, for each row it ships)."""
    wanted = list(steps)
    found: dict[int, tuple[str, int]] = {}
    for start in range(0, len(wanted), _IN_LIMIT):
        chunk = wanted[start : start + _IN_LIMIT]
        marks = ",".join("?" * len(chunk))
        for step, parts, version in conn.execute(
            f"SELECT step, parts, version FROM steps WHERE step IN ({marks})", chunk
        ):
            found[int(step)] = (parts, int(version))
    return found


def merged_row(step: int, parts: Mapping[str, Any]) -> dict[str, Any]:
    """The row sent for ``step``, from every process's part (module doc)."""
    out: dict[str, Any] = {}
    latest: float | None = None
    landed = (parts.get(_LANDED) or {}).get("row") or {}
    for label, part in sorted(parts.items(), key=_order):
        row = part.get("row") or {}
        fills_in = label == _LANDED  # a key no process gave, never one of its own
        for key, value in row.items():
            if key == "step":
                continue
            if key == "_timestamp":
                if isinstance(value, int | float) and (latest is None or value > latest):
                    latest = value
                continue
            if fills_in and _given_by_its_label(key, parts):
                continue  # the platform's ``<key>@<label>`` of a process whose part says it now
            if landed and not fills_in and key not in out and f"{key}@{label}" in landed:
                # The platform held this process's value beside another's
                # under the key: the value of a process that outranks it.
                out[key] = landed.get(key, value)
            if key not in out:
                out[key] = value
            elif out[key] != value and not fills_in:
                out[f"{key}@{label}"] = value
    out["step"] = step
    if latest is not None:
        out["_timestamp"] = latest
    return out
