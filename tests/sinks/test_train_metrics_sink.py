"""The training metrics sink alone, through ``httpx.MockTransport``.

The rows are what ``run.log_metrics`` journals (an offline run writes them
here), and the scripted platform keeps one row per step as the platform does
(``primeruns/local/rft.py``): a replayed row replaces its step's row.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scripted_platform import LOST, PASS, Batch, ScriptedPlatform, error

import primeruns as pr
from primeruns.exceptions import APIError, RetryableAPIError, TransportError, UnauthorizedError
from primeruns.journal import Entry, EntryKind, Journal
from primeruns.platform import PlatformClient
from primeruns.sinks.base import Binding
from primeruns.sinks.step_rows import StepRows, merged_row
from primeruns.sinks.train_metrics import TrainMetricsSink, landed_rows

_BOUND = Binding(run_id="rft-1", kind="train")


class MetricsTable:
    """``POST /api/v1/rft/metrics``: one row per (run, step); a row without a
    step is a row of its own."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.by_step: dict[tuple[str, Any], dict[str, Any]] = {}
        self.stepless: list[dict[str, Any]] = []
        self.refused_steps: set[int] = set()
        platform.route("metrics", "POST", "/api/v1/rft/metrics", self.post)

    def post(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        body = json.loads(request.content)
        row = body["metrics"]
        if row.get("step") in self.refused_steps:
            return error(422, f"metrics row of step {row['step']} refused")
        if row.get("step") is None:
            self.stepless.append(row)
        else:
            self.by_step[(body["run_id"], row["step"])] = row
        return httpx.Response(200, json={"run_id": body["run_id"], "step": row.get("step")})

    def steps(self) -> list[int]:
        return sorted(step for _, step in self.by_step)

    def serve_reads(self, platform: ScriptedPlatform) -> None:
        """``GET /api/v1/rft/runs/{id}/metrics?min_step&limit`` as the local platform answers it."""
        platform.route(
            "metrics_read", "GET", "/api/v1/rft/runs/(?P<run_id>[^/]+)/metrics", self.get
        )

    def get(self, request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        query = request.url.params
        lowest, limit = int(query.get("min_step", -(1 << 63))), int(query["limit"])
        rows = [
            row
            for (run_id, step), row in sorted(self.by_step.items(), key=lambda i: i[0][1])
            if run_id == params["run_id"] and step >= lowest
        ]
        return httpx.Response(200, json={"metrics": rows[:limit]})


@pytest.fixture
def table(platform: ScriptedPlatform) -> MetricsTable:
    return MetricsTable(platform)


def _logged(tmp_path: Path, rows: list[tuple[dict[str, Any], int | None]]) -> list[Entry]:
    """The journal entries ``run.log_metrics(values, step=step)`` makes, offline."""
    run = pr.init(kind="train", model="m", team_id="t", mode="offline", runs_dir=tmp_path)
    for values, step in rows:
        run.log_metrics(values, step=step)
    run.finish()
    assert run.journal_path is not None
    journal = Journal.open(run.journal_path, owner=False)
    try:
        return journal.read(
            0, kinds={EntryKind.METRICS}, max_entries=1000, max_bytes=1 << 20
        ).entries
    finally:
        journal.close()


def _steps(tmp_path: Path, n: int) -> list[Entry]:
    return _logged(
        tmp_path, [({"loss": 1.0 / (step + 1), "reward": step}, step) for step in range(n)]
    )


def _step_of(request: httpx.Request) -> int:
    step: int = json.loads(request.content)["metrics"]["step"]
    return step


def test_each_logged_row_is_one_request_with_its_step_and_no_non_finite_value(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    entries = _logged(
        tmp_path,
        [
            ({"loss": 0.5, "nan": float("nan"), "grad": {"norm": float("inf"), "max": 2.0}}, 0),
            ({"loss": 0.25, "step": 7}, 1),  # a step in the values wins
            ({"loss": float("-inf")}, 2),
        ],
    )
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, entries, _BOUND)
    assert batch.records == 3
    batch.send(sink)
    assert platform.calls == ["metrics"] * 3
    assert [json.loads(r.content)["run_id"] for r in platform.sent("metrics")] == ["rft-1"] * 3
    assert table.steps() == [0, 2, 7]
    first = table.by_step[("rft-1", 0)]
    assert {k: v for k, v in first.items() if k != "_timestamp"} == {
        "loss": 0.5,
        "grad": {"max": 2.0},
        "step": 0,
    }
    assert set(table.by_step[("rft-1", 2)]) == {"step", "_timestamp"}
    assert all(isinstance(row["_timestamp"], float) for row in table.by_step.values())


def test_a_row_orjson_cannot_read_fails_alone_and_its_batch_mates_land(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    """``log_metrics({"loss": 10**400})`` journals an integer of 400 digits,
    which orjson reads as an infinity and refuses: the batch's body failed
    to parse when sent, and every row of the batch was lost (3 of 3). The
    batch now ends before such a row, which fails alone (the shipper fails
    the first entry of a batch whose prepare raises)."""
    entries = _logged(tmp_path, [({"loss": 1.0}, 0), ({"loss": 10**400}, 1), ({"loss": 0.5}, 2)])
    sink = TrainMetricsSink(platform.client())
    before = Batch.prepare(sink, entries, _BOUND)
    assert before.records == 1 and before.state["last_seq"] == entries[0].seq
    with pytest.raises(ValueError):
        sink.prepare(entries[1:], _BOUND)  # the shipper counts this one entry as failed
    after = Batch.prepare(sink, entries[2:], _BOUND)
    assert after.records == 1 and after.last_seq is None
    before.send(sink)
    after.send(sink)
    assert table.steps() == [0, 2]


def test_a_row_whose_answer_was_lost_is_replayed_with_the_same_bytes_and_kept_once(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _steps(tmp_path, 4), _BOUND)
    platform.fail("metrics", PASS, PASS, LOST)  # step 2 is stored, its answer lost
    with pytest.raises(TransportError):
        batch.send(sink)
    assert batch.state["done"] == 2
    batch.send(sink)
    sent = platform.sent("metrics")
    assert [_step_of(r) for r in sent] == [0, 1, 2, 2, 3]
    assert sent[2].content == sent[3].content  # the same row, timestamp and all
    assert table.steps() == [0, 1, 2, 3] and table.stepless == []


def test_a_resend_even_by_the_next_process_starts_at_the_first_row_not_yet_stored(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _steps(tmp_path, 5), _BOUND)
    platform.fail("metrics", PASS, PASS, error(503, "busy"))
    with pytest.raises(RetryableAPIError):
        batch.send(sink)
    # The rows stored before the failure, recorded in one write (a window of
    # rows is settled together: a death before it has them sent again, and
    # each, having a step, collapses on the platform).
    assert batch.saved == [{"done": 2}]
    later = TrainMetricsSink(platform.client())  # with what the journal recorded
    Batch(batch.body, dict(batch.state), batch.records, _BOUND, later.progress_type).send(later)
    assert [_step_of(r) for r in platform.sent("metrics")] == [0, 1, 2, 2, 3, 4]
    assert table.steps() == [0, 1, 2, 3, 4]


def test_a_rejected_row_is_counted_alone_and_the_rest_of_the_batch_goes_on(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    table.refused_steps.add(1)
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _steps(tmp_path, 3), _BOUND)
    batch.send(sink)  # returns: the batch is done
    # Counted with the acknowledgement, in the same write (once, whatever dies).
    assert list(batch.failed_at_ack) == [1]
    [(count, exc)] = batch.failed_at_ack.values()
    assert count == 1 and isinstance(exc, APIError) and exc.status_code == 422
    assert table.steps() == [0, 2] and batch.state["done"] == 3
    assert batch.state["refused"] == [1]


def test_a_refused_row_is_counted_once_whatever_dies_before_the_acknowledgement(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    # Counted at once (one journal write) and recorded as done in the next,
    # a row refused again after a death between the two was counted twice.
    table.refused_steps.add(1)
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _steps(tmp_path, 3), _BOUND)
    recorded = dict(batch.state)
    batch.send(sink)
    for state in (dict(batch.state), recorded):  # died before the ack; before the record
        later = TrainMetricsSink(platform.client())
        again = Batch(batch.body, state, batch.records, _BOUND, later.progress_type)
        again.send(later)
        assert list(again.failed_at_ack) == [1]
        assert again.state["done"] == 3 and again.state["refused"] == [1]


def test_a_damaged_record_of_refused_rows_counts_only_rows_it_can_name(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    # ``refused`` is read from a file that may be damaged: each distinct
    # number was counted as one row lost, past the batch's end, below 0, or
    # a row not settled yet (sent now, stored, and counted lost all the
    # same), so a batch of 3 rows could count thousands lost.
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _steps(tmp_path, 3), _BOUND)
    junk = [1, 1, -1, 2, 3, *range(10, 5000)]
    damaged = Batch(
        batch.body, batch.state | {"done": 2, "refused": junk}, 3, _BOUND, sink.progress_type
    )
    damaged.send(sink)
    assert list(damaged.failed_at_ack) == [1]  # the one settled row it names
    assert table.steps() == [2] and damaged.state["done"] == 3
    assert damaged.state["refused"] == [1]


def test_a_refused_key_stops_the_batch_where_it_is(
    tmp_path: Path, platform: ScriptedPlatform, table: MetricsTable
) -> None:
    sink = TrainMetricsSink(platform.client())
    batch = Batch.prepare(sink, _steps(tmp_path, 3), _BOUND)
    platform.fail("metrics", PASS, error(401, "Invalid or missing API key"))
    with pytest.raises(UnauthorizedError):
        batch.send(sink)
    assert batch.state["done"] == 1
    assert table.steps() == [0]


def _rank(folder: Path, rank: int, client: PlatformClient | None = None) -> StepRows:
    """Rank ``rank``'s step table; with ``client``, a table made anew starts
    from the run's rows on that platform (as the uplink's does)."""
    landed = None if client is None else functools.partial(landed_rows, client)
    return StepRows(folder, label=f"rank{rank}", primary=rank == 0, rank=rank, landed=landed)


class OvertakenTable(MetricsTable):
    """A metrics table where something happens (``meanwhile``) while the next
    request is on its way, before it lands."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.meanwhile: Any = None
        super().__init__(platform)

    def post(self, request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        return super().post(request, params)


def test_two_ranks_logging_one_step_keep_every_key_whatever_order_their_rows_land_in(
    tmp_path: Path, platform: ScriptedPlatform
) -> None:
    """Rank 0's row is on its way when rank 1 sends its own for the same step,
    and lands after it: the platform keeps one row per step (the later
    replaces the earlier), so it would hold rank 0's keys only. Rank 0 sees
    the step changed once it is answered, and sends the merged row again."""
    table = OvertakenTable(platform)
    first = _logged(tmp_path / "r0", [({"loss_r0": 0.5, "lr": 0.1}, 3)])
    second = _logged(tmp_path / "r1", [({"loss_r1": 0.7, "lr": 0.1}, 3)])
    rank0 = TrainMetricsSink(platform.client(), _rank(tmp_path, 0))
    rank1 = TrainMetricsSink(platform.client(), _rank(tmp_path, 1))
    overtaking = Batch.prepare(rank1, second, _BOUND)
    table.meanwhile = lambda: overtaking.send(rank1)
    Batch.prepare(rank0, first, _BOUND).send(rank0)
    row = table.by_step[("rft-1", 3)]
    assert {k: v for k, v in row.items() if k != "_timestamp"} == {
        "loss_r0": 0.5,
        "loss_r1": 0.7,
        "lr": 0.1,
        "step": 3,
    }
    keys = [
        set(json.loads(r.content)["metrics"]) - {"_timestamp", "step"}
        for r in platform.sent("metrics")
    ]
    # rank 0's row (landing last, stale), rank 1's merged row, rank 0's merged row again
    assert keys == [{"loss_r0", "lr"}, {"loss_r0", "loss_r1", "lr"}, {"loss_r0", "loss_r1", "lr"}]


def test_a_key_two_ranks_log_with_different_values_keeps_both() -> None:
    parts = {
        "rank2": {"primary": False, "rank": 2, "row": {"loss": 3.0, "_timestamp": 5.0}},
        "rank0": {"primary": True, "rank": 0, "row": {"loss": 1.0, "lr": 0.1, "_timestamp": 4.0}},
        "rank1": {"primary": False, "rank": 1, "row": {"loss": 1.0, "lr": 0.2, "_timestamp": 6.0}},
    }
    assert merged_row(9, parts) == {
        "loss": 1.0,  # the primary's; rank 1 logged the same value
        "lr": 0.1,
        "lr@rank1": 0.2,
        "loss@rank2": 3.0,
        "step": 9,
        "_timestamp": 6.0,
    }


def test_one_process_logging_a_step_twice_keeps_the_union_with_its_later_values(
    tmp_path: Path,
) -> None:
    rows = _rank(tmp_path, 0)
    rows.merge("run", 1, {"loss": 1.0, "step": 1})
    merged, version = rows.merge("run", 1, {"loss": 0.5, "reward": 2.0, "step": 1}) or ({}, 0)
    assert merged == {"loss": 0.5, "reward": 2.0, "step": 1}
    assert version == 2 and rows.version("run", 1) == 2
    # nothing new: the same version
    assert rows.merge("run", 1, {"reward": 2.0, "step": 1}) == (merged, 2)


def _keys(row: dict[str, Any]) -> set[str]:
    return set(row) - {"_timestamp", "step"}


def test_a_step_table_deleted_under_the_ranks_is_made_anew_from_the_runs_rows(
    tmp_path: Path, platform: ScriptedPlatform
) -> None:
    """``rm -rf`` of the runs directory takes the host's step table while
    the ranks log on. Rank 1's next row of a step rank 0 sent before keeps
    rank 0's keys: the table made anew starts from the rows on the platform,
    not empty (the row landing last had rank 1's keys only)."""
    table = MetricsTable(platform)
    table.serve_reads(platform)
    rank0 = TrainMetricsSink(platform.client(), _rank(tmp_path, 0, platform.client()))
    rank1 = TrainMetricsSink(platform.client(), _rank(tmp_path, 1, platform.client()))
    Batch.prepare(rank0, _logged(tmp_path / "r0", [({"loss_r0": 0.5}, 3)]), _BOUND).send(rank0)
    shutil.rmtree(tmp_path / ".steps")
    Batch.prepare(rank1, _logged(tmp_path / "r1", [({"loss_r1": 0.7}, 3)]), _BOUND).send(rank1)
    assert _keys(table.by_step[("rft-1", 3)]) == {"loss_r0", "loss_r1"}
    # Rank 0 goes on in the new table (its old one lost its name): still both.
    Batch.prepare(rank0, _logged(tmp_path / "r2", [({"lr": 0.1}, 3)]), _BOUND).send(rank0)
    assert _keys(table.by_step[("rft-1", 3)]) == {"loss_r0", "loss_r1", "lr"}


def test_a_row_sent_through_a_table_deleted_while_it_was_on_its_way_goes_again(
    tmp_path: Path, platform: ScriptedPlatform
) -> None:
    """Rank 0's row is on its way when the step table is deleted and rank 1
    sends its row of the step through the new table, landing first. Rank 0,
    answered, finds the table it merged in gone, and sends its row again
    through the new one: the row landing last holds both ranks' keys."""
    table = OvertakenTable(platform)
    table.serve_reads(platform)
    rank0 = TrainMetricsSink(platform.client(), _rank(tmp_path, 0, platform.client()))
    rank1 = TrainMetricsSink(platform.client(), _rank(tmp_path, 1, platform.client()))
    overtaking = Batch.prepare(rank1, _logged(tmp_path / "r1", [({"loss_r1": 0.7}, 5)]), _BOUND)

    def wiped_then_overtaken() -> None:
        shutil.rmtree(tmp_path / ".steps")
        overtaking.send(rank1)

    table.meanwhile = wiped_then_overtaken
    Batch.prepare(rank0, _logged(tmp_path / "r0", [({"loss_r0": 0.5}, 5)]), _BOUND).send(rank0)
    assert _keys(table.by_step[("rft-1", 5)]) == {"loss_r0", "loss_r1"}


def test_a_step_table_lost_where_the_platform_has_no_read_is_said_once(
    tmp_path: Path, platform: ScriptedPlatform, caplog: pytest.LogCaptureFixture
) -> None:
    """What landed before cannot be put back without a read of the run's
    rows (a 404 for it): the process that saw its table go says so, once,
    and goes on merging in the new table."""
    MetricsTable(platform)  # no read route
    steps = _rank(tmp_path, 0, platform.client())
    assert steps.merge("k rft-1", 1, {"a": 1}) is not None
    for step in (2, 3):
        shutil.rmtree(tmp_path / ".steps")
        with caplog.at_level(logging.WARNING, "primeruns"):
            assert steps.merge("k rft-1", step, {"a": 1}) is not None
    said = [r for r in caplog.records if "gave no read" in r.getMessage()]
    assert len(said) == 1
    steps.close()
    # A new uplink of a journal re-created under its run (its rows shipped
    # before) makes the table the wipe took: said there too.
    caplog.clear()
    shutil.rmtree(tmp_path / ".steps")
    again = StepRows(
        tmp_path,
        label="rank0",
        primary=True,
        rank=0,
        landed=functools.partial(landed_rows, platform.client()),
        shipped_before=True,
    )
    with caplog.at_level(logging.WARNING, "primeruns"):
        assert again.merge("k rft-1", 4, {"a": 1}) is not None
    assert [r for r in caplog.records if "gave no read" in r.getMessage()]
    again.close()


@pytest.mark.parametrize("platform_reads", ["pages", "fewer-than-asked", "no-min-step", "422"])
def test_the_runs_rows_a_new_table_starts_from_are_read_to_the_end_or_not_at_all(
    platform: ScriptedPlatform, platform_reads: str
) -> None:
    """A platform may give fewer rows than asked, or ignore ``min_step``:
    every row is read, and the read ends. One that refuses the read gives
    nothing to start from (None), never a refusal of the row being sent."""
    table = MetricsTable(platform)
    for step in range(2500):
        table.by_step[("rft-1", step)] = {"step": step, "loss": 1.0}

    def read(request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        if platform_reads == "422":
            return error(422, "min_step out of range")
        if platform_reads == "no-min-step":
            request = httpx.Request("GET", request.url.copy_remove_param("min_step"))
        if platform_reads == "fewer-than-asked":
            request = httpx.Request("GET", request.url.copy_set_param("limit", "300"))
        query = request.url.params
        lowest = int(query.get("min_step", -1))
        rows = [r for (_, s), r in sorted(table.by_step.items()) if s >= lowest]
        return httpx.Response(200, json={"metrics": rows[: int(query["limit"])]})

    platform.route("metrics_read", "GET", "/api/v1/rft/runs/rft-1/metrics", read)
    pages = landed_rows(platform.client(), "http://platform.test/api/v1 rft-1")
    rows = None if pages is None else [row for page in pages for row in page]
    if platform_reads == "422":
        assert rows is None
    elif platform_reads == "no-min-step":
        assert rows is not None and [r["step"] for r in rows] == list(range(1000))
    else:
        assert rows is not None and [r["step"] for r in rows] == list(range(2500))


def test_the_landed_rows_of_many_metrics_each_are_read_past_an_answers_bound(
    platform: ScriptedPlatform, table: MetricsTable
) -> None:
    """1,200 rows of 700 metrics (~20 KB each): a page of 1,000 of them is
    past the client's bound for an answer (plain.MAX_ANSWER_BYTES), and the
    read gave nothing to start from, as for a platform without it (the
    table that merges a host's processes then lacked every landed row).
    They are read in smaller pages, every row once."""
    metrics = {f"env/reward/bucket_{i:04d}": 0.5 for i in range(700)}
    for step in range(1200):
        table.by_step[("rft-1", step)] = {"step": step, **metrics}
    table.serve_reads(platform)
    pages = landed_rows(platform.client(), "http://platform.test/api/v1 rft-1")
    assert pages is not None
    assert [row["step"] for page in pages for row in page] == list(range(1200))


def test_the_landed_rows_of_many_metrics_keep_the_page_size_that_fit(
    platform: ScriptedPlatform, table: MetricsTable
) -> None:
    """Each page of those wide rows started again at 1,000 rows: an answer
    past the bound (up to 16 MiB read, then refused) for every page of 100
    rows read. The size that fit is kept for the pages after it."""
    metrics = {f"env/reward/bucket_{i:04d}": 0.5 for i in range(700)}
    for step in range(1200):
        table.by_step[("rft-1", step)] = {"step": step, **metrics}
    limits: list[int] = []
    serve = table.get

    def get(request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        limits.append(int(request.url.params["limit"]))
        return serve(request, params)

    platform.route("metrics_read", "GET", "/api/v1/rft/runs/(?P<run_id>[^/]+)/metrics", get)
    pages = landed_rows(platform.client(), "http://platform.test/api/v1 rft-1")
    assert pages is not None
    assert [row["step"] for page in pages for row in page] == list(range(1200))
    # One answer too large, then 12 pages of 100 and the empty one past them.
    assert limits == [1000] + [100] * 13


def test_a_step_table_deleted_in_the_middle_of_a_merge_is_not_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wipe lands while a merge's transaction is open: SQLite fails it
    ("disk I/O error", four ranks wiped mid-run). Given up, the table would
    send every later row as logged, each replacing the step's row on the
    platform with one rank's keys. The merge is done again in the new table."""
    from primeruns.sinks import step_rows

    table = MetricsTable(ScriptedPlatform())
    table.by_step[("rft-1", 1)] = {"step": 1, "loss_r0": 0.5}
    steps = StepRows(
        tmp_path,
        label="rank1",
        primary=False,
        rank=1,
        landed=lambda _: [list(table.by_step.values())],
    )
    assert steps.merge("k rft-1", 0, {"loss_r1": 0.1}) is not None
    real = step_rows._stored
    wiped: list[bool] = []

    def wiped_within(conn: Any, wanted: Any) -> Any:
        if not wiped:
            wiped.append(True)
            shutil.rmtree(tmp_path / ".steps")
        return real(conn, wanted)

    monkeypatch.setattr(step_rows, "_stored", wiped_within)
    merged = steps.merge("k rft-1", 1, {"loss_r1": 0.7})
    assert wiped and merged is not None
    assert _keys(merged[0]) == {"loss_r0", "loss_r1"}
    steps.close()


@pytest.mark.parametrize("wiped", ["before the first page", "between pages"])
def test_a_step_table_wiped_while_it_is_made_is_made_again_not_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, wiped: str
) -> None:
    """The runs directory is wiped while a process reads the run's rows to
    make its table (the read is requests to the platform: a wide window),
    once as a new process opens its first table and again as one whose
    table was wiped makes the next. Given up, every later row went as
    logged, each replacing its step's row on the platform with one rank's
    keys. The table is made again, and a step sent through the old table
    still goes again through the new one."""
    landed = [{"step": 1, "loss_r0": 0.5}, {"step": 2, "loss_r0": 0.6}]
    wipe = True

    def wiped_once() -> None:
        nonlocal wipe
        if wipe:
            wipe = False
            shutil.rmtree(tmp_path / ".steps")

    def read(_: str) -> Iterator[list[dict[str, Any]]]:
        if wiped == "before the first page":
            wiped_once()
        return pages()

    def pages() -> Iterator[list[dict[str, Any]]]:
        yield landed[:1]
        wiped_once()
        yield landed[1:]

    steps = StepRows(tmp_path, label="rank1", primary=False, rank=1, landed=read)
    with caplog.at_level(logging.WARNING, "primeruns"):
        merged = steps.merge("k rft-1", 1, {"loss_r1": 0.7})
        assert merged is not None and _keys(merged[0]) == {"loss_r0", "loss_r1"}
        shutil.rmtree(tmp_path / ".steps")
        wipe = True
        assert steps.versions("k rft-1", [1]) == {1: -1}  # the step goes again
        merged = steps.merge("k rft-1", 2, {"loss_r1": 0.8})
        assert merged is not None and _keys(merged[0]) == {"loss_r0", "loss_r1"}
    assert "cannot be used" not in caplog.text
    steps.close()


def test_a_step_table_lost_and_made_anew_by_another_without_a_read_is_said(
    tmp_path: Path, platform: ScriptedPlatform, caplog: pytest.LogCaptureFixture
) -> None:
    """The wipe takes the table rank 0 merged in; rank 2, started after it
    (nothing of its own to lose), makes the new one where the platform
    gives no read. Rank 0 goes on in that table, which holds nothing of
    what landed: its next row of a step rank 1 sent before loses rank 1's
    keys. Rank 0 says so, as it does when it makes that table itself."""
    MetricsTable(platform)  # no read route
    rank0 = _rank(tmp_path, 0, platform.client())
    assert rank0.merge("k rft-1", 1, {"a": 1}) is not None
    shutil.rmtree(tmp_path / ".steps")
    rank2 = _rank(tmp_path, 2, platform.client())
    with caplog.at_level(logging.WARNING, "primeruns"):
        assert rank2.merge("k rft-1", 2, {"c": 1}) is not None
        assert "gave no read" not in caplog.text  # it had nothing to lose
        assert rank0.merge("k rft-1", 3, {"a": 1}) is not None
    said = [r for r in caplog.records if "gave no read" in r.getMessage()]
    assert len(said) == 1
    rank0.close()
    rank2.close()


def test_a_read_of_the_runs_rows_refused_after_its_first_page_is_said(
    platform: ScriptedPlatform, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused page after the first ends the read there (the rows go on
    without it): a table made from it lacks the later steps' rows, and a
    step among them logged again by one process loses the others' keys.
    That was silent; it is said, naming the step the read stopped at."""
    table = MetricsTable(platform)
    for step in range(1500):
        table.by_step[("rft-1", step)] = {"step": step, "loss": 1.0}

    def read(request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        if "min_step" in request.url.params:
            return error(422, "min_step out of range")
        return table.get(request, params)

    platform.route("metrics_read", "GET", "/api/v1/rft/runs/(?P<run_id>[^/]+)/metrics", read)
    with caplog.at_level(logging.WARNING, "primeruns"):
        pages = landed_rows(platform.client(), "http://platform.test/api/v1 rft-1")
        assert pages is not None and [len(page) for page in pages] == [1000]
    said = [r.getMessage() for r in caplog.records if "from step 1000" in r.getMessage()]
    assert len(said) == 1, caplog.text


@pytest.mark.parametrize("again", [3.5, 1.0])
def test_a_rank_logging_a_step_again_after_a_wipe_keeps_the_primarys_value_under_the_key(
    again: float,
) -> None:
    """Before the wipe the primary logged ``loss`` 1.0 and rank 3 logged
    3.0 for the step: the platform holds ``loss`` 1.0 and ``loss@rank3``
    3.0. After it, rank 3 alone logs the step again. Its value went under
    ``loss``, the primary's was dropped, and ``loss@rank3`` kept the stale
    3.0: the row said the primary logged rank 3's value. The platform's
    ``loss`` is the value of a process that outranks rank 3, and its
    ``loss@rank3`` is what rank 3's own part now says."""
    parts = {
        "(landed)": {"row": {"loss": 1.0, "loss@rank3": 3.0, "step": 4}},
        "rank3": {"primary": False, "rank": 3, "row": {"loss": again, "step": 4}},
    }
    expected = {"loss": 1.0, "step": 4} | ({"loss@rank3": again} if again != 1.0 else {})
    assert merged_row(4, parts) == expected
