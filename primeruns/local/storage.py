"""SQLite storage of the local platform: one file, WAL, one writer.

Everything the server stores lives in ``<data>/platform.sqlite3`` (and the
object store's files beside it), so a server restarted on the same ``--data``
serves everything it had committed. One connection guarded by one lock is the
"one writer": SQLite serialises writers anyway, and a single connection keeps
every multi-row commit (an upload's episodes and traces, say) a single
transaction that either lands whole or not at all. WAL with
``synchronous=NORMAL`` survives a killed server process; a power loss may drop
the last transactions, which is acceptable for a local stand-in. The WAL is
copied back into the file by a thread of its own (``local.checkpoint``), not
by the commit that fills it.

Calls are synchronous; routes run them in a worker thread through
:meth:`Database.read` / :meth:`Database.write` wrapped by ``anyio``, except
a read or write of a row or two (:meth:`Database.read_small`,
:meth:`Database.write_small`), done on the event loop when the connection is
free.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import anyio.to_thread

from ..journal.trust import check_dir, check_file, make_private_dirs
from .checkpoint import BACKSTOP_PAGES, Checkpointer

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS evaluations (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    error_message TEXT,
    request TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    metrics TEXT NOT NULL DEFAULT '{}',
    team_id TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finalized_at REAL,
    -- Its rows in eval_samples, kept by a trigger on them (_keep_sample_count).
    sample_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS eval_samples (
    row INTEGER PRIMARY KEY,
    eval_id TEXT NOT NULL,
    sample_id TEXT,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS eval_samples_eval ON eval_samples (eval_id, row);
-- Each sample's row of the dashboard's table, stored with its body (dashboard/stored_rows.py).
CREATE TABLE IF NOT EXISTS eval_sample_rows (
    row INTEGER PRIMARY KEY,
    eval_id TEXT NOT NULL,
    sample_id TEXT,
    reward REAL,
    error TEXT,
    task TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    category TEXT
);
CREATE TABLE IF NOT EXISTS environments (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT NOT NULL,
    version_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (owner, name)
);
CREATE TABLE IF NOT EXISTS train_runs (
    id TEXT PRIMARY KEY,
    name TEXT,
    team_id TEXT NOT NULL,
    status TEXT NOT NULL,
    error_message TEXT,
    request TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    completed_at REAL,
    -- Its distinct steps in train_metrics, kept by a trigger on them (_keep_step_count).
    step_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS train_metrics (
    row INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    step INTEGER,
    body TEXT NOT NULL,
    received_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS train_metrics_step ON train_metrics (run_id, step);
CREATE TABLE IF NOT EXISTS objects (
    key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    token TEXT NOT NULL,
    expires_at REAL NOT NULL,
    size INTEGER,
    uploaded_at REAL,
    confirmed_at REAL,
    rows INTEGER
);
CREATE TABLE IF NOT EXISTS uploads (
    upload_id TEXT PRIMARY KEY,
    line_format TEXT NOT NULL,
    receipt TEXT NOT NULL,
    context TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    ingested_at REAL NOT NULL,
    replays INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS episodes (
    row INTEGER PRIMARY KEY,
    episode_id TEXT NOT NULL,
    upload_id TEXT NOT NULL,
    run_id TEXT,
    run_type TEXT,
    run_name TEXT,
    environment_id TEXT,
    outcome TEXT,
    has_error INTEGER NOT NULL,
    error_type TEXT,
    error_message TEXT,
    schema_version INTEGER NOT NULL,
    created_at REAL NOT NULL,
    ingested_at REAL NOT NULL,
    raw BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS episodes_id ON episodes (episode_id);
CREATE INDEX IF NOT EXISTS episodes_run ON episodes (run_id);
CREATE TABLE IF NOT EXISTS traces (
    row INTEGER PRIMARY KEY,
    trace_id TEXT NOT NULL,
    upload_id TEXT NOT NULL,
    episode_id TEXT,
    run_id TEXT,
    run_type TEXT,
    run_name TEXT,
    step INTEGER,
    environment_id TEXT,
    model_id TEXT,
    model_provider TEXT,
    task_id TEXT,
    agent_name TEXT,
    reward REAL,
    outcome TEXT,
    has_error INTEGER NOT NULL,
    is_truncated INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    ingested_at REAL NOT NULL,
    context TEXT NOT NULL,
    raw BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_id ON traces (trace_id);
-- A trace's run with its kind and name: the runs the platform saw only through
-- traces are listed from this index alone (inspect.run_list), not from every
-- trace's row (200,000 traces: 0.8 s on every load and poll of the runs list).
DROP INDEX IF EXISTS traces_run;
CREATE INDEX IF NOT EXISTS traces_run_named ON traces (run_id, run_type, run_name);
CREATE INDEX IF NOT EXISTS traces_episode ON traces (episode_id);
"""


