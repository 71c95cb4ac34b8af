"""The traces service's reads answer whatever an earlier version stored, over loopback.

Before the upload refused them, a trace was indexed with an infinite reward
(finite scores summed past the doubles) and a bare trace was stored as
written with a number past the doubles (``1e400``) in its document. JSON has
no word for either: every read that answered one was a 500 for good, the
list of every run's traces (``GET /api/v1/runs``) included, and the SDKs
retry a 500. Finite rewards of today can still average past the doubles.
Each such number reads as null, as a reward none of whose scores counts,
and a mean of finite rewards is finite.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from local_helpers import plant, post_upload

from primeruns.local import LocalPlatform

KEY = "old-rows-key"
RUN = "old-run"


def _plant(conn: sqlite3.Connection) -> None:
    """The rows an earlier version stored: an infinite reward, a document with 1e400."""
    stamp = time.time() - 60
    for trace_id, reward, raw in [
        ("t-inf", float("inf"), b'{"id":"t-inf","rewards":{"a":{"score":1e308,"weight":10}}}'),
        (
            "t-1e400",
            0.5,
            b'{"id":"t-1e400","nodes":[{"message":{"role":"user","content":1e400},'
            b'"timestamp":1e400}],"calls":[{"time":{"start":1e400}}]}',
        ),
    ]:
        conn.execute(
            "INSERT INTO traces (trace_id, upload_id, episode_id, run_id, run_type, step,"
            " reward, has_error, is_truncated, duration_ms, total_tokens, size_bytes,"
            " created_at, ingested_at, context, raw)"
            " VALUES (?, 'u-old', 'e-old', ?, 'eval', 1, ?, 0, 0, 0, 0, ?, ?, ?, '{}', ?)",
            (trace_id, RUN, reward, len(raw), stamp, stamp, raw),
        )
    conn.execute(
        "INSERT INTO episodes (episode_id, upload_id, run_id, has_error, schema_version,"
        " created_at, ingested_at, raw) VALUES ('e-old', 'u-old', ?, 0, 1, ?, ?, ?)",
        (RUN, stamp, stamp, b'{"id":"e-old"}'),
    )


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    data = plant(tmp_path_factory.mktemp("old-rows") / "data", _plant)
    with LocalPlatform(data, api_key=KEY) as p:
        yield p


def _get(platform: LocalPlatform, path: str) -> httpx.Response:
    # A new connection each: a 500 ends a kept-alive one.
    return httpx.get(
        f"{platform.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/traces",
        f"/api/v1/traces?run_id={RUN}",
        "/api/v1/traces/t-inf",
        "/api/v1/traces/t-1e400/nodes",
        "/api/v1/traces/t-1e400/calls",
        "/api/v1/runs",
        f"/api/v1/runs/{RUN}",
        f"/api/v1/runs/{RUN}/steps",
        "/api/v1/episodes/e-old",
        "/api/v1/episodes/e-old/traces",
        f"/api/v1/runs/{RUN}/search?query=user&field=content",
        f"/_local/runs/{RUN}",
        f"/dashboard/evaluations/{RUN}",
        "/",
    ],
)
def test_a_read_of_rows_an_earlier_version_stored_answers(
    platform: LocalPlatform, path: str
) -> None:
    r = _get(platform, path)
    assert r.status_code == 200, (path, r.text)


def test_an_infinite_reward_or_number_reads_as_null(platform: LocalPlatform) -> None:
    assert _get(platform, "/api/v1/traces/t-inf").json()["score"]["reward"] is None
    listed = _get(platform, f"/api/v1/traces?run_id={RUN}").json()["items"]
    assert {t["trace_id"]: t["score"]["reward"] for t in listed} == {"t-inf": None, "t-1e400": 0.5}
    # The run's mean is of the rewards that count.
    assert _get(platform, f"/api/v1/runs/{RUN}").json()["avg_reward"] == 0.5
    assert _get(platform, f"/api/v1/runs/{RUN}/steps").json()["items"][0]["avg_reward"] == 0.5
    # Filtered on its reward, it is not there: the trace shows none.
    kept = _get(platform, f"/api/v1/traces?run_id={RUN}&reward_min=1").json()["items"]
    assert kept == []
    node = _get(platform, "/api/v1/traces/t-1e400/nodes").json()["items"][0]
    assert node["message"]["content"] is None and node["timestamp"] is None
    call = _get(platform, "/api/v1/traces/t-1e400/calls").json()["items"][0]
    assert call["time_start"] is None


def test_finite_rewards_that_sum_past_the_doubles_average_to_their_mean(
    platform: LocalPlatform,
) -> None:
    run = f"big-{uuid.uuid4().hex}"
    start = time.time() - 60
    lines = b"".join(
        json.dumps(
            {
                "id": uuid.uuid4().hex,
                "run": {"id": run, "type": "train", "work": {"step": 3}},
                "timing": {"start": start},
                "rewards": {"a": {"score": 1.5e308}},
            }
        ).encode()
        + b"\n"
        for _ in range(2)
    )
    upload = post_upload(platform.url, lines, headers={"Authorization": f"Bearer {KEY}"})
    assert upload.status_code == 201, upload.text
    summary = _get(platform, f"/api/v1/runs/{run}")
    assert summary.status_code == 200, summary.text
    assert summary.json()["avg_reward"] == 1.5e308
    steps = _get(platform, f"/api/v1/runs/{run}/steps")
    assert steps.status_code == 200, steps.text
    assert steps.json()["items"][0]["avg_reward"] == 1.5e308
    assert _get(platform, "/api/v1/runs").status_code == 200
