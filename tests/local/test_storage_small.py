"""The local platform's small reads and writes (a metrics row, a presigned
object's row) run on the event loop when the connection is free, and wait
off it when another write holds it: the server keeps answering meanwhile,
and what they read is what that write committed."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from primeruns.local.storage import Database

_HANG_GUARD_S = 30.0  # not a timing: only how long a broken test may hang

_RUN = (
    "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
    " VALUES ('rft_1', 'r', 't', 'RUNNING', '{}', 0, 0)"
)


def _status(conn: sqlite3.Connection) -> str | None:
    row = conn.execute("SELECT status FROM train_runs WHERE id = 'rft_1'").fetchone()
    return None if row is None else str(row["status"])


def test_a_small_read_waits_off_the_loop_for_a_write_holding_the_connection(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path)
    holding, release = threading.Event(), threading.Event()

    def long_write(conn: sqlite3.Connection) -> None:  # an upload's transaction, say
        conn.execute(_RUN)
        holding.set()
        assert release.wait(_HANG_GUARD_S)

    writer = threading.Thread(target=db.write_sync, args=(long_write,))
    writer.start()
    assert holding.wait(_HANG_GUARD_S)

    async def scenario() -> tuple[str | None, bool]:
        read = asyncio.ensure_future(db.read_small(_status))
        # The loop goes on while the read waits: it answers other requests.
        for _ in range(10):
            await asyncio.sleep(0)
        answered_meanwhile = not read.done()
        release.set()
        return await asyncio.wait_for(read, _HANG_GUARD_S), answered_meanwhile

    try:
        status, answered_meanwhile = asyncio.run(scenario())
    finally:
        release.set()
        writer.join(_HANG_GUARD_S)
    assert answered_meanwhile
    assert status == "RUNNING"  # what the write committed
    db.close()


def test_small_reads_and_writes_on_a_free_connection_commit_and_read_back(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path)

    async def scenario() -> str | None:
        await db.write_small(lambda conn: conn.execute(_RUN))
        return await db.read_small(_status)

    assert asyncio.run(scenario()) == "RUNNING"
    db.close()
    again = Database(tmp_path)
    try:
        assert again.read_sync(_status) == "RUNNING"  # committed, on disk
    finally:
        again.close()