#: How to fix a data folder another user could write into (``ensure_private_dir``).
_OWN_FOLDER = "point --data at a folder of your own"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (0700, its missing parents too) if needed: it holds
    user data. Raises UntrustedPathError for a folder another user could
    write into or that is a link (``journal.trust``, as for a runs
    directory): ``--data`` defaults to a folder of the working directory,
    which on a shared scratch disk another user may have made first, and
    then read everything the platform stores, or linked elsewhere."""
    shown = path.absolute()
    check_dir(shown, "data directory", advice=_OWN_FOLDER)
    make_private_dirs(path)
    check_dir(shown, "data directory", advice=_OWN_FOLDER)  # made meanwhile by someone else?
    return path


def _keep_count(
    conn: sqlite3.Connection,
    table: str,
    column: str,
    *,
    trigger: str,
    on: str,
    key: str,
    recount: str,
) -> None:
    """Keep ``table.column`` by the trigger ``trigger``, ``AFTER INSERT ON
    on`` (a table, and a ``WHEN`` clause if any), adding one to the row of
    ``table`` whose id is the new row's ``key``: the dashboard's runs list
    reads the count instead of a pass over the rows on every load and poll.

    The trigger is part of the data folder, so every insert counts, whatever
    writes it: a platform of a version from before the count (which inserts
    rows and never touches the column) writing into a folder a later one
    opened too. A data folder from before gets the column first, counted
    once from the rows it holds (``recount``: ``CREATE TABLE IF NOT EXISTS``
    leaves an existing table as it was); the trigger then counts from there.
    """
    columns = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
    if column not in columns:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
        conn.execute(f"UPDATE {table} SET {column} = ({recount})")
    conn.execute(
        f"CREATE TRIGGER IF NOT EXISTS {trigger} AFTER INSERT ON {on}"
        f" BEGIN UPDATE {table} SET {column} = {column} + 1 WHERE id = NEW.{key}; END"
    )


def _keep_sample_count(conn: sqlite3.Connection) -> None:
    """An evaluation's samples, ``evaluations.sample_count``."""
    _keep_count(
        conn,
        "evaluations",
        "sample_count",
        trigger="eval_samples_counted",
        on="eval_samples",
        key="eval_id",
        recount="SELECT count(*) FROM eval_samples WHERE eval_id = evaluations.id",
    )


def _keep_step_count(conn: sqlite3.Connection) -> None:
    """A training run's distinct metric steps, ``train_runs.step_count``. A
    step sent again replaces its row (an upsert: an update, which the
    trigger does not see), so only a new step counts; a row without a step
    is no step."""
    _keep_count(
        conn,
        "train_runs",
        "step_count",
        trigger="train_metrics_steps_counted",
        on="train_metrics WHEN NEW.step IS NOT NULL",
        key="run_id",
        recount="SELECT count(DISTINCT step) FROM train_metrics WHERE run_id = train_runs.id",
    )


class Database:
    """The server's one SQLite connection; every access holds its lock."""

    def __init__(self, data_dir: Path) -> None:
        ensure_private_dir(data_dir)
        path = data_dir / "platform.sqlite3"
        # SQLite opens its files by name, following links: none may be one
        # (nobody else writes into the folder, but a link made before may be there).
        for name in (path.name, f"{path.name}-wal", f"{path.name}-shm"):
            check_file(data_dir / name)
        # Create the file 0600 before SQLite does (it would honour the umask).
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        self._lock = threading.Lock()
        # isolation_level=None: transactions are opened explicitly in write().
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        # Checkpoints are the checkpointer thread's; the writer's own stay as a
        # backstop, far later than SQLite's 1,000 pages (``local.checkpoint``).
        self._conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
        self._checkpointer = Checkpointer(path, self._lock)
        # A Database dropped unclosed (a test's, say) ends the thread with it,
        # as its connection closes: the thread's connection would otherwise
        # keep the WAL there, and the thread waiting, for the process's life.
        # The thread is waited for (the finalizer runs before the writer's
        # connection goes): closed while the thread's round held the WAL, the
        # writer's could not remove it, and the thread's, closing last, left it.
        weakref.finalize(self, self._checkpointer.stop).atexit = False
        self.write_sync(_keep_sample_count)
        self.write_sync(_keep_step_count)

    def read_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            return fn(self._conn)

    def write_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one transaction: it commits whole or not at all."""
        with self._lock:
            return self._transaction(fn)

    def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(self._conn)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        self._checkpointer.wake()
        return result

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await anyio.to_thread.run_sync(self.read_sync, fn)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await anyio.to_thread.run_sync(self.write_sync, fn)

    async def write_small(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``write`` of a statement or two (one metrics row, a presigned
        object's row): done right here, on the event loop, when no other
        write holds the connection. The hop to a worker thread and back cost
        more than such a write (on a busy machine each hop waits for a thread
        to be scheduled), and a backlog is thousands of them; a connection
        busy with another write (an upload's transaction) is waited for off
        the loop, as ``write`` does."""
        if not self._lock.acquire(blocking=False):
            return await self.write(fn)
        try:
            return self._transaction(fn)
        finally:
            self._lock.release()

    async def write_statement(self, sql: str, params: Sequence[object]) -> int:
        """One statement, a transaction by itself (SQLite commits it and its
        triggers whole or not at all): the rows it changed. On the event
        loop when the connection is free, as ``write_small``, whose explicit
        ``BEGIN IMMEDIATE`` and ``COMMIT`` are two statements more: a
        metrics row's upsert with its run's check folded in is one statement
        here, ~15 of the ~55 us of SQLite CPU a row took."""

        def run(conn: sqlite3.Connection) -> int:
            changed = conn.execute(sql, params).rowcount
            self._checkpointer.wake()
            return changed

        if not self._lock.acquire(blocking=False):
            return await anyio.to_thread.run_sync(self.read_sync, run)  # (under the lock)
        try:
            return run(self._conn)
        finally:
            self._lock.release()

    async def read_small(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``read`` of a row or two by key, on the event loop as ``write_small``."""
        if not self._lock.acquire(blocking=False):
            return await self.read(fn)
        try:
            return fn(self._conn)
        finally:
            self._lock.release()

    def close(self) -> None:
        # The checkpointer's connection first: the last one closed copies
        # what is left of the WAL into the file and deletes it, as before.
        self._checkpointer.stop()
        with self._lock:
            self._conn.close()
