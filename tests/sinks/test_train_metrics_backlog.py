"""The training metrics sink draining a backlog: several requests in flight,
still every row stored once (``sinks.fanout``, ``TrainMetricsSink._send_window``).

A long offline run's sync, or an uplink catching up after an outage, hands
the sink batches of hundreds of rows, one request each. They go several at
a time; what a failure in the middle of them leaves must still be a batch
that a resend completes with every row once: the rows before the failure
recorded as done, a refused row counted once however often the batch is
sent, and a step another process changed while its row was on the way sent
again merged.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from scripted_platform import Batch, ScriptedPlatform, error

import primeruns as pr
from primeruns.exceptions import APIError, TransportError
from primeruns.journal import Entry, EntryKind, Journal
from primeruns.sinks.base import Binding
from primeruns.sinks.step_rows import StepRows
from primeruns.sinks.train_metrics import TrainMetricsSink

_BOUND = Binding(run_id="rft-1", kind="train")
_HANG_GUARD_S = 30.0  # not a timing: only how long a broken test may hang


class StepTable:
    """``POST /api/v1/rft/metrics``, one row per step, thread-safe, with faults
    aimed at steps (requests in flight land in any order, so a fault aimed at
    "the third request" would hit any row): ``fail[step]`` answers that
    step's next request with an error response, or ``"lost"`` (stored, then
    the connection drops before the answer)."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.posts: dict[int, int] = {}
        self.fail: dict[int, httpx.Response | str] = {}
        self.refused: set[int] = set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.meanwhile: dict[int, Any] = {}  # step: done before that step's row lands
        self.lock = threading.Lock()
        platform.route("metrics", "POST", "/api/v1/rft/metrics", self.post)

    def post(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        row = json.loads(request.content)["metrics"]
        step = row["step"]
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.posts[step] = self.posts.get(step, 0) + 1
            fault = self.fail.pop(step, None)
            meanwhile = self.meanwhile.pop(step, None)
        try:
            if meanwhile is not None:
                meanwhile()
            if isinstance(fault, httpx.Response):
                return fault
            if step in self.refused:
                return error(422, f"metrics row of step {step} refused")
            with self.lock:
                self.rows[step] = row
            if fault == "lost":
                raise httpx.RemoteProtocolError("peer closed the connection", request=request)
            return httpx.Response(200, json={"run_id": "rft-1", "step": step})
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture
def table(platform: ScriptedPlatform) -> StepTable:
    return StepTable(platform)


def _logged(tmp_path: Path, steps: range) -> list[Entry]:
    """The journal entries of ``run.log_metrics`` for each step, offline."""
    run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=tmp_path)
    for step in steps:
        run.log_metrics({"loss": 1.0 / (step + 1), "reward": float(step)}, step=step)
    run.finish()
    assert run.journal_path is not None
    journal = Journal.open(run.journal_path, owner=False)
    try:
        return journal.read(
            0, kinds={EntryKind.METRICS}, max_entries=1000, max_bytes=1 << 20
        ).entries
    finally:
        journal.close()


def _values(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "_timestamp"}


def _every_row_once(table: StepTable, steps: range) -> None:
    assert sorted(table.rows) == list(steps)
    for step in steps:
        assert _values(table.rows[step]) == {
            "loss": 1.0 / (step + 1),
            "reward": float(step),
            "step": step,
        }


def test_a_backlog_has_several_rows_in_flight_at_once(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable
) -> None:
    """The first two rows' requests meet at a barrier: one request at a
    time, the first would wait there alone and the test would fail."""
    barrier = threading.Barrier(2, timeout=_HANG_GUARD_S)
    table.meanwhile = {0: barrier.wait, 1: barrier.wait}
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _logged(tmp_path, range(100)), _BOUND)
    batch.send(sink)
    assert table.most_in_flight >= 2
    _every_row_once(table, range(100))
    assert set(table.posts.values()) == {1}  # nothing sent twice
    assert batch.state["done"] == 100


def test_a_live_runs_few_rows_are_merged_and_recorded_done_together(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable
) -> None:
    """A live training run's batch holds the few steps logged during the
    last request. Row by row, each paid a step-table transaction, a version
    read and a write of the batch's progress of its own: a third of the
    sink's CPU in a loop logging a row every 20 ms."""
    merges: list[int] = []

    class Counted(StepRows):
        def merge(self, run: str, step: int, row: Any) -> Any:
            merges.append(1)
            return super().merge(run, step, row)

        def merge_many(self, run: str, rows: Any) -> Any:
            merges.append(len(rows))
            return super().merge_many(run, rows)

    steps = Counted(tmp_path / "steps", label="a", primary=True, rank=None)
    sink = TrainMetricsSink(platform.client(), steps)
    try:
        batch = Batch.prepare(sink, _logged(tmp_path, range(5)), _BOUND)
        batch.send(sink)
    finally:
        sink.close()
    _every_row_once(table, range(5))
    assert set(table.posts.values()) == {1}
    assert merges == [5]  # one transaction for the five rows
    assert batch.saved == [{"done": 5}]  # one write, after all of them landed


