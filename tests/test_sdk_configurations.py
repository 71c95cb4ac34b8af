"""The configurations users run, beyond one thread on a healthy account: many
threads logging into one run, Prime Traces not enabled for the account (it is
allowlisted) or opted out, and a platform answering 500 (issue "Nothing lost,
nothing duplicated, in the configurations users actually run")."""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import pickle
import re
import socket
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import module_platform
import pytest
import second_uid
import workloads
from sdk_helpers import API_KEY, platform_episode_ids, point_at

import primeruns as pr
from primeruns import refuge
from primeruns.exceptions import ConfigurationError, EnvironmentResolutionError, JournalError
from primeruns.journal import EntryKind, Journal
from primeruns.ship.standby import pause

# One server for the tests that check their own runs by id; a test that counts
# the platform's runs or faults, or needs other settings, starts its own.
_server, local_platform = module_platform.fixtures()


def _journaled(path: Path) -> list[tuple[int, dict[str, Any]]]:
    import orjson

    journal = Journal.open(path, owner=False)
    try:
        result = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6, max_bytes=1 << 34)
        return [(e.seq, orjson.loads(e.payload)) for e in result.entries]
    finally:
        journal.close()


def test_eight_threads_logging_into_one_run_journal_every_returned_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix, 21 to 180 of these 8,000 records were missing: two appends
    could take the same seq, and LMDB's refused put went unchecked."""
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    threads, calls = 8, 1000
    start = threading.Barrier(threads)

    def log(t: int) -> None:
        start.wait()
        for i in range(calls):
            run.log_episodes([{"id": f"t{t}-{i}", "traces": [], "pad": "x" * 3000}])

    workers = [threading.Thread(target=log, args=(t,)) for t in range(threads)]
    # Switch threads as often as the interpreter can, so that any window
    # between choosing a seq and publishing it is hit (no sleep involved).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    run.finish()
    assert run.dropped_records == 0 and run.failed_records == {}
    assert run.journal_path is not None
    entries = _journaled(run.journal_path)
    ids = Counter(record["id"] for _, record in entries)
    assert len(ids) == threads * calls and max(ids.values()) == 1
    seqs = [seq for seq, _ in entries]
    assert len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("how", ["not_enabled", "opted_out"])
