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

A table names the run it merges (its ``about`` row), and each process holds
a shared ``flock`` on its file while it has it open: ``primeruns gc`` deletes
the tables of runs it collected (``tables``, ``delete_table``) only under an
exclusive lock it takes without waiting, so never one a live process uses;
a process that opened the file as it was deleted opens the new one instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..exceptions import JournalError
from ..journal.trust import check_dir, make_private_dirs

__all__ = ["StepRows", "delete_table", "merged_row", "table_name", "table_run", "tables"]

log = logging.getLogger("primeruns.uplink")

_FOLDER = ".steps"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS steps ("
    " step INTEGER PRIMARY KEY, parts TEXT NOT NULL, version INTEGER NOT NULL)"
)
_ABOUT = "CREATE TABLE IF NOT EXISTS about (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
_SUFFIX = ".sqlite3"
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


def table_name(key: str) -> str:
    """The file name of the table of ``key`` (a platform's API root and a run id)."""
    return hashlib.sha256(key.encode()).hexdigest()[:32] + _SUFFIX


def _held_open(path: Path) -> int:
    """A descriptor of the table file at ``path``, made private if new, with
    a shared lock on it that says a process uses the table (gc leaves it)."""
    for _ in range(_OPEN_TRIES):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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

    def __init__(self, folder: Path, *, label: str, primary: bool, rank: int | None) -> None:
        self._folder = Path(folder) / _FOLDER
        self._part = {"primary": primary, "rank": rank}
        self._label = label
        self._lock = threading.Lock()
        self._conns: dict[str, sqlite3.Connection] = {}
        self._held: list[int] = []  # the tables' files, locked shared while open
        self._broken = False

    def _conn(self, key: str) -> sqlite3.Connection:
        conn = self._conns.get(key)
        if conn is None:
            make_private_dirs(self._folder)
            check_dir(self._folder, "step table folder")  # never a symlink, never another's
            path = self._folder / table_name(key)
            fd = _held_open(path)  # made private before sqlite opens it
            try:
                conn = sqlite3.connect(
                    str(path), timeout=_BUSY_S, isolation_level=None, check_same_thread=False
                )
            except BaseException:
                os.close(fd)
                raise
            self._held.append(fd)
            # The default rollback journal, not WAL: switching a new file to
            # WAL while another rank opens it fails at once with "database is
            # locked" (no busy wait; 26 of 150 trials of four at once), and
            # that rank's rows then went unmerged, losing its keys at the step.
            conn.execute("PRAGMA synchronous=NORMAL")
            # A step's row is looked up and written near the table's end:
            # SQLite's default cache (2 MB) filled with the pages of the steps
            # before, resident in a long run's shipping process for nothing.
            conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            conn.execute(_SCHEMA)
            conn.execute(_ABOUT)  # which run: gc collects it with the run's journals
            conn.execute("INSERT OR IGNORE INTO about (name, value) VALUES ('run', ?)", (key,))
            self._conns[key] = conn
        return conn

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
        if self._broken:
            return None
        out: list[tuple[dict[str, Any], int]] = []
        try:
            with self._lock:
                conn = self._conn(run)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    stored = _stored(conn, {step for step, _ in rows})
                    for step, row in rows:
                        out.append(self._merge_in(conn, step, row, stored))
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
            return out
        except (sqlite3.Error, OSError, ValueError, JournalError) as exc:
            self._give_up(exc)
            return None

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
            text = _COMPACT.encode(parts)
            conn.execute(
                "INSERT INTO steps (step, parts, version) VALUES (?, ?, ?)"
                " ON CONFLICT (step) DO UPDATE SET parts = excluded.parts,"
                " version = excluded.version",
                (step, text, version),
            )
            stored[step] = (text, version)
        return merged_row(step, parts), version

    def version(self, run: str, step: int) -> int | None:
        """The step's version now (None: the table cannot be read)."""
        found = self.versions(run, [step])
        return None if found is None else found[step]

    def versions(self, run: str, steps: Collection[int]) -> dict[int, int] | None:
        """The versions of ``steps`` now, in one read (0: a step not in the
        table; None: the table cannot be read)."""
        if self._broken:
            return None
        try:
            out = dict.fromkeys(steps, 0)
            with self._lock:
                conn = self._conn(run)
                wanted = list(out)
                for start in range(0, len(wanted), _IN_LIMIT):
                    chunk = wanted[start : start + _IN_LIMIT]
                    marks = ",".join("?" * len(chunk))
                    for step, version in conn.execute(
                        f"SELECT step, version FROM steps WHERE step IN ({marks})", chunk
                    ):
                        out[int(step)] = int(version)
            return out
        except (sqlite3.Error, OSError) as exc:
            self._give_up(exc)
            return None

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
            for conn in self._conns.values():
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._conns.clear()
            for fd in self._held:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._held.clear()


# -- for gc -------------------------------------------------------------------------------


def tables(runs_dir: Path) -> list[Path]:
    """The step tables kept beside the journals of ``runs_dir``."""
    folder = Path(runs_dir) / _FOLDER
    try:
        check_dir(folder, "step table folder")
        names = os.listdir(folder)
    except (OSError, JournalError):
        return []
    return sorted(folder / name for name in names if name.endswith(_SUFFIX))


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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        if os.fstat(fd).st_ino != os.stat(path, follow_symlinks=False).st_ino:
            return False  # replaced meanwhile: a process made it anew
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}-journal")
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def _order(item: tuple[str, Any]) -> tuple[int, int, str]:
    label, part = item
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
    for label, part in sorted(parts.items(), key=_order):
        row = part.get("row") or {}
        for key, value in row.items():
            if key == "step":
                continue
            if key == "_timestamp":
                if isinstance(value, int | float) and (latest is None or value > latest):
                    latest = value
                continue
            if key not in out:
                out[key] = value
            elif out[key] != value:
                out[f"{key}@{label}"] = value
    out["step"] = step
    if latest is not None:
        out["_timestamp"] = latest
    return out