def test_a_500_in_the_middle_of_a_backlog_stops_there_and_the_resend_lands_every_row_once(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable
) -> None:
    table.fail[40] = error(500, "internal error")
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _logged(tmp_path, range(100)), _BOUND)
    with pytest.raises(APIError) as raised:
        batch.send(sink)
    assert raised.value.status_code == 500
    # Every row before the failed one is recorded as done (rows after it may
    # have landed too: they are sent again, and collapse per step).
    assert batch.state["done"] == 40
    assert 40 not in table.rows
    batch.send(sink)
    _every_row_once(table, range(100))
    assert all(table.posts[step] == 1 for step in range(40))
    assert batch.state["done"] == 100


def test_a_lost_answer_in_the_middle_of_a_backlog_is_sent_again_and_kept_once(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable
) -> None:
    table.fail[70] = "lost"
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _logged(tmp_path, range(100)), _BOUND)
    with pytest.raises(TransportError):
        batch.send(sink)
    assert batch.state["done"] == 70
    batch.send(sink)
    _every_row_once(table, range(100))
    assert table.posts[70] == 2  # stored, answer lost, sent again: one row on the platform
    assert all(table.posts[step] == 1 for step in range(70))


def test_a_refused_row_of_a_backlog_counts_once_however_often_the_batch_is_sent(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable
) -> None:
    """Row 50 is refused for its content in the attempt that fails at row 40
    (both in flight at once) and again in the resend: one record lost."""
    table.refused.add(50)
    table.fail[40] = error(503, "busy")
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _logged(tmp_path, range(100)), _BOUND)
    with pytest.raises(APIError):
        batch.send(sink)
    assert batch.failed_at_ack == {} and batch.state["done"] == 40
    batch.send(sink)
    [(count, exc)] = batch.failed_at_ack.values()
    assert count == 1 and isinstance(exc, APIError) and exc.status_code == 422
    assert sorted(table.rows) == [s for s in range(100) if s != 50]
    assert batch.state["done"] == 100


def test_a_step_another_rank_changes_while_its_row_is_in_flight_is_sent_again_merged(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable
) -> None:
    """Rank 1 logs step 30 and sends it while rank 0's row of step 30 is on
    its way and lands after it: the platform keeps the later row, rank 0's
    alone, unless rank 0 sees the step changed and sends it again merged."""
    rank0 = TrainMetricsSink(
        platform.client(), StepRows(tmp_path, label="rank0", primary=True, rank=0)
    )
    rank1 = TrainMetricsSink(
        platform.client(), StepRows(tmp_path, label="rank1", primary=False, rank=1)
    )
    theirs = Batch.prepare(rank1, _extra(tmp_path / "r1", 30), _BOUND)
    table.meanwhile = {30: lambda: theirs.send(rank1)}
    Batch.prepare(rank0, _logged(tmp_path / "r0", range(100)), _BOUND).send(rank0)
    assert _values(table.rows[30]) == {
        "loss": 1.0 / 31,
        "reward": 30.0,
        "extra": 1.0,
        "step": 30,
    }
    assert sorted(table.rows) == list(range(100))


def _extra(tmp_path: Path, step: int) -> list[Entry]:
    run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=tmp_path)
    run.log_metrics({"extra": 1.0}, step=step)
    run.finish()
    assert run.journal_path is not None
    journal = Journal.open(run.journal_path, owner=False)
    try:
        return journal.read(0, kinds={EntryKind.METRICS}, max_entries=10, max_bytes=1 << 20).entries
    finally:
        journal.close()


def test_the_step_table_holds_no_more_memory_for_a_longer_backlog(tmp_path: Path) -> None:
    # SQLite's page cache kept every page a backlog's merges touched, 2 MB
    # of a 20,000-step sync's shipping process, for steps never read again.
    import _sqlite3
    import ctypes

    sqlite = ctypes.CDLL(_sqlite3.__file__)  # the library the module uses
    sqlite.sqlite3_memory_used.restype = ctypes.c_int64
    steps = StepRows(tmp_path, label="a", primary=True, rank=None)
    row = {f"metric_{k}": 0.5 for k in range(10)}
    used = []
    for start in range(0, 20_000, 100):
        assert steps.merge_many("run", [(s, row) for s in range(start, start + 100)])
        if start in (1_900, 19_900):
            used.append(sqlite.sqlite3_memory_used())
    steps.close()
    assert used[1] - used[0] < 256 << 10


@pytest.mark.parametrize("rows", [3, 100], ids=["live", "backlog"])
def test_a_row_whose_step_the_platform_cannot_keep_is_refused_and_the_rest_ship(
    tmp_path: Path, platform: ScriptedPlatform, table: StepTable, rows: int
) -> None:
    """A row journaled with a step beyond 64 bits (before ``log_metrics``
    refused them) raised OverflowError in the step table at each attempt:
    the batch never got past it, every row after it held back. It is
    refused for its content, counted once with its reason; the rest land."""
    entries = _logged(tmp_path / "run", range(rows))
    bad = rows // 2
    entries[bad] = dataclasses.replace(
        entries[bad], payload=b'{"loss":1.0,"step":9223372036854775808,"_timestamp":1.0}'
    )
    sink = TrainMetricsSink(
        platform.client(), StepRows(tmp_path, label="a", primary=True, rank=None)
    )
    batch = Batch.prepare(sink, entries, _BOUND)
    batch.send(sink)
    [(count, exc)] = batch.failed_at_ack.values()
    assert count == 1 and isinstance(exc, ValueError) and "2**63 - 1" in str(exc)
    assert sorted(table.rows) == [s for s in range(rows) if s != bad]
    assert batch.state["done"] == rows
