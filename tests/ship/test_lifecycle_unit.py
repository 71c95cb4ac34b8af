"""A run's registration and close-out (``primeruns.ship.lifecycle``) through
``httpx.MockTransport``, against a scripted platform that answers as the
local platform does (``primeruns/local/evals.py``, ``rft.py``).

Registration is not replayable, so what is under test is what the lifecycle
does when a create's answer is lost; close-out, what it falls back on and
when it records the run as closed.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scripted_platform import (
    LOST,
    PASS,
    REFUSED,
    Fault,
    ScriptedPlatform,
    error,
    failed_attempt,
    forwarded,
)

from primeruns.exceptions import (
    APIError,
    ForbiddenError,
    RetryableAPIError,
    TransportError,
    UnauthorizedError,
)
from primeruns.journal import Journal
from primeruns.ship.lifecycle import _MAX_LOST_CREATES, K_CREATES_LOST, Lifecycle
from primeruns.ship.policy import UNREACHED_S, RetryPolicy
from primeruns.spec import SpecError

# Three attempts a call, with no wait between them.
_AT_ONCE = RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, attempts_per_strike=3)
_EVALS = "/api/v1/evaluations/"
_EVAL = r"/api/v1/evaluations/(?P<id>[^/]+)"
_RUNS = "/api/v1/rft/external-runs"


class Registry:
    """The platform's evaluations and external training runs."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.evaluations: list[dict[str, Any]] = []  # in creation order
        self.runs: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        routes = [
            ("resolve", "POST", "/api/v1/environmentshub/resolve", self.resolve),
            ("create", "POST", _EVALS, self.create),
            ("list", "GET", _EVALS, self.list),
            ("update", "PUT", _EVAL, self.update),
            ("finalize", "POST", _EVAL + "/finalize", self.finalize),
            ("create_run", "POST", _RUNS, self.create_run),
            ("run_status", "PUT", _RUNS + r"/(?P<id>[^/]+)/status", self.run_status),
            ("run_finalize", "POST", "/api/v1/rft/finalize", self.run_finalize),
        ]
        for name, method, path, handler in routes:
            platform.route(name, method, path, handler)

    def evaluation(self, eval_id: str) -> dict[str, Any]:
        return next(e for e in self.evaluations if e["id"] == eval_id)

    def add_evaluation(self, body: dict[str, Any]) -> dict[str, Any]:
        evaluation = {
            "id": f"eval-{next(self._ids)}",
            "name": body.get("name"),
            "status": "RUNNING",
            "team_id": body.get("team_id"),
            "environment_names": [body["dataset"]] if body.get("dataset") else [],
            "metadata": body.get("metadata") or {},
            "metrics": {},
            "error_message": None,
        }
        self.evaluations.append(evaluation)
        return evaluation

    def resolve(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        name = json.loads(request.content)["name"]
        return httpx.Response(200, json={"data": {"id": f"env-{name}", "name": name}})

    def create(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        evaluation = self.add_evaluation(json.loads(request.content))
        view = {
            "evaluation_id": evaluation["id"],
            "name": evaluation["name"],
            "status": "RUNNING",
            "viewer_url": f"http://platform.test/dashboard/evaluations/{evaluation['id']}",
        }
        return httpx.Response(201, json=view)

    def list(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        params = request.url.params
        found = [
            {**e, "evaluation_id": e["id"]}
            for e in reversed(self.evaluations)  # newest first
            if params.get("team_id") in (None, e["team_id"])
            and params.get("environment_name") in (None, *e["environment_names"])
        ]
        skip, limit = int(params.get("skip", 0)), int(params.get("limit", 50))
        page = found[skip : skip + limit]
        return httpx.Response(200, json={"evaluations": page, "total": len(found)})

    def update(self, request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        evaluation = self.evaluation(params["id"])
        body = json.loads(request.content)
        if "status" in body and evaluation["status"] != "RUNNING":
            return error(409, f"Evaluation {params['id']} is already {evaluation['status']}")
        for key in ("metadata", "metrics", "status", "error_message"):
            if key in body:
                evaluation[key] = body[key]
        return httpx.Response(200, json=evaluation)

    def finalize(self, request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        evaluation = self.evaluation(params["id"])
        if evaluation["status"] not in ("RUNNING", "COMPLETED"):
            return error(409, f"Evaluation {params['id']} is already {evaluation['status']}")
        evaluation["status"] = "COMPLETED"
        evaluation["metrics"].update(json.loads(request.content or b"{}").get("metrics") or {})
        return httpx.Response(200, json={"evaluation_id": params["id"], "status": "COMPLETED"})

    def create_run(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        body = json.loads(request.content)
        run = {"id": f"rft-{next(self._ids)}", "name": body.get("name"), "status": "RUNNING"}
        self.runs[run["id"]] = run
        return httpx.Response(201, json={"run": run})

    def run_status(self, request: httpx.Request, params: dict[str, str]) -> httpx.Response:
        run = self.runs[params["id"]]
        if run["status"] != "RUNNING":
            return error(409, f"Run {params['id']} is already {run['status']}")
        body = json.loads(request.content)
        run["status"] = body["status"].upper()
        run["error_message"] = body.get("error_message")
        return httpx.Response(200, json={"run": run})

    def run_finalize(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        run = self.runs[json.loads(request.content)["run_id"]]
        if run["status"] not in ("RUNNING", "COMPLETED"):
            return error(409, f"Run {run['id']} is already {run['status']}")
        run["status"] = "COMPLETED"
        return httpx.Response(200, json={"run_id": run["id"], "status": "COMPLETED"})


def _spec(kind: str = "eval", **changes: Any) -> dict[str, Any]:
    """A run's spec as ``init()`` journals it."""
    spec: dict[str, Any] = {
        "kind": kind,
        "name": "gsm8k-test" if kind == "eval" else "rl-test",
        "environments": [{"name": "gsm8k"}],
        "dataset": "gsm8k",
        "model": "m",
        "tags": [],
        "config": {},
        "team_id": "team-a",
        "training": {"max_steps": 10} if kind == "train" else None,
        "attach_id": None,
        "frontend_url": "http://platform.test",
    }
    spec.update(changes)
    return spec


class World:
    """A journal with a run's spec, the scripted platform, and the failures
    the lifecycle reported (``on_failure``)."""

    def __init__(self, tmp_path: Path) -> None:
        self.runs_dir = tmp_path / "runs"
        self.platform = ScriptedPlatform()
        self.registry = Registry(self.platform)
        self.failures: list[tuple[str, BaseException]] = []
        self.journal: Journal | None = None

    def start(self, spec: dict[str, Any]) -> Lifecycle:
        self.journal = Journal.create(self.runs_dir, meta={"spec": spec})
        return self.lifecycle()

    def lifecycle(self) -> Lifecycle:
        assert self.journal is not None
        return Lifecycle(
            self.journal,
            self.platform.client(),
            policy=_AT_ONCE,
            on_failure=lambda what, exc: self.failures.append((what, exc)),
        )

    def register_failing(
        self, spec: dict[str, Any], route: str, fault: Fault
    ) -> tuple[Lifecycle, BaseException]:
        """A new run's lifecycle whose first registration ``fault`` on ``route``
        ended, and what that raised."""
        lifecycle = self.start(spec)
        return lifecycle, failed_attempt(self.platform, route, fault, lifecycle.register)

    def restart(self) -> Lifecycle:
        """The next process that ships this journal (a replay, a sync)."""
        assert self.journal is not None
        path = self.journal.path
        self.journal.close()
        self.journal = Journal.open(path)
        return self.lifecycle()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = World(tmp_path)
    yield world
    if world.journal is not None:
        world.journal.close()


def _token(evaluation: dict[str, Any]) -> str:
    token: str = evaluation["metadata"]["prime_runs"]["client_token"]
    return token


# -- registration ----------------------------------------------------------------


def test_a_spec_of_the_wrong_shape_is_reported_and_nothing_is_sent(world: World) -> None:
    """A damaged or hostile journal's spec: its registration fails naming the
    field, and the journal is kept for another try."""
    lifecycle = world.start(_spec(tags="nightly"))
    assert lifecycle.register_retrying(deadline=time.monotonic() + 5) is None
    [(what, exc)] = world.failures
    assert what == "register" and isinstance(exc, SpecError) and "spec.tags" in str(exc)
    assert world.platform.calls == [] and lifecycle.binding() is None


def test_a_create_whose_answer_was_lost_is_found_by_its_token_and_adopted_not_made_again(
    world: World,
) -> None:
    lifecycle, raised = world.register_failing(_spec(), "create", LOST)
    assert isinstance(raised, TransportError)
    assert world.platform.calls == ["resolve", "create"]  # not resent: it may have landed
    assert lifecycle.binding() is None
    [made] = world.registry.evaluations
    assert world.journal is not None and _token(made) == world.journal.local_id

    bound = world.restart().register()
    assert world.platform.calls[2:] == ["resolve", "list"]
    assert bound.run_id == made["id"] and bound.kind == "eval"
    assert bound.url == f"http://platform.test/dashboard/evaluations/{made['id']}"
    assert len(world.registry.evaluations) == 1


def test_the_lookup_pages_through_newer_evaluations_of_the_same_team_and_dataset(
    world: World,
) -> None:
    lifecycle, _ = world.register_failing(_spec(), "create", LOST)
    [made] = world.registry.evaluations
    for i in range(60):  # other runs of the team made since, and one of another team
        token = {"prime_runs": {"client_token": f"other-{i}"}}
        world.registry.add_evaluation({"team_id": "team-a", "dataset": "gsm8k", "metadata": token})
    world.registry.add_evaluation({"team_id": "team-b", "dataset": "gsm8k"})

    assert lifecycle.register().run_id == made["id"]
    lookups = [request.url.params for request in world.platform.sent("list")]
    assert [(p["team_id"], p["environment_name"], p["skip"]) for p in lookups] == [
        ("team-a", "gsm8k", "0"),
        ("team-a", "gsm8k", "50"),
    ]
    assert world.platform.calls.count("create") == 1


def test_a_create_refused_with_a_5xx_is_looked_up_first_then_made_once(world: World) -> None:
    lifecycle, raised = world.register_failing(_spec(), "create", error(503, "unavailable"))
    assert isinstance(raised, RetryableAPIError)  # it may follow a commit: not resent at once
    bound = lifecycle.register()
    assert world.platform.calls == ["resolve", "create", "resolve", "list", "create"]
    assert [e["id"] for e in world.registry.evaluations] == [bound.run_id]


#: A proxy's 408 to a create it had passed on to the platform, which made the run.
_PROXY_408 = forwarded(error(408, "request not received in time"))


def test_a_create_a_proxy_answered_408_is_looked_up_not_made_again(world: World) -> None:
    lifecycle, raised = world.register_failing(_spec(), "create", _PROXY_408)
    assert isinstance(raised, RetryableAPIError)  # not resent at once: it may have landed
    [made] = world.registry.evaluations
    bound = lifecycle.register()
    assert world.platform.calls == ["resolve", "create", "resolve", "list"]
    assert bound.run_id == made["id"] and len(world.registry.evaluations) == 1


def test_a_training_create_a_proxy_answered_408_counts_as_a_lost_answer(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle, raised = world.register_failing(_spec("train"), "create_run", _PROXY_408)
    assert isinstance(raised, RetryableAPIError)  # not resent at once: it may have landed
    assert len(world.registry.runs) == 1
    with caplog.at_level(logging.WARNING, logger="primeruns.lifecycle"):
        lifecycle.register()
    assert "may remain" in caplog.text and "'rl-test'" in caplog.text


def test_a_create_that_never_reached_the_platform_is_retried_at_once(world: World) -> None:
    lifecycle = world.start(_spec())
    world.platform.fail("create", REFUSED)
    bound = lifecycle.register(attempts=2)
    assert world.platform.calls == ["resolve", "create", "create"]
    assert [e["id"] for e in world.registry.evaluations] == [bound.run_id]


@pytest.mark.parametrize(
    ("kind", "route", "status", "raised"),
    [
        ("eval", "create", 401, UnauthorizedError),
        ("eval", "create", 403, ForbiddenError),
        ("eval", "resolve", 401, UnauthorizedError),
        ("train", "create_run", 401, UnauthorizedError),
        ("train", "create_run", 403, ForbiddenError),
    ],
)
def test_401_and_403_at_registration_raise_at_once_and_bind_nothing(
    kind: str, route: str, status: int, raised: type[APIError], world: World
) -> None:
    lifecycle, failure = world.register_failing(_spec(kind), route, error(status, "refused"))
    assert isinstance(failure, raised)
    assert world.platform.calls.count(route) == 1
    assert lifecycle.binding() is None


def test_a_lost_training_create_cannot_be_looked_up_so_the_next_one_warns_of_an_empty_run(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle, raised = world.register_failing(_spec("train"), "create_run", LOST)
    assert isinstance(raised, TransportError)
    with caplog.at_level(logging.WARNING, logger="primeruns.lifecycle"):
        bound = lifecycle.register()
    assert "may remain" in caplog.text and "'rl-test'" in caplog.text
    assert bound.kind == "train" and len(world.registry.runs) == 2


def test_retrying_a_training_create_stops_after_its_third_lost_answer(world: World) -> None:
    # Each lost answer may have left an empty run on the platform (a training
    # create has no lookup): replay or a close-out must not make one per try.
    lifecycle = world.start(_spec("train"))
    world.platform.fail("create_run", LOST, LOST, LOST, LOST, LOST)
    assert lifecycle.register_retrying(deadline=_soon(30)) is None
    assert len(world.platform.sent("create_run")) == 3
    assert [what for what, _ in world.failures] == ["register"]


def test_the_processes_of_a_run_key_share_its_allowance_of_lost_training_creates(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process of a run key (a job's ranks) bounded only its own lost
    creates, and the key named a run only once one was answered: behind a
    gateway losing every answer, each next rank created again (4 ranks, 16
    empty runs). The key counts them: the next rank sends none and says how
    many may remain; once the count is old (a requeue, a replay after the
    gateway is fixed) a create is tried again, and every later rank ships
    into the run it made."""
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    spec = _spec("train", run_key="job-7")
    first = world.start(spec)
    world.platform.fail("create_run", LOST, LOST, LOST)
    assert first.register_retrying(deadline=_soon(30)) is None
    second = world.start(spec)  # the next rank: a journal of its own
    assert second.register_retrying(deadline=_soon(30)) is None
    assert len(world.platform.sent("create_run")) == 3
    said = [str(exc) for _, exc in world.failures]
    assert len(said) == 2 and "up to 3 empty RUNNING runs named 'rl-test'" in said[1], said

    monkeypatch.setattr(run_keys, "LOST_WINDOW_S", 0.0)
    third = world.start(spec)
    bound = third.register_retrying(deadline=_soon(30))
    assert bound is not None and len(world.platform.sent("create_run")) == 4
    assert world.start(spec).register_retrying(deadline=_soon(30)) == bound
    assert len(world.platform.sent("create_run")) == 4
    for lifecycle in (first, second, third):
        lifecycle.journal.close()


def test_a_run_keys_training_create_that_succeeds_syncs_its_keys_record_once(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting the key's lost creates before each create wrote the key's
    record synced, then the answered create wrote it synced again: every
    keyed training run's init() paid a second fsync (about 7 ms a write on a
    disk here) for a count only a host crash could lose, at the cost of one
    more create. The run's record is synced; the count is not."""
    import os

    synced: list[str] = []
    fsync = os.fsync

    def counting(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lifecycle = world.start(_spec("train", run_key="job-10"))
    monkeypatch.setattr(os, "fsync", counting)
    assert lifecycle.register_retrying(deadline=_soon(30)) is not None
    monkeypatch.setattr(os, "fsync", fsync)
    assert len([path for path in synced if "run-keys" in path]) == 1, synced


def test_a_keyed_create_taken_back_leaves_the_keys_earlier_lost_creates_dated_as_they_were(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create counted against its key and then taken back (it never reached
    the platform) wrote the key's count back with the time of the take-back,
    so two creates lost 500 s before counted for 600 s more: the window of
    lost creates ran on from a create that made no run. Taken back, the
    record is as it was before that create."""
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lifecycle = world.start(_spec("train", run_key="job-11"))
    api_root = lifecycle._api_root
    lost_at = time.time() - 500
    run_keys.remember("job-11", api_root, {"creates_lost": 2, "lost_at": lost_at})
    world.platform.fail("create_run", REFUSED)
    assert lifecycle.register_retrying(deadline=_soon(0)) is None
    assert run_keys.lost_creates_until("job-11", api_root) == (2, lost_at + run_keys.LOST_WINDOW_S)


def test_a_rank_refused_a_create_by_its_keys_lost_creates_says_when_one_may_be_tried(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process finding its key's three lost creates sends none and gives up;
    its records wait in its journal until the window after the last lost one
    has passed, and a replay before then is refused the same way. It said
    "for 600 s after the last", never when the last was: the user could not
    tell when a replay would ship. It names the clock time and the wait."""
    import re

    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    spec = _spec("train", run_key="job-9")
    first = world.start(spec)
    world.platform.fail("create_run", LOST, LOST, LOST)
    assert first.register_retrying(deadline=_soon(30)) is None
    second = world.start(spec)
    assert second.register_retrying(deadline=_soon(30)) is None
    said = str(world.failures[-1][1])
    record = run_keys._record("job-9", second._api_root, None)
    assert record is not None
    until = record["lost_at"] + run_keys.LOST_WINDOW_S
    when = time.strftime("%H:%M:%S UTC", time.gmtime(until))
    found = re.search(r"not creating another until (\S+ UTC) \(in (\d+) s", said)
    assert found is not None, said
    assert found[1] == when and 0 <= int(found[2]) <= run_keys.LOST_WINDOW_S
    assert "primeruns replay from then" in said
    for lifecycle in (first, second):
        lifecycle.journal.close()


def test_a_wall_clock_stepped_forward_past_the_window_frees_no_creates_of_a_run_key(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's three creates lost, then the wall clock steps forward 700 s
    (NTP, a VM resumed) on the same boot: the window counted on the wall
    clock had passed, and the next rank sent three more creates into the
    gateway that lost the first three. Counted on the host's boot clock
    (the same boot: its id), the window has not passed: no create is sent."""
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    spec = _spec("train", run_key="job-5")
    first = world.start(spec)
    world.platform.fail("create_run", LOST, LOST, LOST)
    assert first.register_retrying(deadline=_soon(30)) is None
    assert len(world.platform.sent("create_run")) == _MAX_LOST_CREATES
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + run_keys.LOST_WINDOW_S + 100)
    second = world.start(spec)
    assert second.register_retrying(deadline=_soon(30)) is None
    assert len(world.platform.sent("create_run")) == _MAX_LOST_CREATES  # none more
    assert "KeyCreatesSpent" in type(world.failures[-1][1]).__name__
    for lifecycle in (first, second):
        lifecycle.journal.close()


def test_a_run_keys_implausible_count_of_lost_creates_is_quoted_as_its_allowance(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's record counts at most its allowance of lost creates (a process
    finding them spent sends none). A damaged or planted count (the sync
    root is untrusted input) of 10**50 was quoted as is: "up to 10000...
    empty RUNNING runs may remain". It is taken as damaged: the key is still
    refused within the window, and the warning quotes the allowance."""
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lifecycle = world.start(_spec("train", run_key="job-6"))
    record = {"creates_lost": 10**50, "lost_at": time.time()}
    run_keys.remember("job-6", lifecycle._api_root, record)
    assert lifecycle.register_retrying(deadline=_soon(30)) is None
    assert world.platform.sent("create_run") == []
    said = str(world.failures[-1][1])
    assert str(10**50) not in said, said
    assert f"up to {_MAX_LOST_CREATES} empty RUNNING runs" in said, said
    lifecycle.journal.close()


@pytest.mark.parametrize(
    "lost_at",
    [3600.0, 1e12, float("inf")],
    ids=["a clock stepped back an hour", "far in the future", "Infinity"],
)
def test_a_run_key_whose_lost_creates_are_dated_ahead_of_the_clock_is_not_locked_out(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost_at: float
) -> None:
    """A key's lost creates count for ``LOST_WINDOW_S`` after the last, on the
    wall clock: one dated ahead of it (the clock stepped back since, or a
    damaged or planted record: the sync root is untrusted input) counted
    until the clock caught up, an Infinity for good, and every process of
    the key gave up without a create. Dated past the window ahead, no clock
    can have lost it within the window: the key's run is created."""
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lifecycle = world.start(_spec("train", run_key="job-8"))
    record = {"creates_lost": 3, "lost_at": time.time() + lost_at}
    run_keys.remember("job-8", lifecycle._api_root, record)
    bound = lifecycle.register_retrying(deadline=_soon(30))
    assert bound is not None and len(world.platform.sent("create_run")) == 1
    assert world.failures == []


@pytest.mark.parametrize("boot", [False, True], ids=["no boot stamp", "this boot's stamp"])
@pytest.mark.parametrize("date", [float("nan"), 10**400], ids=["NaN", "an int past a float"])
def test_a_run_key_whose_lost_creates_are_dated_nan_is_not_locked_out(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, boot: bool, date: float
) -> None:
    """A key's record dated NaN (JSON reads ``NaN``: a damaged or planted
    record, the sync root is untrusted input) was within the window on every
    reading (NaN compares false), and its refusal's clock time failed to
    format; one dated by an int too large for a float failed to compare.
    Every process of the key failed to register, and none rewrote the
    record: the key was locked out for good. A date no clock can have
    stamped counts no creates: the key's run is created."""
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lifecycle = world.start(_spec("train", run_key="job-9"))
    record: dict[str, object] = {"creates_lost": 3, "lost_at": date}
    if boot:
        record |= {"lost_at_boot": date, "boot_id": run_keys._boot_id()}
    run_keys.remember("job-9", lifecycle._api_root, record)
    bound = lifecycle.register_retrying(deadline=_soon(30))
    assert world.failures == []
    assert bound is not None and len(world.platform.sent("create_run")) == 1
    lifecycle.journal.close()


def test_a_live_run_waiting_for_its_keys_window_creates_after_a_small_wall_clock_step(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's three creates lost on this boot, then the wall clock steps
    forward half a second (NTP's step threshold is an eighth of one): the
    refusal names the stamped end of the window (the clocks disagree by less
    than a second), and the live uplink waited for it on the wall clock, so
    it woke before the window ended on the boot clock, which counts it, was
    refused again and gave up for good: the run was never created, though
    the platform was healthy. It waits on the clock that counts the window."""
    import threading

    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(run_keys, "LOST_WINDOW_S", 2.0)  # a short window, waited whole
    spec = _spec("train", run_key="job-10")
    first = world.start(spec)
    world.platform.fail("create_run", LOST, LOST, LOST)
    assert first.register_retrying(deadline=_soon(30)) is None
    wall = time.time
    monkeypatch.setattr(time, "time", lambda: wall() + 0.5)
    second = world.start(spec)
    failed_before = len(world.failures)
    bound = second.register_retrying(stop=threading.Event())  # live: no deadline
    assert world.failures[failed_before:] == []
    assert bound is not None and len(world.platform.sent("create_run")) == _MAX_LOST_CREATES + 1
    for lifecycle in (first, second):
        lifecycle.journal.close()


def test_a_live_run_waiting_for_its_keys_window_creates_after_a_wall_clock_stepped_back(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's three creates lost on another host (a sync root shared by a
    job's nodes: the window is read on the wall clock), and this host's wall
    clock steps back half a second while its live uplink waits for the
    window: it woke before the window ended on the wall clock, was refused
    again by the same three creates, and gave up for good, though no create
    was sent since. Refused again by the window it waited for, it waits on."""
    import threading

    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(run_keys, "LOST_WINDOW_S", 2.0)  # a short window, waited whole
    lifecycle = world.start(_spec("train", run_key="job-11"))
    record = {"creates_lost": 3, "lost_at": time.time(), "boot_id": "another host's boot"}
    run_keys.remember("job-11", lifecycle._api_root, record)
    wall = time.time

    class SteppedBack(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            monkeypatch.setattr(time, "time", lambda: wall() - 0.5)
            return super().wait(timeout)

    bound = lifecycle.register_retrying(stop=SteppedBack())  # live: no deadline
    assert world.failures == []
    assert bound is not None and len(world.platform.sent("create_run")) == 1
    lifecycle.journal.close()


def test_retrying_an_evaluation_create_after_lost_answers_makes_one_run(world: World) -> None:
    # Its create is found again by its client token: retrying is safe.
    lifecycle = world.start(_spec("eval"))
    world.platform.fail("create", LOST, LOST, LOST)
    bound = lifecycle.register_retrying(deadline=_soon(30))
    assert bound is not None and len(world.registry.evaluations) == 1
    assert world.failures == []


def _soon(seconds: float) -> float:
    import time

    return time.monotonic() + seconds


def test_an_attached_run_is_bound_to_its_id_without_a_request(world: World) -> None:
    bound = world.start(_spec("train", attach_id="rft-launched")).register()
    assert bound.run_id == "rft-launched"
    assert bound.url == "http://platform.test/dashboard/training/rft-launched"
    assert world.platform.calls == []


# -- close-out -------------------------------------------------------------------


def _closed(world: World) -> Any:
    assert world.journal is not None
    return world.journal.get_meta("finalized")


def test_a_completed_training_run_is_finalized_once_and_recorded(world: World) -> None:
    lifecycle = world.start(_spec("train"))
    run_id = lifecycle.register().run_id
    assert lifecycle.finalize("completed", None, {})
    assert world.registry.runs[run_id]["status"] == "COMPLETED"
    assert _closed(world)["status"] == "completed"
    calls = len(world.platform.calls)
    assert world.restart().finalize("completed", None, {})  # a replay: nothing to do
    assert len(world.platform.calls) == calls


@pytest.mark.parametrize(
    "faults",
    [[error(404, "Not Found")], [error(503, "busy")] * 3],
    ids=["finalize-refused", "finalize-unavailable"],
)
def test_when_training_finalize_fails_the_run_is_completed_through_its_status(
    faults: list[httpx.Response], world: World
) -> None:
    lifecycle = world.start(_spec("train"))
    run_id = lifecycle.register().run_id
    world.platform.fail("run_finalize", *faults)
    assert lifecycle.finalize("completed", None, {})
    assert world.platform.calls[-1] == "run_status"
    assert json.loads(world.platform.sent("run_status")[0].content) == {"status": "completed"}
    assert world.registry.runs[run_id]["status"] == "COMPLETED"
    assert _closed(world)["status"] == "completed"


def test_a_close_out_the_platform_did_not_take_is_not_recorded_so_a_replay_retries_it(
    world: World,
) -> None:
    lifecycle = world.start(_spec("train"))
    run_id = lifecycle.register().run_id
    world.platform.fail("run_finalize", error(404, "Not Found"))
    world.platform.fail("run_status", *[error(500, "Internal Server Error")] * 3)
    assert not lifecycle.finalize("completed", None, {})
    assert [what for what, _ in world.failures] == ["finalize"]
    assert _closed(world) is None
    assert world.restart().finalize("completed", None, {})
    assert world.registry.runs[run_id]["status"] == "COMPLETED"


def test_a_crashed_training_run_is_marked_failed_with_its_reason(world: World) -> None:
    lifecycle = world.start(_spec("train"))
    run_id = lifecycle.register().run_id
    assert lifecycle.finalize("crashed", "out of memory", {})
    assert world.platform.calls.count("run_finalize") == 0
    assert world.registry.runs[run_id]["status"] == "FAILED"
    assert world.registry.runs[run_id]["error_message"] == "crashed: out of memory"


def test_an_attached_runs_failure_is_left_to_its_launcher(world: World) -> None:
    lifecycle = world.start(_spec("train", attach_id="rft-launched"))
    assert lifecycle.finalize("failed", "boom", {})
    assert world.platform.calls == []
    assert _closed(world)["status"] == "failed"


def test_a_completed_evaluation_stores_its_config_and_summary_then_is_finalized(
    world: World,
) -> None:
    lifecycle = world.start(_spec(config={"temperature": 0.7}))
    eval_id = lifecycle.register().run_id
    assert lifecycle.finalize("completed", None, {"avg_reward": 0.5})
    assert world.platform.calls[-2:] == ["update", "finalize"]
    evaluation = world.registry.evaluation(eval_id)
    assert evaluation["status"] == "COMPLETED"
    assert evaluation["metrics"] == {"avg_reward": 0.5}
    # The whole metadata is sent: the config beside the run's token.
    assert evaluation["metadata"]["temperature"] == 0.7
    assert world.journal is not None and _token(evaluation) == world.journal.local_id


@pytest.mark.parametrize(
    ("status", "reason", "stored", "message"),
    [
        ("failed", "boom", "FAILED", "boom"),
        ("cancelled", None, "CANCELLED", None),
        ("crashed", "killed", "FAILED", "crashed: killed"),
    ],
)
def test_an_evaluation_that_did_not_complete_is_closed_with_its_status_and_reason(
    status: str, reason: str | None, stored: str, message: str | None, world: World
) -> None:
    lifecycle = world.start(_spec())
    eval_id = lifecycle.register().run_id
    assert lifecycle.finalize(status, reason, {})
    assert "finalize" not in world.platform.calls
    evaluation = world.registry.evaluation(eval_id)
    assert (evaluation["status"], evaluation["error_message"]) == (stored, message)


def test_an_evaluation_closed_already_counts_as_closed_out(world: World) -> None:
    lifecycle = world.start(_spec())
    eval_id = lifecycle.register().run_id
    world.registry.evaluation(eval_id)["status"] = "CANCELLED"  # by someone else
    assert lifecycle.finalize("completed", None, {})
    assert world.platform.calls[-1] == "finalize" and world.failures == []
    assert _closed(world)["status"] == "completed"


def test_a_summary_update_that_fails_does_not_hold_the_close_out_back(world: World) -> None:
    lifecycle = world.start(_spec())
    eval_id = lifecycle.register().run_id
    world.platform.fail("update", *[error(500, "Internal Server Error")] * 3)
    assert lifecycle.finalize("completed", None, {"avg_reward": 0.5})
    assert [what for what, _ in world.failures] == ["update"]
    evaluation = world.registry.evaluation(eval_id)
    assert evaluation["status"] == "COMPLETED" and evaluation["metrics"] == {"avg_reward": 0.5}


class _Clock:
    """A monotonic clock that moves a second each time it is read."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize(
    ("fault", "gives_up_within_s"),
    [
        (REFUSED, UNREACHED_S + 2),  # nothing listens: the short allowance
        (error(503, "unavailable"), None),  # an answer, however bad: the stall rule
    ],
)
def test_a_closing_registration_gives_up_sooner_on_a_platform_it_never_connected_to(
    fault: Fault,
    gives_up_within_s: float | None,
    world: World,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run ended with the platform down from init() on waited the whole
    stall allowance (60 s) for a registration that could not connect; the
    vendor's SDK gave up within about 27 s, keeping nothing. Its records stay
    journaled for replay either way, so a closing run gives a platform it
    never reached UNREACHED_S; one that answers, even with 503s, still gets
    the stall allowance (it may be restarting)."""
    clock = _Clock()
    monkeypatch.setattr("primeruns.ship.lifecycle.time", clock)
    policy = RetryPolicy(base_delay_s=0.0, max_delay_s=0.0, attempts_per_strike=3, stall_s=60.0)
    lifecycle = world.start(_spec())
    lifecycle = Lifecycle(
        lifecycle.journal,
        world.platform.client(),
        policy=policy,
        on_failure=lambda what, exc: world.failures.append((what, exc)),
    )
    world.platform.fail("resolve", *[fault] * 500)
    started = clock.now
    assert lifecycle.register_retrying(deadline=started + 300) is None
    spent = clock.now - started
    if gives_up_within_s is not None:
        assert spent <= gives_up_within_s
    else:
        assert spent >= policy.stall_s
    assert [what for what, _ in world.failures] == ["register"]


class _Time:
    """The lifecycle's ``time``: a monotonic clock that only waits move (a
    request takes no time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Waits(threading.Event):
    """A stop event never set: each retry delay waited on it moves the clock
    on instead of sleeping, and is kept."""

    def __init__(self, clock: _Time) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.clock.sleep(timeout)
        return False


_500 = error(500, "Internal Server Error")


def _after_a_500_at_init(world: World, monkeypatch: pytest.MonkeyPatch) -> tuple[Lifecycle, _Waits]:
    """A run whose create met a 500 at ``init()``, on the default retry
    schedule (0.5 s, doubling), and the waits of its registration."""
    clock = _Time()
    monkeypatch.setattr("primeruns.ship.lifecycle.time", clock)
    first, _ = world.register_failing(_spec(), "create", _500)
    lifecycle = Lifecycle(
        first.journal,
        world.platform.client(),
        policy=RetryPolicy(),
        on_failure=lambda what, exc: world.failures.append((what, exc)),
    )
    return lifecycle, _Waits(clock)


def test_a_closing_registration_meeting_500s_on_one_request_then_another_registers_in_the_grace(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluation ended by SIGTERM (a grace of 20 s) against a platform
    failing a quarter of its requests, whose create met a 500 at init(): a
    registration round is the environment, the lookup of that create, the
    create, each tried once, and here each of eight rounds met one 500, on
    a different request each time. The backoff counted the rounds, reached
    its closing cap (7.5 s) by the sixth, and the grace ran out with the run
    unregistered and none of its 120 episodes shipped (two cells of the
    -m slow matrix). Failures moving from request to request are a flaky
    platform, not one that is down: the schedule starts over each time."""
    lifecycle, waits = _after_a_500_at_init(world, monkeypatch)
    # Rounds failing at the lookup, the create, the environment, in turn.
    world.platform.fail("resolve", PASS, PASS, _500, PASS, PASS, _500, PASS, PASS)
    world.platform.fail("list", _500, PASS, _500, PASS, _500, PASS)
    world.platform.fail("create", _500, _500, _500)
    started = waits.clock.now
    bound = lifecycle.register_retrying(deadline=started + 20.0, stop=waits)
    assert bound is not None, world.failures
    assert len(waits.waits) == 8 and waits.clock.now - started <= 8 * 0.75
    assert [e["id"] for e in world.registry.evaluations] == [bound.run_id]


def _assert_backed_off(waits: _Waits, rounds: int) -> None:
    """Each of ``rounds`` retries waited at least the low end of the default
    schedule's jitter (0.5 s, doubling, up to 30 s)."""
    policy = RetryPolicy()
    assert len(waits.waits) == rounds
    for tried, wait in enumerate(waits.waits):
        assert wait >= 0.5 * min(policy.max_delay_s, policy.base_delay_s * 2**tried)


def test_a_request_failing_round_after_round_still_backs_off(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedule's other half: the create refused round after round (the
    rest of the platform answering) is retried on the growing backoff, not
    at the base delay, so that a struggling platform is not hammered."""
    lifecycle, waits = _after_a_500_at_init(world, monkeypatch)
    world.platform.fail("create", *[_500] * 7)
    assert lifecycle.register_retrying(stop=waits) is not None  # a live run: no deadline
    _assert_backed_off(waits, 7)


def test_a_live_registration_failing_at_two_requests_in_turn_still_backs_off(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live run's registration has no deadline and no stall rule: its
    backoff is all that spares a struggling platform. Failures alternating
    between two requests (the lookup of a create answered 500, then the
    create, round after round: an overloaded platform refusing whichever
    request it cannot take) are retried on the growing backoff, not at the
    base delay for as long as the platform struggles."""
    lifecycle, waits = _after_a_500_at_init(world, monkeypatch)
    world.platform.fail("list", *[_500, PASS] * 6)
    world.platform.fail("create", *[_500] * 6)
    assert lifecycle.register_retrying(stop=waits) is not None  # a live run: no deadline
    _assert_backed_off(waits, 12)


def test_init_s_registration_does_not_wait_past_its_bound_for_a_run_key_held_elsewhere(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run key's lock is held by another process while it registers (its
    uplink retrying a platform that does not answer: minutes). ``init()``'s
    registration, bounded all told, waited on that lock without a bound: a
    job array's ranks of one key stood in init() one after another. It
    gives up at its bound, as for a platform that does not answer (run.url
    None; the uplink registers in the background)."""
    from primeruns.exceptions import is_transient
    from primeruns.ship import run_keys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    lifecycle = world.start(_spec(run_key="job-7"))
    release = threading.Event()
    holding = threading.Event()

    def other_process() -> None:
        with run_keys.held("job-7", lifecycle._api_root):
            holding.set()
            release.wait()

    holder = threading.Thread(target=other_process, daemon=True)
    holder.start()
    holding.wait()
    outcome: list[BaseException | None] = []

    def init_s_registration() -> None:
        try:
            lifecycle.register(attempts=2, within=0.2)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=init_s_registration, daemon=True)
    caller.start()
    caller.join(timeout=30)  # a hang, not a duration: it waits until released
    still_waiting = caller.is_alive()
    release.set()
    holder.join()
    caller.join()
    assert not still_waiting
    assert outcome and outcome[0] is not None and is_transient(outcome[0]), outcome
    assert world.platform.calls == []  # nothing created while another may be creating it


def test_the_lookup_reads_smaller_pages_where_a_page_is_past_the_answer_bound(
    world: World,
) -> None:
    # Evaluations of large configs: a page of them is past the 16 MiB an
    # answer is read to, and every retry of it was. The page is halved until
    # it fits, the look goes on with it, and an evaluation past the bound by
    # itself is passed over rather than end the look.
    lifecycle, _ = world.register_failing(_spec(), "create", LOST)
    [made] = world.registry.evaluations
    for i in range(7):
        size = (17 << 20) if i == 3 else (3 << 20)  # the fourth newest alone is too large
        config = {"blob": "x" * size, "prime_runs": {"client_token": f"other-{i}"}}
        world.registry.add_evaluation({"team_id": "team-a", "dataset": "gsm8k", "metadata": config})

    assert lifecycle.register().run_id == made["id"]
    assert world.platform.calls.count("create") == 1
    pages = [(p["skip"], p["limit"]) for p in (r.url.params for r in world.platform.sent("list"))]
    assert pages == [
        *[("0", size) for size in ("50", "25", "12", "6", "3")],  # 8 of 38 MB, ..., 3 of 9 MB
        ("3", "3"),  # the one of 17 MB among them
        ("3", "1"),  # alone: passed over
        *[(at, "1") for at in ("4", "5", "6", "7")],  # made is the oldest
    ]


def test_a_training_create_whose_process_died_waiting_is_counted_by_the_next_one(
    world: World, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process that sent the create died before its answer came (no
    # failure was ever seen): the run it may have made is counted all the
    # same. A create refused as a whole made none and is not counted.
    lifecycle = world.start(_spec("train"))
    world.platform.fail("create_run", error(503, "refused"))
    with pytest.raises(RetryableAPIError):
        lifecycle.register(attempts=1)
    assert not lifecycle.journal.get_meta(K_CREATES_LOST)
    real = lifecycle.client.api

    def dies(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if path.startswith("/rft/external-runs"):
            real(method, path, *args, **kwargs)  # it lands; the process dies waiting
            raise SystemExit("killed")
        return real(method, path, *args, **kwargs)

    monkeypatch.setattr(lifecycle.client, "api", dies)
    with pytest.raises(SystemExit):
        lifecycle.register(attempts=1)
    monkeypatch.setattr(lifecycle.client, "api", real)
    with caplog.at_level(logging.WARNING, logger="primeruns.lifecycle"):
        lifecycle.register()
    assert "up to 1 empty RUNNING runs named 'rl-test' may remain" in caplog.text
    assert len(world.registry.runs) == 2
    assert lifecycle.journal.get_meta(K_CREATES_LOST) == 1  # the earlier one, not this


def _read_back_as(world: World, metrics: Any) -> None:
    """The evaluation read back (``GET``) with its ``metrics`` as ``metrics``."""

    def read(_: httpx.Request, params: dict[str, str]) -> httpx.Response:
        evaluation = world.registry.evaluation(params["id"])
        return httpx.Response(200, json={**evaluation, "metrics": metrics})

    world.platform.route("read", "GET", _EVAL, read)


@pytest.mark.parametrize(
    "metrics",
    [
        json.dumps({"avg_reward": 0.25}),  # an earlier summary, kept as JSON text
        "not json",
        [{"avg_reward": 0.5}],
        0.5,
    ],
    ids=["earlier-text", "text", "list", "number"],
)
def test_a_swallowed_summary_read_back_as_no_object_is_not_taken_as_landed(
    metrics: Any, world: World
) -> None:
    # Found by an adversarial review: a field read back as anything but an
    # object was skipped, so an update a gateway answered with an empty 200
    # (never forwarded) was taken as landed and the summary silently lost.
    lifecycle = world.start(_spec())
    lifecycle.register()
    _read_back_as(world, metrics)
    world.platform.fail("update", *[httpx.Response(200)] * 3)  # swallowed
    assert lifecycle.finalize("failed", "boom", {"avg_reward": 0.5})
    assert [what for what, _ in world.failures] == ["update"]


def test_a_summary_read_back_as_json_text_of_it_is_taken_as_landed(world: World) -> None:
    # A store keeping the object as JSON text still shows it: taken, not sent again.
    lifecycle = world.start(_spec())
    lifecycle.register()
    _read_back_as(world, json.dumps({"avg_reward": 0.5}))
    world.platform.fail("update", httpx.Response(200))
    assert lifecycle.finalize("failed", "boom", {"avg_reward": 0.5})
    assert world.failures == [] and world.platform.calls.count("update") == 2