def test_an_eval_without_prime_traces_still_ships_every_sample_row(
    how: str,
    make_local_platform: Any,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the fix the run closed COMPLETED with 3 to 153 of 300 rows: the
    drain stopped at the first sink that was off."""
    lp = make_local_platform(traces_disabled=True) if how == "not_enabled" else local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    if how == "opted_out":
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "1")
    episodes = workloads.gsm8k(300)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    for i in range(0, len(episodes), 20):
        run.log_episodes(episodes[i : i + 20])
    run.finish(timeout=120)
    stored = lp.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == 300
    assert stored["traces"]["episodes"] == 0
    assert run.failed_records == {}


@pytest.mark.parametrize("how", ["not_enabled", "opted_out"])
def test_a_training_run_without_prime_traces_ships_every_metrics_row(
    how: str,
    make_local_platform: Any,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lp = make_local_platform(traces_disabled=True) if how == "not_enabled" else local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    if how == "opted_out":
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "1")
    run = pr.init(
        kind="train", model="m", team_id="team-a", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    for step, episodes in workloads.agentic_by_step(2).items():
        run.log_episodes(episodes)
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    run.finish(timeout=120)
    stored = lp.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 30, "steps": 30}
    assert sorted(o["step"] for o in stored["parquet_objects"]) == [0, 10, 20]


def test_500s_on_metrics_do_not_retire_the_sink(
    make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix a 500 was fatal: 0 to 2 of 60 rows arrived."""
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    lp.set_faults(retryable_rate=0.3, statuses=[500], routes=["/api/v1/rft/metrics"], seed=7)
    run = pr.init(
        kind="train", model="m", team_id="team-a", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    for step in range(60):
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    run.finish(timeout=120)
    assert lp.set_faults()["injected"] > 0  # the 500s really happened
    stored = lp.run(run.id)
    assert stored["status"] == "COMPLETED"
    assert stored["train_metrics"] == {"rows": 60, "steps": 60}
    assert run.failed_records == {}


def test_a_500_at_registration_does_not_kill_the_job(
    make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix ``init()`` raised APIError on a 500 from the create request."""
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    lp.set_faults(retryable_rate=1.0, statuses=[500], routes=["/api/v1/evaluations"])
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    assert run.url is None  # not registered yet; the job goes on
    run.log_episodes(workloads.gsm8k(5))
    lp.set_faults(retryable_rate=0.0)
    run.finish(timeout=60)
    stored = lp.run(run.id)
    assert stored["status"] == "COMPLETED" and stored["samples"]["rows"] == 5
    assert len([r for r in lp.runs() if r.get("kind", "eval") == "eval"]) == 1


@pytest.mark.parametrize("bad", ["id_too_long", "no_id", "id_repeated"])
def test_one_bad_episode_fails_alone_and_its_batch_mates_reach_prime_traces(
    bad: str, local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix all 100 of the batch were counted failed and none of the
    99 good ones reached Prime Traces. The service names the refused line for
    the first two, and the id for a repeated one: the later record carrying
    it is set apart (before, halving sent the two in uploads of their own,
    the second replacing the first in the service's reads)."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    episodes = workloads.gsm8k(100)
    if bad == "id_too_long":
        episodes[37]["id"] = "x" * 300
    elif bad == "no_id":
        del episodes[37]["id"]
    else:
        episodes[37]["id"] = episodes[12]["id"]
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    run.log_episodes(episodes)
    run.finish(timeout=60)
    assert run.id is not None
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert stored == Counter(e["id"] for i, e in enumerate(episodes) if i != 37)
    assert run.failed_records == {"traces": 1}


def test_finish_with_the_platform_down_gives_up_when_nothing_moves_and_says_how_to_ship(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, finish() blocked for its whole 300 s timeout with the platform
    down. Now it stops once nothing has moved for a while (60 s; shortened
    here), naming what is left and the command that ships it."""
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    lp.stop()
    run.log_episodes(workloads.gsm8k(10))
    with caplog.at_level("INFO", logger="primeruns"):
        run.finish()  # the default timeout: 300 s
    text = caplog.text
    assert "nothing shipped for" in text
    assert f"primeruns replay {run.journal_path}" in text
    assert run.journal_path is not None
    assert len(_journaled(run.journal_path)) == 10  # all still in the journal


def test_a_platform_unreachable_from_init_on_ends_finish_within_the_stall_and_replay_ships_it(
    make_local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No route to the platform at all (a compute node). Before, finish()
    retried the registration for its whole 300 s timeout in silence. Now the
    registration is given up on like a stuck sink: within the stall
    allowance (1 s here), naming what is left and the command that ships it;
    the replay from a machine with a route ships every record exactly once."""
    import socket
    import time

    from primeruns.cli import main

    with socket.socket() as probe:  # a loopback port with nothing listening
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    runs = point_at(monkeypatch, tmp_path, dead)
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=dead, runs_dir=runs)
    assert run.url is None
    episodes = workloads.gsm8k(20)
    run.log_episodes(episodes)
    started = time.monotonic()
    with caplog.at_level("INFO", logger="primeruns"):
        run.finish()  # the default timeout: 300 s
    assert time.monotonic() - started < 120  # the stall (1 s) and its tries, not 300 s
    assert f"primeruns replay {run.journal_path}" in caplog.text
    assert any(e.startswith("register failed") for e in run.errors), run.errors
    assert run.journal_path is not None

    lp = make_local_platform()
    monkeypatch.setenv("PRIME_TRACES_URL", lp.url)
    monkeypatch.setenv("PRIME_API_KEY", API_KEY)  # never in the journal: the replayer's own
    for _ in range(2):  # twice is harmless
        assert main(["replay", "--base-url", lp.url, str(run.journal_path)]) == 0
    [stored] = [lp.run(r["id"]) for r in lp.runs()]
    assert stored["status"] == "COMPLETED"
    assert stored["traces"]["episodes"] == stored["traces"]["distinct_episodes"] == len(episodes)
    assert stored["samples"]["rows"] == stored["samples"]["distinct"] == len(episodes)


class _MainThreadSleeps:
    """The lifecycle's ``pause`` for one test: the waits asked for on this
    thread (``init()``'s) are kept and cut short; other threads wait as asked."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> None:
        if threading.get_ident() == self._thread:
            self.asked.append(seconds)
            seconds = min(seconds, 0.01)
        pause(seconds)


def test_a_long_retry_after_at_init_is_left_to_the_uplink_not_waited_out_in_the_loop(
    make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A platform rate-limiting the registration with a long Retry-After
    (honoured up to 60 s). Before, init() slept it out
    between its two quick tries, then gave up anyway: the user's job waited
    up to a minute for a run.url of None. Now init() waits no longer than a
    short retry would, and the uplink registers the run when the platform
    lets it: the run is still closed with every episode."""
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    sleeps = _MainThreadSleeps()
    monkeypatch.setattr("primeruns.ship.lifecycle.pause", sleeps)
    lp.set_faults(retryable_rate=1.0, statuses=[429], retry_after=30.0)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
    )
    assert run.url is None
    assert all(asked <= 2.0 for asked in sleeps.asked), sleeps.asked
    lp.set_faults(retryable_rate=0.0)
    episodes = workloads.gsm8k(5)
    run.log_episodes(episodes)
    run.finish(timeout=60)
    assert lp.run(run.id)["status"] == "COMPLETED", run.errors
    assert Counter(platform_episode_ids(lp.data_dir, run.id)) == {e["id"]: 1 for e in episodes}


class _RefusingThenHolding:
    """A platform that answers its first ``refused`` requests 503 at once
    (with ``retry_after`` as its Retry-After), then takes requests and holds
    them unanswered until ``let_go``, which drops them (the client reads a
    connection closed with no answer)."""

    def __init__(self, refused: int, retry_after: bytes = b"") -> None:
        self._answer = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
            + (b"Retry-After: " + retry_after + b"\r\n" if retry_after else b"")
            + b"Connection: close\r\n\r\n"
        )
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._refused = refused
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._server.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(65536):  # a request's head (and body) arrived
                with self._lock:
                    refuse = self._refused > 0
                    self._refused -= 1
                    if not refuse:
                        self._held.append(conn)
                        return
                conn.sendall(self._answer)
                conn.close()
                return

    def holding(self) -> int:
        with self._lock:
            return len(self._held)

    def let_go(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            conn.close()
        self._server.close()


def test_a_request_still_waiting_when_finish_returns_ends_its_thread_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The uplink in threads of a run whose platform refused init()'s
    registration and then held the background registration's request past
    finish(): finish() returns after its wait and closes the journal, and the
    request, let go later, came back to a closed journal. Before, the
    registration's thread died on that JournalError (an unhandled exception
    in thread primeruns-register, printed to the user's stderr) and the
    uplink's thread logged it as an unexpected error with its traceback."""
    from sdk_helpers import wait_for

    from primeruns.settings import UPLINK_ENV

    platform = _RefusingThenHolding(refused=2)  # init()'s two tries
    runs = point_at(monkeypatch, tmp_path, platform.url)
    monkeypatch.setenv(UPLINK_ENV, "threads")
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
    died: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=platform.url, runs_dir=runs
    )
    assert run.url is None
    wait_for(lambda: platform.holding() > 0, what="the background registration's request")
    run.log_episodes(workloads.gsm8k(3))
    with caplog.at_level("INFO", logger="primeruns"):
        run.finish(timeout=1)
        platform.let_go()
        registering = [t for t in threading.enumerate() if t.name == "primeruns-register"]
        for thread in registering:
            thread.join(timeout=60)
    assert not any(t.is_alive() for t in registering)
    assert not died, [(d.thread, d.exc_value) for d in died]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert run.journal_path is not None
    assert len(_journaled(run.journal_path)) == 3  # all kept for a replay


def test_a_retry_after_no_calendar_holds_is_a_refusal_init_warns_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway's 503 whose Retry-After is a date past any calendar: before,
    init() raised the OverflowError of its parse into the user's code."""
    platform = _RefusingThenHolding(refused=2, retry_after=b"01 Jan 99999999999 00:00:00 GMT")
    runs = point_at(monkeypatch, tmp_path, platform.url)
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
    try:
        run = pr.init(
            environments=["gsm8k"], model="m", api_key=API_KEY, base_url=platform.url, runs_dir=runs
        )
        run.finish(timeout=1)
    finally:
        platform.let_go()
    assert run.url is None


def test_a_platform_holding_every_request_holds_init_half_a_minute_not_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that takes requests and never answers (its backend gone).
    Before, init()'s two tries each waited out the 60 s read timeout: the
    user's job stood still for two minutes, for a run.url of None. Now its
    registration is bounded all told (30 s), and the uplink goes on trying."""
    import time

    platform = _RefusingThenHolding(refused=0)
    runs = point_at(monkeypatch, tmp_path, platform.url)
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
    started = time.monotonic()
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=platform.url, runs_dir=runs
    )
    took = time.monotonic() - started
    run.finish(timeout=1)
    platform.let_go()
    assert run.url is None
    assert took < 60, took  # 30 s and its last request's start; two minutes before


def test_lost_registration_responses_leave_exactly_one_run_per_init(
    make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half the evaluation requests are committed and their answers lost. Before
    the client token, 10 ``init()`` calls left 21 evaluations, 11 of them empty
    and RUNNING forever. Each create now carries the journal's token under
    ``metadata.prime_runs``; after a lost answer the run is looked up first.
    (The lookup's cases are unit-tested in tests/ship/test_lifecycle_unit.py;
    here, four runs against the local platform's listing.)"""
    lp = make_local_platform()
    runs = point_at(monkeypatch, tmp_path, lp.url)
    lp.set_faults(ambiguous_rate=0.5, routes=["/api/v1/evaluations/"], seed=3)
    made = []
    for i in range(4):
        run = pr.init(
            name=f"r{i}",
            environments=["gsm8k"],
            model="m",
            api_key=API_KEY,
            base_url=lp.url,
            runs_dir=runs,
        )
        run.log_episodes(workloads.gsm8k(3))
        run.finish(timeout=60)
        made.append(run)
    assert lp.set_faults(ambiguous_rate=0.0)["injected"] > 5  # answers really were lost
    evaluations = [r for r in lp.runs() if r.get("kind", "eval") == "eval"]
    assert len(evaluations) == len(made), evaluations
    for run in made:
        stored = lp.run(run.id)
        assert stored["status"] == "COMPLETED" and stored["samples"]["rows"] == 3


def test_two_handles_attached_to_one_run_merge_their_step_rows_and_only_the_first_closes_it(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, two processes attached to the same run id overwrote each other's
    metric rows (one row per step on the platform), and the first to finish
    closed the run while the other still logged. With no launcher rank, the
    first to attach is the run's primary (primeruns.ranks)."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    for var in ("RANK", "SLURM_PROCID", "PRIME_RUNS_PRIMARY"):
        monkeypatch.delenv(var, raising=False)
    import httpx

    created = httpx.post(
        f"{lp.url}/api/v1/rft/external-runs",
        json={"base_model": "m", "max_steps": 10, "team_id": "team-a"},
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=10,
    ).json()["run"]["id"]
    common: dict[str, Any] = {"api_key": API_KEY, "base_url": lp.url, "runs_dir": runs}
    first = pr.init(kind="train", id=created, model="m", team_id="team-a", **common)
    second = pr.init(kind="train", id=created, model="m", team_id="team-a", **common)
    first.log_metrics({"loss": 1.0, "lr": 0.5}, step=3)
    second.log_metrics({"loss": 2.0, "reward": 0.25, "lr": 0.5}, step=3)
    second.finish(timeout=30)
    assert lp.run(created)["status"] == "RUNNING"  # the second leaves it open
    first.finish(timeout=30)
    assert lp.run(created)["status"] == "COMPLETED"
    rows = httpx.get(
        f"{lp.url}/api/v1/rft/runs/{created}/metrics",
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=10,
    ).json()["metrics"]
    assert len(rows) == 1
    row = rows[0]
    second_label = f"loss@{second.journal_path.name}" if second.journal_path else ""
    assert (row["step"], row["loss"], row["reward"], row["lr"]) == (3, 1.0, 0.25, 0.5)
    assert row[second_label] == 2.0  # its value of a key both logged, kept under its name


def test_a_refusal_names_its_line_only_at_the_start_of_the_message() -> None:
    """A refusal that quotes a user's id containing "line 1" names no line: the
    batch is halved instead of failing its innocent first record."""
    from primeruns.ship.shipper import _rejected_line

    named = Exception("HTTP 400 from POST /api/v1/traces: line 7: episode id over 256")
    quoted = Exception("HTTP 400 from POST /api/v1/traces: episode id 'line 1' repeats")
    assert _rejected_line(named, 100) == 7
    assert _rejected_line(quoted, 100) is None


def _under_a_file(tmp_path: Path, *parts: str) -> Path:
    """A path nothing can be created at: its parent is a file (as a read-only
    home refuses, with no second uid or mount needed)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    return blocker.joinpath(*parts)


@pytest.mark.parametrize("what", ["runs_dir", "home", "PRIME_RUNS_DIR at a file"])
def test_an_unwritable_runs_dir_or_home_falls_back_to_a_private_journal_and_ships(
    what: str,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before the fix init() raised JournalError (the vendor's SDK ships the
    run; verifiers turned the error into a silently disabled run). And
    ``PRIME_RUNS_DIR`` naming a file raised ConfigurationError from init(),
    where the ``runs_dir`` argument naming one went to the fallback folder."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    refused = _under_a_file(tmp_path, "runs")
    runs_dir: Path | None = None
    if what == "home":
        monkeypatch.setenv("HOME", str(refused))
    elif what == "PRIME_RUNS_DIR at a file":
        refused = refused.parent  # the file itself
        monkeypatch.setenv("PRIME_RUNS_DIR", str(refused))
    else:
        runs_dir = refused
    episodes = workloads.gsm8k(40)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = pr.init(
            environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs_dir
        )
    fallback = scratch / f"prime-runs-{os.geteuid()}" / "runs"
    assert run.journal_path is not None and run.journal_path.parent == fallback
    warned = [r.getMessage() for r in caplog.records if str(fallback) in r.getMessage()]
    assert len(warned) == 1
    assert str(refused) in warned[0] and "PRIME_RUNS_DIR" in warned[0]
    for folder in (fallback.parent, fallback, run.journal_path):
        assert os.stat(folder).st_mode & 0o777 == 0o700, folder
    run.log_episodes(episodes)
    run.finish(timeout=120)
    assert run.status is pr.RunStatus.COMPLETED and run.failed_records == {}
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes} and max(stored.values()) == 1
    assert not runs.exists()


def test_an_online_run_whose_prime_runs_folder_others_can_write_goes_to_a_refuge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As for a runs directory others can write: kept in a private refuge,
    with one warning naming the folder and the fix, never under that one."""
    point_at(monkeypatch, tmp_path, None)
    folder = tmp_path / "state" / "prime-runs"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    monkeypatch.setenv("XDG_STATE_HOME", str(folder.parent))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        journal = refuge.create_journal(folder / "runs", Journal.create, online=True)
    journal.close()
    assert journal.path.parent == scratch / f"prime-runs-{os.geteuid()}" / "runs"
    warned = [r.getMessage() for r in caplog.records if str(folder) in r.getMessage()]
    assert len(warned) == 1 and "writable by other users" in warned[0]
    assert not (folder / "runs").exists()


def test_a_process_opening_evaluation_after_evaluation_keeps_no_descriptor_per_run(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prime-rl's eval monitor opens an evaluation per epoch and environment,
    for a whole training, in one process. Before, each run it made kept its
    primary lock (``<runs dir>/.primary/``) open for the process's life: one
    descriptor per run, until opens failed with EMFILE (init() raised
    OSError, an uplink could not start)."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    monkeypatch.setenv("PRIME_RUNS_UPLINK", "threads")  # shipped and let go by finish()
    episodes = workloads.gsm8k(24)

    def primary_locks_open() -> int:
        found = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # (listdir's own descriptor, closed since)
                found += os.readlink(f"/proc/self/fd/{fd}").startswith(str(runs / ".primary"))
        return found

    ids = []
    for epoch in range(12):
        run = pr.init(
            environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
        )
        run.log_episodes(episodes[2 * epoch : 2 * epoch + 2])
        run.finish(timeout=60)
        assert run.status is pr.RunStatus.COMPLETED
        ids.append(run.id)
    assert primary_locks_open() <= 1  # the last run's, let go at the next init()
    assert [lp.run(i)["samples"]["distinct"] for i in ids] == [2] * 12


def test_a_forked_child_of_a_run_kept_in_a_fallback_folder_keeps_its_records(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only home on a cluster node and a pool of forked workers: each
    worker's journal goes beside its parent's, in the fallback folder.
    Before, the child tried the refused runs directory again, and every
    record it logged was dropped."""
    lp = local_platform
    point_at(monkeypatch, tmp_path, lp.url)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    refused = _under_a_file(tmp_path, "runs")
    episodes = workloads.gsm8k(20)
    run = pr.init(
        environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=refused
    )
    run.log_episodes(episodes[:10])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: log, say what was dropped, leave as a pool worker does
        try:
            run.log_episodes(episodes[10:])
            os.write(write, str(run.dropped_records).encode())
        finally:
            os._exit(0)
    os.close(write)
    dropped = os.read(read, 100)
    os.waitpid(pid, 0)
    run.finish(timeout=120)
    assert dropped == b"0"
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert stored == Counter(e["id"] for e in episodes)
    assert lp.run(run.id)["status"] == "COMPLETED"


def _no_folder_takes_a_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME (and with it the default runs directory), TMPDIR and /dev/shm all
    refuse a journal; returns the refused home."""
    home = _under_a_file(tmp_path, "home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(home.parent / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(home.parent / "tmp"))
    monkeypatch.setattr(refuge, "_SHM", home.parent / "shm")
    return home


def test_an_offline_run_no_folder_takes_is_refused_naming_its_runs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept for a later sync, its journal is the run: memory would not keep it."""
    point_at(monkeypatch, tmp_path, None)
    home = _no_folder_takes_a_journal(tmp_path, monkeypatch)
    with pytest.raises(JournalError, match=re.escape(str(home))):
        pr.init(environments=["gsm8k"], mode="offline")
    assert not list(tmp_path.glob("**/prime-runs-*"))


def test_an_online_run_no_folder_takes_ships_from_memory_with_one_warning(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, init() raised JournalError (the vendor's SDK ships the run,
    keeping its records in memory; verifiers turned the error into a silently
    disabled run)."""
    lp = local_platform
    point_at(monkeypatch, tmp_path, lp.url)
    home = _no_folder_takes_a_journal(tmp_path, monkeypatch)
    episodes = workloads.gsm8k(40)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url)
        run.log_episodes(episodes[:20])
        assert run.flush(timeout=60)
        run.log_episodes(episodes[20:])
        run.finish(timeout=120)
    assert run.mode == "online" and run.journal_path is None
    assert run.status is pr.RunStatus.COMPLETED
    assert run.failed_records == {} and run.dropped_records == 0 and run.errors == []
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == {e["id"] for e in episodes} and max(stored.values()) == 1
    assert lp.run(run.id)["status"] == "COMPLETED"
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    # What could not be written, and what the run then risks.
    assert str(home) in warned[0] and "memory" in warned[0] and "a crash" in warned[0]
    assert all(str(folder) in warned[0] for folder in refuge.refuges())
    assert not list(tmp_path.glob("**/prime-runs-*"))


def _log_in_a_forked_worker(run: pr.Run, episodes: list[Any]) -> None:
    """A pool worker's task: log, and leave through multiprocessing's exit."""
    run.log_episodes(episodes)


def test_a_forked_worker_of_a_run_kept_in_memory_ships_its_records(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No folder takes a journal, and the run forks a worker that logs (a
    pool's or a data loader's). Before, the worker's records were dropped
    (counted in its run.dropped_records) while the vendor's SDK ships them
    from the worker: it keeps them in memory, as the run does here."""
    lp = local_platform
    point_at(monkeypatch, tmp_path, lp.url)
    _no_folder_takes_a_journal(tmp_path, monkeypatch)
    episodes = workloads.gsm8k(30)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url)
    run.log_episodes(episodes[:10])
    worker = multiprocessing.get_context("fork").Process(
        target=_log_in_a_forked_worker, args=(run, episodes[10:20])
    )
    worker.start()
    worker.join(timeout=120)
    assert worker.exitcode == 0
    run.log_episodes(episodes[20:])
    run.finish(timeout=120)
    assert run.status is pr.RunStatus.COMPLETED and run.dropped_records == 0
    stored = platform_episode_ids(lp.data_dir, run.id)
    assert stored == Counter(e["id"] for e in episodes)
    assert lp.run(run.id)["status"] == "COMPLETED"


def test_a_run_kept_in_memory_hands_workers_a_handle(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, run.handle() of a run no folder took raised ConfigurationError
    into the loop; a worker that joins it keeps its records in memory too."""
    lp = local_platform
    point_at(monkeypatch, tmp_path, lp.url)
    _no_folder_takes_a_journal(tmp_path, monkeypatch)
    episodes = workloads.gsm8k(10)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url)
    handle = pickle.loads(pickle.dumps(run.handle()))
    worker = pr.join(handle)  # here as in a spawned worker: a process of its own below
    worker.log_episodes(episodes)
    worker.finish(timeout=120)
    run.finish(timeout=120)
    assert worker.dropped_records == 0 and worker.failed_records == {}
    assert platform_episode_ids(lp.data_dir, run.id) == Counter(e["id"] for e in episodes)


def test_records_a_run_in_memory_could_not_ship_are_counted_as_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    point_at(monkeypatch, tmp_path, url)
    monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
    _no_folder_takes_a_journal(tmp_path, monkeypatch)
    run = pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=url)
    run.log_episodes(workloads.gsm8k(5))
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        run.finish(timeout=30)
    assert run.failed_records == {"traces": 5, "eval_samples": 5}
    assert "lost" in caplog.text and "memory" in caplog.text


@pytest.mark.parametrize("traces", ["left_at_default", "set", "opted_out"])
def test_a_local_base_url_with_the_traces_url_left_at_production_is_named_at_init(
    traces: str,
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before the fix nothing was said: the traces went to the production URL
    and finish() waited the stall out with no reason given."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url if traces == "set" else None)
    if traces == "opted_out":
        monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "1")
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        # Offline: a later sync would ship there too, and nothing leaves this machine.
        run = pr.init(
            environments=["gsm8k"], api_key=API_KEY, base_url=lp.url, mode="offline", runs_dir=runs
        )
        run.finish()
    warned = [r.getMessage() for r in caplog.records if "PRIME_TRACES_URL" in r.getMessage()]
    if traces == "left_at_default":
        assert len(warned) == 1
        assert lp.url in warned[0] and "traces_url" in warned[0].replace("PRIME_TRACES_URL", "")
    else:
        assert warned == []


def test_a_refused_sink_is_named_with_its_url_in_run_errors_and_in_finish(
    local_platform: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before the fix finish() said "5 record(s) ... not shipped (traces: 5)"
    and no more; run.errors named the path of the request, not its host."""
    lp = local_platform
    # Bound and never listening: every connection to it is refused.
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        runs = point_at(monkeypatch, tmp_path, nowhere)
        monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
        run = pr.init(
            environments=["gsm8k"], model="m", api_key=API_KEY, base_url=lp.url, runs_dir=runs
        )
        run.log_episodes(workloads.gsm8k(5))
        with caplog.at_level(logging.WARNING, logger="primeruns"):
            run.finish(timeout=60)
    named = [e for e in run.errors if nowhere in e]
    assert named and "refused" in named[-1].lower()
    said = [r.getMessage() for r in caplog.records if "not shipped" in r.getMessage()]
    assert len(said) == 1 and nowhere in said[0] and "refused" in said[0].lower()


def test_a_run_that_never_registered_names_why_in_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the fix finish() said how many records were left, not that the
    platform refused every connection."""
    with socket.socket() as refusing:
        refusing.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{refusing.getsockname()[1]}"
        runs = point_at(monkeypatch, tmp_path, nowhere)
        monkeypatch.setenv("PRIME_RUNS_STALL_S", "1")
        run = pr.init(
            environments=["gsm8k"], model="m", api_key=API_KEY, base_url=nowhere, runs_dir=runs
        )
        run.log_episodes(workloads.gsm8k(5))
        with caplog.at_level(logging.WARNING, logger="primeruns"):
            run.finish(timeout=60)
    said = [r.getMessage() for r in caplog.records if "not shipped" in r.getMessage()]
    assert len(said) == 1 and nowhere in said[0] and "refused" in said[0].lower()


def test_a_hub_404_under_a_base_url_with_a_wrong_path_names_the_url(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix: EnvironmentResolutionError "could not resolve
    name='gsm8k': HTTP 404 from POST /wrong/api/v1/...", blaming the
    environment and never naming the URL."""
    lp = local_platform
    runs = point_at(monkeypatch, tmp_path, lp.url)
    wrong = f"{lp.url}/wrong"
    with pytest.raises(ConfigurationError) as caught:
        pr.init(environments=["gsm8k"], model="m", api_key=API_KEY, base_url=wrong, runs_dir=runs)
    text = str(caught.value)
    assert not isinstance(caught.value, EnvironmentResolutionError)
    assert wrong in text and "base_url" in text and "'/wrong'" in text
    # No journal left for a run never made (its runs directory's .newest-stamp is no journal).
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]


_READ_ONLY_HOME_RUN = """
import json, os, sys
os.environ["TMPDIR"] = sys.argv[3]  # here: run_as stages its mounts in the outer one
import primeruns as pr
run = pr.init(environments=["gsm8k"], model="m", api_key=sys.argv[2], base_url=sys.argv[1])
run.log_episodes([{"id": f"e{i}", "traces": []} for i in range(10)])
run.finish(timeout=120)
print(json.dumps({"id": run.id, "journal": str(run.journal_path), "status": run.status.value}))
"""


def test_a_read_only_home_as_a_real_user_falls_back_and_ships(
    local_platform: Any, tmp_path: Path
) -> None:
    """A real EACCES (root ignores modes): an unprivileged uid whose home is
    0500, as on a cluster node. Before the fix init() raised JournalError."""
    second_uid.require()
    lp = local_platform
    world = second_uid.give(tmp_path / "world", (0, 0), 0o755)
    home = second_uid.give(world / "home", second_uid.VICTIM, 0o500)
    scratch = second_uid.give(world / "scratch", second_uid.VICTIM, 0o700)
    env = second_uid.env_of(home, PRIME_TRACES_URL=lp.url, PRIME_RUNS_RETRY_BASE_S="0.02")
    done = second_uid.run_as(
        second_uid.VICTIM,
        [sys.executable, "-c", _READ_ONLY_HOME_RUN, lp.url, API_KEY, str(scratch)],
        reach=[world],
        env=env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    fallback = scratch / f"prime-runs-{second_uid.VICTIM[0]}" / "runs"
    assert Path(report["journal"]).parent == fallback
    warned = [line for line in done.stderr.splitlines() if str(fallback) in line]
    assert len(warned) == 1 and str(home) in warned[0] and "Permission denied" in warned[0]
    stored = lp.run(report["id"])
    assert stored["status"] == "COMPLETED" and stored["traces"]["episodes"] == 10


def test_a_file_system_that_reports_no_size_takes_an_online_runs_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FUSE file system without a statfs of its own answers zeros for every
    count (libfuse's default): its free space is not known, not nil, so the
    journal is made where it was asked for, not in a fallback folder."""
    zeros = os.statvfs_result((512, 512, 0, 0, 0, 0, 0, 0, 0, 255))
    monkeypatch.setattr(refuge.os, "statvfs", lambda path: zeros)
    assert refuge.short_of_room(tmp_path) is None
    journal = refuge.create_journal(tmp_path / "runs", Journal.create, online=True)
    try:
        assert journal.path.parent == tmp_path / "runs"
    finally:
        journal.close()


class _ShipperClock:
    """The shippers' clock (``time.monotonic`` as ``primeruns.ship.shipper``
    sees it), standing still but for the test's moves."""

    def __init__(self) -> None:
        import time

        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


def test_a_steady_loop_shipping_from_threads_sends_its_metrics_rows_once_a_second(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shipping from threads, every batch's work takes the loop's GIL, and most
    of it is paid per batch: rows logged within a second of their sink's last
    request wait for it and go out together (the first at once, the rest at
    the flush), not each in a request of its own as the uplink process's
    tenth of a second has them go. Each row is logged 0.2 s (on the shippers'
    clock) after the one before, once the metrics shipper has looked at it."""
    from sdk_helpers import wait_for

    from primeruns.settings import UPLINK_ENV
    from primeruns.ship import shipper as shipper_mod
    from primeruns.sinks.train_metrics import TrainMetricsSink

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv(UPLINK_ENV, "threads")
    clock = _ShipperClock()
    monkeypatch.setattr(shipper_mod, "time", clock)
    looked: set[int] = set()  # the metrics entries its shipper saw
    looked_at = shipper_mod.Shipper._linger_left

    def linger_left(self: Any, entries: Any) -> float:
        if self.name == "train_metrics":
            looked.update(e.seq for e in entries)
        return looked_at(self, entries)

    monkeypatch.setattr(shipper_mod.Shipper, "_linger_left", linger_left)
    sends: list[int] = []
    send = TrainMetricsSink.send

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        sends.append(1)
        return send(self, *args, **kwargs)

    monkeypatch.setattr(TrainMetricsSink, "send", counted)
    run = pr.init(
        kind="train",
        model="m",
        team_id="team-a",
        api_key=API_KEY,
        base_url=local_platform.url,
        runs_dir=runs,
    )
    for step in range(5):
        clock.now += 0.2
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        wait_for(lambda s=step: len(looked) > s, what=f"the metrics shipper's look at step {step}")
    wait_for(lambda: sends, what="the first row's request")
    assert len(sends) == 1  # the rest wait for the sink's second
    assert run.flush(timeout=60)
    assert len(sends) == 2
    run.finish(timeout=60)
    assert local_platform.run(run.id)["train_metrics"] == {"rows": 5, "steps": 5}


def test_a_training_run_shipping_from_threads_imports_its_parquet_writer_in_init(
    local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample table's first object imported pyarrow (~0.2 s of CPU, the
    GIL held) in a shipping thread during the loop's first steps, one of them
    waiting for it; the vendor's init imports it, and now so does this one
    when the run ships from threads. In a process of its own: this one has
    imported pyarrow already."""
    import subprocess

    from primeruns.settings import UPLINK_ENV

    runs = point_at(monkeypatch, tmp_path, local_platform.url)
    monkeypatch.setenv(UPLINK_ENV, "threads")
    script = (
        "import sys, primeruns as pr\n"
        f"run = pr.init(kind='train', model='m', team_id='team-a', api_key={API_KEY!r}, "
        f"base_url={local_platform.url!r}, runs_dir={str(runs)!r})\n"
        "print('pyarrow' in sys.modules)\n"
        "run.finish(timeout=60)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["True"], done.stderr
