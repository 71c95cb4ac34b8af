"""A metrics row the platform cannot store is the client's error, over loopback.

``POST /rft/metrics`` is one request a row, and a client retries a 5xx: a row
answered 500 for what it holds is sent again and again (the platform's own
rule, ``queries.py``: it must not 500 on input). Each row here is answered
422 with nothing stored, and the run's rows read back whole after it; rows
an earlier version stored that JSON cannot answer read back too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from primeruns.local import LocalPlatform
from primeruns.local.storage import Database

KEY = "metrics-row-key"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with (
        LocalPlatform(tmp_path_factory.mktemp("rows"), api_key=KEY) as platform,
        httpx.Client(
            base_url=f"{platform.url}/api/v1/rft",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        ) as client,
    ):
        yield client


def _run(api: httpx.Client) -> str:
    body = {"base_model": "m", "team_id": "t", "max_steps": 1, "environments": []}
    run_id: str = api.post("/external-runs", json=body).json()["run"]["id"]
    return run_id


def _post(api: httpx.Client, body: bytes) -> httpx.Response:
    return api.post("/metrics", content=body, headers={"Content-Type": "application/json"})


def test_a_step_past_64_bits_is_refused_and_the_steps_at_the_bounds_stored(
    api: httpx.Client,
) -> None:
    run_id = _run(api)
    for step in (2**63, 2**64 - 1, 2**70, -(2**63) - 1):
        r = _post(api, b'{"run_id":"%s","metrics":{"step":%d}}' % (run_id.encode(), step))
        assert r.status_code == 422, (step, r.status_code, r.text)
        assert r.json() == {"detail": "metrics.step must be a 64-bit integer"}
    for step in (-(2**63), 2**63 - 1):
        r = _post(api, b'{"run_id":"%s","metrics":{"step":%d}}' % (run_id.encode(), step))
        assert r.status_code == 200, (step, r.text)
    rows = api.get(f"/runs/{run_id}/metrics").json()["metrics"]
    assert [row["step"] for row in rows] == [-(2**63), 2**63 - 1]


@pytest.mark.parametrize(
    "row",
    [
        b'{"run_id":"%s","metrics":{"step":1,"\\ud800":0.5}}',
        b'{"run_id":"%s","metrics":{"step":1,"loss":"\\udfff"}}',
        b'{"run_id":"%s\\ud800","metrics":{"step":1}}',
    ],
    ids=["in-a-name", "in-a-value", "in-the-run-id"],
)
def test_a_lone_surrogate_is_refused_and_the_run_reads_back(api: httpx.Client, row: bytes) -> None:
    run_id = _run(api)
    r = _post(api, row % run_id.encode())
    assert r.status_code == 422, r.text
    assert "lone surrogate" in r.json()["detail"]
    assert _post(api, b'{"run_id":"%s","metrics":{"step":2}}' % run_id.encode()).is_success
    rows = api.get(f"/runs/{run_id}/metrics").json()["metrics"]
    assert rows == [{"step": 2}]


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_a_number_json_cannot_hold_is_refused_and_the_run_reads_back(
    api: httpx.Client, number: bytes
) -> None:
    """Stored, the row failed every read of its run's rows after it (500)."""
    run_id = _run(api)
    r = _post(api, b'{"run_id":"%s","metrics":{"step":1,"loss":%s}}' % (run_id.encode(), number))
    assert r.status_code == 422, r.text
    assert "NaN or infinite" in r.json()["detail"]
    assert _post(
        api, b'{"run_id":"%s","metrics":{"step":2,"loss":null}}' % run_id.encode()
    ).is_success
    read = api.get(f"/runs/{run_id}/metrics")
    assert read.status_code == 200, read.text
    assert read.json()["metrics"] == [{"step": 2, "loss": None}]


def test_rows_an_earlier_version_stored_with_nan_read_back_as_null(tmp_path: Path) -> None:
    """A data folder written before the route refused NaN may hold such rows:
    every read of their run's rows was a 500, for good."""
    data = tmp_path / "data"
    db = Database(data)

    def insert(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO train_runs (id, name, team_id, status, request, created_at, updated_at)"
            " VALUES ('rft_old', 'old', 't', 'RUNNING', '{}', 0, 0)"
        )
        conn.executemany(
            "INSERT INTO train_metrics (run_id, step, body, received_at)"
            " VALUES ('rft_old', ?, ?, 0)",
            [
                (0, '{"step":0,"loss":NaN,"acc":0.5}'),
                (1, '{"step":1,"loss":Infinity,"kl":-Infinity}'),
                (2, '{"step":2,"loss":0.25}'),
            ],
        )

    try:
        db.write_sync(insert)
    finally:
        db.close()
    with LocalPlatform(data, api_key=KEY) as platform:
        read = httpx.get(
            f"{platform.url}/api/v1/rft/runs/rft_old/metrics",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=10,
        )
    assert read.status_code == 200, read.text
    assert read.json()["metrics"] == [
        {"step": 0, "loss": None, "acc": 0.5},
        {"step": 1, "loss": None, "kl": None},
        {"step": 2, "loss": 0.25},
    ]
