"""A receipt is proof (#28): each sink, through ``httpx.MockTransport``, given
the answers a gateway or a maintenance page gives (200 with an empty body,
``{}``, HTML, JSON cut short, another upload's receipt), processed or not.

What a user depends on: a record counts as stored only when the platform
proved it stored; an answer that proves nothing is a transient, ambiguous
failure (the sink stays on and resends, replay-safe); what the contract lets a
real platform answer (an empty body on the samples and metrics endpoints)
still succeeds, once the rows are found; a 413 halves the batch in every sink
down to one record, which then fails alone with the reason.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import workloads
from scripted_platform import Batch, ScriptedPlatform, entries_of

from primeruns.exceptions import UnprovenAnswerError
from primeruns.journal import EntryKind, Journal
from primeruns.ship.lifecycle import Lifecycle
from primeruns.ship.policy import Failure, RetryPolicy, classify
from primeruns.ship.shipper import Shipper
from primeruns.sinks.base import Binding
from primeruns.sinks.eval_samples import EvalSamplesSink
from primeruns.sinks.traces import TracesSink
from primeruns.sinks.train_metrics import TrainMetricsSink
from primeruns.sinks.train_samples import TrainSamplesSink
from primeruns.spec import SPEC_KEY, RunSpec, SpecEnvironment

_EVAL = Binding(run_id="eval-1", kind="eval")
_TRAIN = Binding(run_id="rft-1", kind="train")
_FAST = RetryPolicy(base_delay_s=0.001, max_delay_s=0.01, attempts_per_strike=3)

# What a gateway or a maintenance page answers with a 200.
_BOGUS = {
    "empty": httpx.Response(200),
    "{}": httpx.Response(200, json={}),
    "html": httpx.Response(200, text="<html><body>Down for maintenance</body></html>"),
    "truncated": httpx.Response(200, text='{"status": "comm'),
}


def _bogus(kind: str) -> httpx.Response:
    """A fresh copy (a response's body is read once)."""
    original = _BOGUS[kind]
    return httpx.Response(200, content=original.content, headers=original.headers)


def _unproven(exc: BaseException) -> None:
    """What the shipper sees: a transient failure (the sink stays on, the
    batch is resent), never a stored batch, never a fatal one."""
    assert isinstance(exc, UnprovenAnswerError), exc
    assert classify(exc) is Failure.TRANSIENT


# -- Prime Traces -----------------------------------------------------------------


class TracesService:
    """Commits each key once; answers with its receipt (or what the test says)."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.stored: list[str] = []
        self.keys: set[str] = set()
        self.answer: list[httpx.Response] = []  # the next answers, once each
        self.process = True  # whether an answer from ``answer`` follows a commit
        platform.route("upload", "POST", "/api/v1/traces", self.upload)

    def upload(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        if self.answer and not self.process:
            return self.answer.pop(0)
        if key not in self.keys:
            self.keys.add(key)
            self.stored.append(key)
        if self.answer:
            return self.answer.pop(0)
        digest = key.removeprefix("sha256:")
        return httpx.Response(201, json={"upload_id": digest, "status": "committed"})


@pytest.mark.parametrize("processed", [True, False], ids=["processed", "never-forwarded"])
@pytest.mark.parametrize("kind", [*_BOGUS, "another-upload"])
def test_traces_counts_only_its_own_committed_receipt(kind: str, processed: bool) -> None:
    platform = ScriptedPlatform()
    service = TracesService(platform)
    sink = TracesSink(platform.client(), context={})
    batch = Batch.prepare(sink, entries_of(EntryKind.EPISODE, workloads.gsm8k(3)), _EVAL)
    other = httpx.Response(201, json={"upload_id": "0" * 64, "status": "committed"})
    service.answer.append(other if kind == "another-upload" else _bogus(kind))
    service.process = processed
    with pytest.raises(Exception) as raised:
        batch.send(sink)
    _unproven(raised.value)
    assert sink.committed == 0
    batch.send(sink)  # the same bytes again: the service's replay answers
    assert sink.committed == 1 and len(service.stored) == 1


# -- the evaluation sample table ------------------------------------------------


class SampleTable:
    """Appends whatever is pushed (as the platform: no deduplication)."""

    def __init__(self, platform: ScriptedPlatform, *, limit: int = 0) -> None:
        self.rows: list[dict[str, Any]] = []
        self.limit = limit  # a proxy's request size limit (0: none)
        self.answers: list[tuple[httpx.Response, bool]] = []  # (answer, processed first)
        self.page_answers: list[httpx.Response] = []
        platform.route("push", "POST", r"/api/v1/evaluations/[^/]+/samples", self.push)
        platform.route("read", "GET", r"/api/v1/evaluations/[^/]+/samples", self.read)

    def push(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        if self.limit and len(request.content) > self.limit:
            return httpx.Response(413, text="<html><h1>413 Request Entity Too Large</h1></html>")
        answer, processed = self.answers.pop(0) if self.answers else (None, True)
        samples = json.loads(request.content)["samples"]
        if processed:
            self.rows.extend(samples)
        if answer is not None:
            return answer
        return httpx.Response(
            200, json={"evaluation_id": "eval-1", "inserted": len(samples), "total": len(self.rows)}
        )

    def read(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        if self.page_answers:
            return self.page_answers.pop(0)
        page, limit = int(request.url.params["page"]), int(request.url.params["limit"])
        rows = self.rows[(page - 1) * limit : page * limit]
        return httpx.Response(200, json={"samples": rows, "total": len(self.rows)})

    def ids(self) -> Counter[str]:
        return Counter(str(row["sample_id"]) for row in self.rows)


def _eval_batch(platform: ScriptedPlatform, n: int = 3) -> tuple[EvalSamplesSink, Batch]:
    sink = EvalSamplesSink(platform.client())
    return sink, Batch.prepare(sink, entries_of(EntryKind.EPISODE, workloads.gsm8k(n)), _EVAL)


@pytest.mark.parametrize("kind", list(_BOGUS))
def test_eval_samples_a_bogus_200_for_a_push_never_forwarded_is_resent(kind: str) -> None:
    platform = ScriptedPlatform()
    table = SampleTable(platform)
    sink, batch = _eval_batch(platform)
    table.answers.append((_bogus(kind), False))
    with pytest.raises(Exception) as raised:
        batch.send(sink)
    _unproven(raised.value)
    assert table.rows == []
    batch.send(sink)
    assert list(table.ids().values()) == [1, 1, 1]


@pytest.mark.parametrize("kind", list(_BOGUS))
def test_eval_samples_a_bogus_200_for_a_stored_push_is_never_sent_twice(kind: str) -> None:
    platform = ScriptedPlatform()
    table = SampleTable(platform)
    sink, batch = _eval_batch(platform)
    table.answers.append((_bogus(kind), True))
    try:
        batch.send(sink)  # a silent answer: found by reading back
    except UnprovenAnswerError:
        batch.send(sink)  # no answer at all: looked for before it is sent again
    assert list(table.ids().values()) == [1, 1, 1]
    assert platform.calls.count("push") == 1


def test_eval_samples_an_answer_whose_count_is_a_boolean_is_no_proof() -> None:
    # ``inserted: true`` for a push of one row: Python's True == 1 made it
    # the count, so a push the platform never stored was taken as stored.
    platform = ScriptedPlatform()
    table = SampleTable(platform)
    sink, batch = _eval_batch(platform, 1)
    said = httpx.Response(200, json={"evaluation_id": "eval-1", "inserted": True})
    table.answers.append((said, False))
    with pytest.raises(Exception) as raised:
        batch.send(sink)
    _unproven(raised.value)
    batch.send(sink)
    assert list(table.ids().values()) == [1]


def test_eval_samples_a_platform_that_answers_with_an_empty_body_succeeds() -> None:
    # The contract lets the platform answer a push with any JSON object or
    # nothing: that platform's successes must not be retried forever.
    platform = ScriptedPlatform()
    table = SampleTable(platform)
    sink, batch = _eval_batch(platform)
    table.answers.append((httpx.Response(200), True))
    batch.send(sink)
    assert list(table.ids().values()) == [1, 1, 1]


def test_eval_samples_a_read_back_answered_by_a_gateway_is_no_proof_either_way() -> None:
    # The push was stored, its answer lost; the read-back meets a gateway's {}:
    # "0 rows" would send the rows a second time.
    platform = ScriptedPlatform()
    table = SampleTable(platform)
    sink, batch = _eval_batch(platform)
    table.answers.append((_bogus("empty"), True))
    table.page_answers.append(httpx.Response(200, json={}))
    with pytest.raises(Exception) as raised:
        batch.send(sink)
    _unproven(raised.value)
    batch.send(sink)
    assert list(table.ids().values()) == [1, 1, 1]


# -- training metrics -------------------------------------------------------------


class MetricsTable:
    """One row per (run, step); a read filtered by step, as the CLI's."""

    def __init__(self, platform: ScriptedPlatform, *, readable: bool = True) -> None:
        self.rows: dict[int, dict[str, Any]] = {}
        self.posts = 0
        self.answers: list[tuple[httpx.Response, bool]] = []
        platform.route("metrics", "POST", "/api/v1/rft/metrics", self.post)
        if readable:
            platform.route("read", "GET", r"/api/v1/rft/runs/[^/]+/metrics", self.read)

    def post(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        self.posts += 1
        body = json.loads(request.content)
        answer, processed = self.answers.pop(0) if self.answers else (None, True)
        if processed:
            self.rows[body["metrics"]["step"]] = body["metrics"]
        if answer is not None:
            return answer
        step = body["metrics"]["step"]
        return httpx.Response(200, json={"run_id": body["run_id"], "step": step, "status": "ok"})

    def read(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        low, high = int(request.url.params["min_step"]), int(request.url.params["max_step"])
        rows = [row for step, row in sorted(self.rows.items()) if low <= step <= high]
        return httpx.Response(200, json={"metrics": rows})


def _metrics_batch(platform: ScriptedPlatform) -> tuple[TrainMetricsSink, Batch]:
    sink = TrainMetricsSink(platform.client())
    rows = [{"loss": 1.0 / (s + 1), "step": s, "_timestamp": 1.0} for s in range(3)]
    return sink, Batch.prepare(sink, entries_of(EntryKind.METRICS, rows), _TRAIN)


@pytest.mark.parametrize("kind", list(_BOGUS))
def test_metrics_a_bogus_200_for_a_row_never_forwarded_is_resent(kind: str) -> None:
    platform = ScriptedPlatform()
    table = MetricsTable(platform)
    sink, batch = _metrics_batch(platform)
    proven = httpx.Response(200, json={"run_id": "rft-1", "step": 0, "status": "ok"})
    table.answers += [(proven, True), (_bogus(kind), False)]
    with pytest.raises(Exception) as raised:
        batch.send(sink)  # row 0 proven, row 1 not
    _unproven(raised.value)
    assert sorted(table.rows) == [0] and batch.progress.done == 1
    batch.send(sink)
    assert sorted(table.rows) == [0, 1, 2]


@pytest.mark.parametrize("readable", [True, False], ids=["read-back", "no-read-endpoint"])
def test_metrics_a_platform_that_answers_with_an_empty_body_succeeds(readable: bool) -> None:
    platform = ScriptedPlatform()
    table = MetricsTable(platform, readable=readable)
    sink, batch = _metrics_batch(platform)
    table.answers += [(httpx.Response(200), True)] * 3
    batch.send(sink)
    assert sorted(table.rows) == [0, 1, 2] and table.posts == 3


# -- the training sample table ------------------------------------------------------


@pytest.mark.parametrize("kind", list(_BOGUS))
def test_train_samples_a_presign_without_url_and_key_is_transient(kind: str) -> None:
    # Was a record rejection (ValueError): the step's samples counted as lost
    # for a gateway's answer to a request that mints a URL.
    platform = ScriptedPlatform()
    platform.route("presign", "POST", "/api/v1/rft/samples/presign", lambda *_: _bogus(kind))
    sink = TrainSamplesSink(platform.client())
    entries = entries_of(EntryKind.EPISODE, workloads.agentic_by_step(3)[0])
    batch = Batch.prepare(sink, entries, _TRAIN)
    with pytest.raises(Exception) as raised:
        batch.send(sink)
    _unproven(raised.value)
    assert batch.progress.key is None


# -- registration -----------------------------------------------------------------


class Evaluations:
    """Create and list evaluations; the test scripts the answers."""

    def __init__(self, platform: ScriptedPlatform) -> None:
        self.created: list[dict[str, Any]] = []
        self.create_answers: list[tuple[httpx.Response, bool]] = []
        self.list_answers: list[httpx.Response] = []
        platform.route("create", "POST", "/api/v1/evaluations/", self.create)
        platform.route("list", "GET", "/api/v1/evaluations/", self.listing)

    def create(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        answer, processed = self.create_answers.pop(0) if self.create_answers else (None, True)
        body = json.loads(request.content)
        made = {**body, "evaluation_id": f"eval-{len(self.created) + 1}"}
        if processed:
            self.created.append(made)
        return answer if answer is not None else httpx.Response(201, json=made)

    def listing(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        if self.list_answers:
            return self.list_answers.pop(0)
        return httpx.Response(200, json={"evaluations": self.created, "total": len(self.created)})


def _lifecycle(tmp_path: Path, platform: ScriptedPlatform) -> tuple[Lifecycle, list[str]]:
    journal = Journal.create(tmp_path / "runs")
    spec = RunSpec(
        kind="eval",
        name="receipts",
        model="m",
        environments=(SpecEnvironment(id="env-1"),),
        frontend_url="http://app.test",
    )
    journal.set_meta(SPEC_KEY, spec.to_json())
    failures: list[str] = []
    lifecycle = Lifecycle(
        journal, platform.client(), policy=_FAST, on_failure=lambda w, e: failures.append(str(e))
    )
    return lifecycle, failures


@pytest.mark.parametrize("processed", [True, False], ids=["created", "never-forwarded"])
@pytest.mark.parametrize("kind", list(_BOGUS))
def test_a_create_answered_without_its_id_makes_exactly_one_evaluation(
    tmp_path: Path, kind: str, processed: bool
) -> None:
    platform = ScriptedPlatform()
    evals = Evaluations(platform)
    evals.create_answers.append((_bogus(kind), processed))
    lifecycle, failures = _lifecycle(tmp_path, platform)
    binding = lifecycle.register_retrying(deadline=time.monotonic() + 30)
    assert binding is not None, failures
    assert [e["evaluation_id"] for e in evals.created] == [binding.run_id]
    lifecycle.journal.close()


def test_a_lookup_answered_with_nothing_does_not_create_a_second_evaluation(
    tmp_path: Path,
) -> None:
    platform = ScriptedPlatform()
    evals = Evaluations(platform)
    evals.create_answers.append((_bogus("{}"), True))  # created, its answer a gateway's
    evals.list_answers.append(httpx.Response(200, json={}))  # and so the lookup's
    lifecycle, failures = _lifecycle(tmp_path, platform)
    binding = lifecycle.register_retrying(deadline=time.monotonic() + 30)
    assert binding is not None, failures
    assert [e["evaluation_id"] for e in evals.created] == [binding.run_id]
    lifecycle.journal.close()


# -- a 413 halves the batch, in every sink --------------------------------------------


def _ship_eval(tmp_path: Path, episodes: list[dict[str, Any]], limit: int) -> Any:
    journal = Journal.create(tmp_path / f"runs-{limit}")
    journal.append(EntryKind.EPISODE, [orjson.dumps(e) for e in episodes])
    platform = ScriptedPlatform()
    table = SampleTable(platform, limit=limit)
    failures: list[str] = []
    shipper = Shipper(
        journal,
        EvalSamplesSink(platform.client()),
        binding=lambda: _EVAL,
        training=False,
        policy=_FAST,
        on_failure=lambda what, exc: failures.append(f"{what}: {exc}"),
    )
    shipper.start()
    try:
        assert shipper.drain(journal.last_seq(), deadline=time.monotonic() + 60)
    finally:
        shipper.stop(timeout=10)
    losses = journal.losses().get("eval_samples", {})
    journal.close()
    return table, losses, failures, shipper.state


def test_a_413_halves_a_sample_batch_until_it_fits_and_the_one_too_large_fails_alone(
    tmp_path: Path,
) -> None:
    episodes = workloads.gsm8k(21)
    huge = episodes[10]
    huge["padding"] = "x" * 200_000  # over the limit alone: its row cannot be sent
    plain, _, _, _ = _ship_eval(tmp_path, workloads.gsm8k(21), 0)
    table, losses, failures, state = _ship_eval(tmp_path, episodes, 60_000)
    assert state.active and state.retired_reason is None
    expected = plain.ids()
    del expected[str(huge["id"])]
    assert table.ids() == expected  # every other episode once, in its request
    assert losses["count"] == 1 and "413" in losses["reasons"][0]
    assert len(failures) == 1
    # Numbered as without the limit: the halved batches are numbered afresh
    # from where the refused one began, not after it.
    numbering = {row["sample_id"]: row["rollout_number"] for row in plain.rows}
    assert all(row["rollout_number"] == numbering[row["sample_id"]] for row in table.rows)
