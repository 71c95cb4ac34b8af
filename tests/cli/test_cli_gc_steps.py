"""``primeruns gc`` deletes the step tables (``<runs dir>/.steps/``, where a
run's processes merge their metrics rows) of the runs it collects, and never
one a live process uses (issue #29)."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import cli
from sdk_helpers import API_KEY, point_at

import primeruns as pr
from primeruns.sinks.step_rows import StepRows


def _training(runs: Path, url: str, steps: int) -> Any:
    run = pr.init(
        kind="train", model="m", team_id="team", api_key=API_KEY, base_url=url, runs_dir=runs
    )
    for step in range(steps):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    return run


def tables(runs: Path) -> list[Path]:
    return sorted((runs / ".steps").glob("*.sqlite3"))


def _gc(capsys: pytest.CaptureFixture[str], runs: Path, *more: str) -> dict[str, Any]:
    code, out, _ = cli(capsys, "gc", "--runs-dir", str(runs), "--older-than", "0", "--json", *more)
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_gc_deletes_the_step_tables_of_the_runs_it_collects_never_a_live_ones(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    done = _training(runs, local_platform.url, 3)
    done.finish(timeout=60)
    live = _training(runs, local_platform.url, 2)
    live.flush(timeout=60)  # its rows merged and sent: its uplink has its table open
    try:
        both = tables(runs)
        assert len(both) == 2  # one table per run

        dry = _gc(capsys, runs, "--dry-run")
        assert [t["run_id"] for t in dry.get("step_tables", [])] == [done.id]
        assert tables(runs) == both

        report = _gc(capsys, runs)
        assert [e["local_id"] for e in report["deleted"]] == [done.journal_path.name]
        assert [t["run_id"] for t in report.get("step_tables", [])] == [done.id]
        (kept,) = tables(runs)  # the live run's
        assert live.log_metrics({"loss": 0.1}, step=9) is None and live.flush(timeout=60)
        assert tables(runs) == [kept]  # the live run goes on merging in it
    finally:
        live.finish(timeout=60)
    report = _gc(capsys, runs)  # now its run's journal is collected, and the table with it
    assert [t["run_id"] for t in report.get("step_tables", [])] == [live.id]
    assert tables(runs) == []


def test_gc_leaves_a_table_a_process_has_open_though_its_runs_journals_are_gone(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    run = _training(runs, local_platform.url, 2)
    run.finish(timeout=60)
    (table,) = tables(runs)
    key = f"{local_platform.url}/api/v1 {run.id}"  # the platform's API root and the run
    # Another process of the run, still merging its rows (a rank that logs on).
    user = StepRows(runs, label="rank1", primary=False, rank=1)
    assert user.merge(key, 5, {"loss": 0.5}) is not None
    assert tables(runs) == [table]  # the run's own table
    try:
        report = _gc(capsys, runs, "-v")
        assert [e["local_id"] for e in report["deleted"]] == [run.journal_path.name]
        assert report.get("step_tables") == [] and table.exists()
        assert user.merge(key, 6, {"loss": 0.25}) is not None  # still in use, intact
    finally:
        user.close()
    report = _gc(capsys, runs)  # no journal of its run left, and nobody uses it
    assert [t["run_id"] for t in report.get("step_tables", [])] == [run.id]
    assert tables(runs) == []


def test_gc_deletes_the_table_a_killed_process_was_making_never_one_being_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table made anew is filled under a name of its own (``*.new``) with
    the run's rows on the platform (a long run's: many pages), then linked
    into place. A process killed meanwhile left that file for good, as big
    as the run's history, one more for each kill. gc deletes it, but never
    the one a live process is still filling."""
    runs = point_at(monkeypatch, tmp_path, None)
    (runs / ".steps").mkdir(parents=True, mode=0o700)
    left = runs / ".steps" / f"{'0' * 32}.sqlite3.{'1' * 16}.new"  # a killed process's
    sqlite3.connect(left).close()
    seen: list[dict[str, Any]] = []

    def pages() -> Iterator[list[dict[str, Any]]]:
        yield [{"step": 1, "loss": 0.5}]
        seen.append(_gc(capsys, runs))  # while this process fills its own
        yield [{"step": 2, "loss": 0.25}]

    making = StepRows(runs, label="rank1", primary=False, rank=1, landed=lambda _: pages())
    merged = making.merge("k rft-1", 2, {"b": 1.0})
    making.close()
    assert merged is not None and merged[0]["loss"] == 0.25  # its table made whole
    (report,) = seen
    assert report["step_table_drafts"] == [str(left)]
    assert sorted((runs / ".steps").glob("*.new")) == []
    assert len(tables(runs)) == 1


def test_a_child_forked_while_a_table_is_made_does_not_keep_it_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maker of a table holds its draft's lock while it fills it (gc
    leaves it), and the draft becomes the table. A child forked meanwhile
    (a data loader's worker) shares that lock: closed, not let go, it
    stayed as long as the child lived, and every other process opening the
    table waited for its shared lock, its metrics rows held back."""
    runs = point_at(monkeypatch, tmp_path, None)
    ours, theirs = os.pipe()
    children: list[int] = []

    def pages() -> Iterator[list[dict[str, Any]]]:
        yield [{"step": 1, "loss": 0.5}]
        pid = os.fork()
        if pid == 0:  # the child lives on until the test is done
            os.read(ours, 1)
            os._exit(0)
        children.append(pid)

    real_flock = fcntl.flock

    def never_waiting(fd: int, operation: int) -> None:
        # A shared lock that would wait fails instead: the wait was for as
        # long as the child lived (the maker's own, opening its new table).
        real_flock(fd, operation | fcntl.LOCK_NB if operation == fcntl.LOCK_SH else operation)

    monkeypatch.setattr(fcntl, "flock", never_waiting)
    making = StepRows(runs, label="rank0", primary=True, rank=0, landed=lambda _: pages())
    try:
        assert making.merge("k rft-1", 2, {"a": 1.0}) is not None
    finally:
        making.close()
        os.write(theirs, b"x")
        for pid in children:
            os.waitpid(pid, 0)
