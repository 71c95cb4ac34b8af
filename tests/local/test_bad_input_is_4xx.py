"""A client's bad input is its 4xx on every route that stores, never a 500, over loopback.

A 500 ends a kept-alive connection, and the SDKs retry a 5xx: a body answered
500 for what it holds is sent again and again, though it can never be
stored. And a value stored that JSON cannot answer (NaN, Infinity) made every
later read of it a 500, the list of all runs or evaluations included. Each
body here held what SQLite cannot bind (a lone surrogate, an integer past 64
bits, a list) or JSON cannot answer, in a field a route stores; each is
refused (the platform's 422 ``{"detail"}``, the traces service's 400
envelope) with nothing stored, and the reads go on answering. Rows an
earlier version stored with NaN read back with null there.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from local_helpers import plant, served, stored_totals

from primeruns.local import LocalPlatform

KEY = "bad-input-key"
SURROGATE = '"\\ud800"'
BIG = str(2**64)
RFT, INTERNAL, EVALS = "/api/v1/rft", "/api/internal/rft", "/api/v1/evaluations"
RUN_BODY = '"base_model":"m","team_id":"t","max_steps":1'

#: (method, path, body): ``{run}`` and ``{eval}`` are a fresh run's and
#: evaluation's ids. Each was answered 500 on main (or stored, and its reads 500).
REFUSED_422 = {
    "run-name-surrogate": ("POST", f"{RFT}/external-runs", f'{{{RUN_BODY},"name":{SURROGATE}}}'),
    "run-config-nan": ("POST", f"{RFT}/external-runs", f'{{{RUN_BODY},"run_config":{{"lr":NaN}}}}'),
    "run-config-1e400": (
        "POST",
        f"{RFT}/external-runs",
        f'{{{RUN_BODY},"run_config":{{"lr":1e400}}}}',
    ),
    "run-env-surrogate": (
        "POST",
        f"{RFT}/external-runs",
        f'{{{RUN_BODY},"environments":[{{"id":{SURROGATE}}}]}}',
    ),
    "run-other-infinity": ("POST", f"{RFT}/external-runs", f'{{{RUN_BODY},"note":Infinity}}'),
    "status-message-surrogate": (
        "PUT",
        f"{RFT}/external-runs/{{run}}/status",
        f'{{"status":"failed","error_message":{SURROGATE}}}',
    ),
    "finalize-run-surrogate": ("POST", f"{RFT}/finalize", f'{{"run_id":{SURROGATE}}}'),
    "internal-finalize-run-surrogate": (
        "POST",
        f"{INTERNAL}/finalize",
        f'{{"run_id":{SURROGATE}}}',
    ),
    "presign-step-past-64-bits": (
        "POST",
        f"{RFT}/samples/presign",
        f'{{"run_id":"{{run}}","step":{BIG}}}',
    ),
    "internal-presign-step-past-64-bits": (
        "POST",
        f"{INTERNAL}/samples/presign",
        f'{{"run_id":"{{run}}","step":{BIG}}}',
    ),
    "presign-run-surrogate": (
        "POST",
        f"{RFT}/samples/presign",
        f'{{"run_id":{SURROGATE},"step":1}}',
    ),
    "confirm-key-surrogate": (
        "POST",
        f"{RFT}/samples/confirm",
        f'{{"run_id":"{{run}}","step":1,"s3_key":{SURROGATE}}}',
    ),
    "eval-name-surrogate": ("POST", f"{EVALS}/", f'{{"run_id":"r","name":{SURROGATE}}}'),
    "eval-metadata-nan": ("POST", f"{EVALS}/", '{"run_id":"r","metadata":{"t":NaN}}'),
    "eval-team-past-64-bits": ("POST", f"{EVALS}/", f'{{"run_id":"r","team_id":{BIG}}}'),
    "eval-team-a-list": ("POST", f"{EVALS}/", '{"run_id":"r","team_id":["t"]}'),
    "eval-update-metrics-nan": ("PUT", f"{EVALS}/{{eval}}", '{"metrics":{"acc":NaN}}'),
    "eval-update-name-surrogate": ("PUT", f"{EVALS}/{{eval}}", f'{{"name":{SURROGATE}}}'),
    "eval-finalize-metrics-infinity": (
        "POST",
        f"{EVALS}/{{eval}}/finalize",
        '{"metrics":{"acc":-Infinity}}',
    ),
    "samples-surrogate": (
        "POST",
        f"{EVALS}/{{eval}}/samples",
        f'{{"samples":[{{"sample_id":"s1"}},{{"sample_id":{SURROGATE}}}]}}',
    ),
    "samples-reward-nan": (
        "POST",
        f"{EVALS}/{{eval}}/samples",
        '{"samples":[{"sample_id":"s1","reward":NaN}]}',
    ),
    "hub-lookup-surrogate": ("POST", "/api/v1/environmentshub/lookup", f'{{"id":{SURROGATE}}}'),
    "faults-latency-infinity": ("POST", "/_local/faults", '{"latency_ms":Infinity}'),
}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    with LocalPlatform(tmp_path_factory.mktemp("bad-input"), api_key=KEY) as p:
        yield p


@pytest.fixture
def api(platform: LocalPlatform) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=platform.url, headers=headers, timeout=10) as client:
        yield client


def _ids(api: httpx.Client) -> dict[str, str]:
    run = api.post(f"{RFT}/external-runs", content=f"{{{RUN_BODY}}}").json()["run"]["id"]
    evaluation = api.post(f"{EVALS}/", content='{"run_id":"r"}').json()["evaluation_id"]
    return {"run": run, "eval": evaluation}


@pytest.mark.parametrize("case", list(REFUSED_422))
def test_a_body_the_platform_cannot_store_or_answer_is_a_422(api: httpx.Client, case: str) -> None:
    method, path, body = REFUSED_422[case]
    ids = _ids(api)
    before = stored_totals(api)
    samples = api.get(f"{EVALS}/{ids['eval']}/samples").json()["total"]
    r = api.request(method, path.format(**ids), content=body.replace("{run}", ids["run"]))
    assert r.status_code == 422, (case, r.status_code, r.text)
    assert isinstance(r.json()["detail"], str)
    # Nothing stored, and what is stored reads back.
    assert stored_totals(api) == before
    evaluation = api.get(f"{EVALS}/{ids['eval']}")
    assert evaluation.status_code == 200, evaluation.text
    assert evaluation.json()["status"] == "RUNNING" and evaluation.json()["metrics"] == {}
    assert api.get(f"{EVALS}/{ids['eval']}/samples").json()["total"] == samples
    run = api.get(f"{RFT}/runs/{ids['run']}")
    assert run.status_code == 200 and run.json()["run"]["status"] == "RUNNING", run.text


def test_the_refusals_name_what_is_wrong(api: httpx.Client) -> None:
    ids = _ids(api)
    for body, detail in [
        (f'{{{RUN_BODY},"name":{SURROGATE}}}', "lone surrogate"),
        (f'{{{RUN_BODY},"run_config":{{"lr":NaN}}}}', "NaN or infinite"),
    ]:
        r = api.post(f"{RFT}/external-runs", content=body)
        assert detail in r.json()["detail"], r.text
    r = api.post(f"{RFT}/samples/presign", content=f'{{"run_id":"{ids["run"]}","step":{BIG}}}')
    assert r.json() == {"detail": "Field 'step' must be a 64-bit integer"}
    # The bounds themselves are taken (a step at 2**63 - 1 is presigned).
    r = api.post(f"{RFT}/samples/presign", json={"run_id": ids["run"], "step": 2**63 - 1})
    assert r.status_code == 200, r.text


def _upload(
    url: str, lines: bytes, *, episodes: bool = False, metadata: bytes | None = None
) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {KEY}",
        "Idempotency-Key": "sha256:" + hashlib.sha256(lines).hexdigest(),
    }
    if episodes:
        headers["X-Prime-Line-Format"] = "episode"
    files = {
        "metadata": (None, metadata or b'{"schema_version":1}', "application/json"),
        "traces": (
            "t.jsonl",
            gzip.compress(lines, mtime=0),
            "application/x-ndjson",
            {"Content-Encoding": "gzip"},
        ),
    }
    return httpx.post(f"{url}/api/v1/traces", headers=headers, files=files, timeout=30)


def _trace(**fields: object) -> dict[str, object]:
    start = time.time() - 60
    doc: dict[str, object] = {
        "id": uuid.uuid4().hex,
        "run": {"id": "bad-input-run", "type": "eval"},
        "timing": {"start": start, "scoring": {"start": start, "end": start + 1}},
    }
    doc.update(fields)
    return doc


def _line(doc: dict[str, object], raw: str) -> bytes:
    """``doc`` as a JSON line, the string ``"@"`` replaced by ``raw``."""
    return json.dumps(doc).replace('"@"', raw).encode() + b"\n"


@pytest.mark.parametrize(
    ("lines", "episodes", "code"),
    [
        (_line(_trace(id="@"), SURROGATE), False, "invalid_trace"),
        (_line(_trace(stop_condition="@"), SURROGATE), False, "invalid_trace"),
        (
            _line({"id": "e", "env": {"id": "@"}, "traces": [_trace()]}, SURROGATE),
            True,
            "invalid_trace",
        ),
        (
            _line({"id": "e", "traces": [_trace(note="@")]}, SURROGATE),
            True,
            "invalid_trace",
        ),
        (
            _line({"id": "e", "traces": [_trace(note="@")]}, "1e400"),
            True,
            "invalid_trace",
        ),
    ],
    ids=["trace-id", "trace-column", "episode-env", "member-trace", "member-1e400"],
)
def test_a_traces_line_the_service_cannot_store_is_its_400(
    platform: LocalPlatform, lines: bytes, episodes: bool, code: str
) -> None:
    r = _upload(platform.url, lines, episodes=episodes)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code


def test_a_traces_context_holding_a_lone_surrogate_is_invalid_metadata(
    platform: LocalPlatform,
) -> None:
    lines = json.dumps(_trace()).encode() + b"\n"
    r = _upload(platform.url, lines, metadata=b'{"schema_version":1,"context":{"k":"\\udfff"}}')
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_metadata"


@pytest.mark.parametrize(
    "fields",
    [
        {"num_total_tokens": 2**64},
        {"timing": {"start": time.time() - 60, "scoring": {"end": 1e308}}},
        {"rewards": {"a": {"score": 1e308, "weight": 10.0}}},
    ],
    ids=["tokens-past-64-bits", "an-end-past-64-bits", "a-reward-past-the-floats"],
)
def test_a_trace_whose_indexed_number_is_past_64_bits_is_stored_whole(
    platform: LocalPlatform, fields: dict[str, object]
) -> None:
    """Its column cannot hold it (a 500 for every upload holding it, or for
    every read of the run's traces after it, the runs' list included): none
    is indexed, and the trace is stored as sent."""
    doc = _trace(**fields)
    r = _upload(platform.url, json.dumps(doc).encode() + b"\n")
    assert r.status_code == 201, r.text
    stored = httpx.get(
        f"{platform.url}/api/v1/traces/{doc['id']}", headers={"Authorization": f"Bearer {KEY}"}
    )
    assert stored.status_code == 200, stored.text
    raw = httpx.get(
        f"{platform.url}/api/v1/traces/{doc['id']}",
        params={"raw": "true"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert json.loads(raw.content) == doc
    runs = httpx.get(f"{platform.url}/api/v1/runs", headers={"Authorization": f"Bearer {KEY}"})
    assert runs.status_code == 200, runs.text


def test_rows_an_earlier_version_stored_with_nan_read_back_as_null(tmp_path: Path) -> None:
    """A data folder written before these routes refused NaN may hold it in
    a run's request, an evaluation's config, summary or samples: every read
    of them was a 500, the lists of all runs and evaluations included."""

    def insert(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES ('rft_old', 'old', 't', 'RUNNING', ?, 0, 0)",
            ('{"base_model":"m","run_config":{"lr":NaN,"wd":Infinity}}',),
        )
        conn.execute(
            "INSERT INTO evaluations (id, name, status, request, metadata, metrics, team_id,"
            " created_at, updated_at) VALUES ('eval_old', 'old', 'RUNNING', ?, ?, ?, NULL, 0, 0)",
            ('{"run_id":"r","note":NaN}', '{"t":-Infinity}', '{"acc":NaN,"n":2}'),
        )
        conn.execute(
            "INSERT INTO eval_samples (eval_id, sample_id, body) VALUES ('eval_old', 's', ?)",
            ('{"sample_id":"s","reward":NaN}',),
        )

    with served(plant(tmp_path / "data", insert), KEY) as api:
        answers = {
            path: api.get(path)
            for path in (
                f"{RFT}/runs",
                f"{RFT}/runs/rft_old",
                f"{EVALS}/",
                f"{EVALS}/eval_old",
                f"{EVALS}/eval_old/samples",
                "/_local/runs/eval_old",
                "/_local/runs/rft_old",
            )
        }
        finalized = api.post(f"{EVALS}/eval_old/finalize", json={"metrics": {"f1": 0.5}})
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text)
    assert answers[f"{RFT}/runs/rft_old"].json()["run"]["runConfig"] == {"lr": None, "wd": None}
    evaluation = answers[f"{EVALS}/eval_old"].json()
    assert evaluation["metadata"] == {"t": None}
    assert evaluation["metrics"] == {"acc": None, "n": 2}
    assert answers[f"{EVALS}/eval_old/samples"].json()["samples"] == [
        {"sample_id": "s", "reward": None}
    ]
    assert finalized.status_code == 200, finalized.text
