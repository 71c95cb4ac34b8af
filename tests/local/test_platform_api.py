"""Evaluations, environments hub and external training runs over real HTTP."""

from __future__ import annotations

import contextlib
import io
import sqlite3
from collections.abc import Callable, Iterator

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from primeruns.local import LocalPlatform


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlatform]:
    with LocalPlatform(tmp_path_factory.mktemp("api"), train_teams=["team-a"]) as p:
        yield p


@pytest.fixture
def api(platform: LocalPlatform) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{platform.url}/api/v1", timeout=10) as c:
        yield c


def _eval(api: httpx.Client) -> str:
    r = api.post("/evaluations/", json={"name": "e", "environments": [{"id": "env"}], "tags": []})
    assert r.status_code == 201
    eval_id: str = r.json()["evaluation_id"]
    return eval_id


def test_evaluation_lifecycle_and_status_guard(api: httpx.Client, platform: LocalPlatform) -> None:
    eval_id = _eval(api)
    assert api.put(
        f"/evaluations/{eval_id}", json={"metadata": {"lr": 1}, "metrics": {"a": 1}}
    ).is_success
    assert api.post(f"/evaluations/{eval_id}/finalize", json={"metrics": {"b": 2}}).is_success
    assert api.post(f"/evaluations/{eval_id}/finalize", json={}).status_code == 200
    assert api.put(f"/evaluations/{eval_id}", json={"status": "FAILED"}).status_code == 409
    # Metadata-only updates still land on a closed run.
    assert api.put(f"/evaluations/{eval_id}", json={"metrics": {"c": 3}}).status_code == 200
    got = api.get(f"/evaluations/{eval_id}").json()
    assert (got["status"], got["metrics"], got["metadata"]) == ("COMPLETED", {"c": 3}, {"lr": 1})
    report = platform.run(eval_id)
    assert (report["kind"], report["status"], report["summary"]) == ("eval", "COMPLETED", {"c": 3})
    assert any(r["id"] == eval_id for r in api.get("/evaluations/").json()["evaluations"])


def test_failed_evaluation_cannot_be_finalized(api: httpx.Client) -> None:
    eval_id = _eval(api)
    r = api.put(f"/evaluations/{eval_id}", json={"status": "FAILED", "error_message": "boom"})
    assert r.json()["status"] == "FAILED"
    assert api.post(f"/evaluations/{eval_id}/finalize", json={}).status_code == 409
    assert api.put(f"/evaluations/{eval_id}", json={"status": "CANCELLED"}).status_code == 409
    assert api.put(f"/evaluations/{eval_id}", json={"status": "DONE"}).status_code == 422


def test_samples_are_append_only(api: httpx.Client, platform: LocalPlatform) -> None:
    eval_id = _eval(api)
    rows = [{"sample_id": "s1", "reward": 1.0}, {"sample_id": "s2", "reward": 0.0}]
    assert api.post(f"/evaluations/{eval_id}/samples", json={"samples": rows}).is_success
    assert api.post(f"/evaluations/{eval_id}/samples", json={"samples": rows[:1]}).is_success
    assert platform.run(eval_id)["samples"] == {"rows": 3, "distinct": 2}
    page = api.get(f"/evaluations/{eval_id}/samples", params={"page": 1, "limit": 2}).json()
    assert (len(page["samples"]), page["total"], page["hasMore"]) == (2, 3, True)
    assert api.post(f"/evaluations/{eval_id}/samples", json={"samples": 1}).status_code == 422


def test_pushed_samples_are_stored_as_json_text_and_read_back_as_sent(
    api: httpx.Client, platform: LocalPlatform
) -> None:
    """Each sample is stored as SQLite TEXT (what json_extract and the
    dashboard read), whatever it holds: text beyond ASCII, a digest with a run
    of digits, an integer past 64 bits, small and large floats."""
    eval_id = _eval(api)
    rows = [
        {"sample_id": "a", "answer": "6 ÷ 2 = 3 × 1 😀", "reward": 1e-07, "big": 1e22},
        {"sample_id": "b", "hash": "859e6289a5f3af13f9590363425706828671a4a6", "n": 2**70},
    ]
    assert api.post(f"/evaluations/{eval_id}/samples", json={"samples": rows}).is_success
    page = api.get(f"/evaluations/{eval_id}/samples", params={"page": 1, "limit": 10}).json()
    assert page["samples"] == rows
    with contextlib.closing(sqlite3.connect(platform.data_dir / "platform.sqlite3")) as conn:
        stored = conn.execute(
            "SELECT typeof(body), json_extract(body, '$.sample_id') FROM eval_samples"
            " WHERE eval_id = ? ORDER BY row",
            (eval_id,),
        ).fetchall()
    assert stored == [("text", "a"), ("text", "b")]


def test_a_sample_whose_numbers_pass_the_floats_is_stored_not_a_500(
    api: httpx.Client, platform: LocalPlatform
) -> None:
    """A reward or a token count of 400 digits (JSON bounds none) made the push
    a 500: its row's reward and tokens were read as floats (OverflowError).
    Such a number is no finite number, as an infinity is; the sample is
    stored as sent, and the evaluation's pages stand."""
    eval_id = _eval(api)
    big = 10**400
    rows = [
        {"sample_id": "a", "task": "t", "reward": big},
        {"sample_id": "b", "task": "t", "reward": 0.5, "input_tokens": big},
    ]
    assert api.post(f"/evaluations/{eval_id}/samples", json={"samples": rows}).is_success
    page = api.get(f"/evaluations/{eval_id}/samples", params={"page": 1, "limit": 10}).json()
    assert page["samples"] == rows
    for path in ("", "/analysis", "?sort=reward", "/samples/0"):
        url = f"{platform.url}/dashboard/evaluations/{eval_id}{path}"
        assert httpx.get(url, timeout=10).status_code == 200, path


def test_pushes_to_two_evaluations_interleaved_keep_each_samples_order_and_row(
    api: httpx.Client, platform: LocalPlatform
) -> None:
    """Pushes to two evaluations in turn: each reads back its samples in the
    order pushed, each body numbered after the one before in the table, and
    the dashboard's row of each sample (eval_sample_rows) under its body's
    number."""
    first, second = _eval(api), _eval(api)
    pushed: dict[str, list[dict[str, object]]] = {first: [], second: []}
    for round_ in range(3):
        for eval_id in (first, second):
            rows = [
                {"sample_id": f"{eval_id}-{round_}-{i}", "reward": i / 4, "task": "t"}
                for i in range(1 + round_ * 2)
            ]
            pushed[eval_id] += rows
            answer = api.post(f"/evaluations/{eval_id}/samples", json={"samples": rows})
            assert answer.json()["inserted"] == len(rows)
    for eval_id, rows in pushed.items():
        page = api.get(f"/evaluations/{eval_id}/samples", params={"limit": 100}).json()
        assert page["samples"] == rows and page["total"] == len(rows)
    with contextlib.closing(sqlite3.connect(platform.data_dir / "platform.sqlite3")) as conn:
        bodies = conn.execute(
            "SELECT row, eval_id, sample_id FROM eval_samples WHERE eval_id IN (?, ?) ORDER BY row",
            (first, second),
        ).fetchall()
        facts = conn.execute(
            "SELECT row, eval_id, sample_id, reward FROM eval_sample_rows"
            " WHERE eval_id IN (?, ?) ORDER BY row",
            (first, second),
        ).fetchall()
    numbers = [row for row, _, _ in bodies]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert [b[2] for b in bodies if b[1] == first] == [r["sample_id"] for r in pushed[first]]
    assert [f[:3] for f in facts] == bodies
    assert [f[3] for f in facts if f[1] == second] == [r["reward"] for r in pushed[second]]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/evaluations/nope", None),
        ("PUT", "/evaluations/nope", {"metrics": {}}),
        ("POST", "/evaluations/nope/finalize", {}),
        ("POST", "/evaluations/nope/samples", {"samples": []}),
        ("GET", "/environmentshub/o/n/@latest", None),
        ("POST", "/environmentshub/lookup", {"id": "nope"}),
        ("POST", "/rft/finalize", {"run_id": "nope", "exit_code": 0}),
        ("POST", "/rft/metrics", {"run_id": "nope", "metrics": {"step": 1}}),
        ("PUT", "/rft/external-runs/nope/status", {"status": "failed"}),
    ],
)
def test_unknown_ids_are_404_detail(
    api: httpx.Client, method: str, path: str, body: object
) -> None:
    r = api.request(method, path, json=body)
    assert r.status_code == 404 and "detail" in r.json()


@pytest.mark.parametrize(
    "content",
    [b"{", b"[1]", b'{"environments": "x"}', b'{"name": "x"}', b"\xff"],
)
def test_bad_bodies_are_4xx_not_500(api: httpx.Client, content: bytes) -> None:
    r = api.post("/evaluations/", content=content, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500
    r = api.post("/evaluations/", content=b"a=1", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415


def test_environment_hub_get_or_create(api: httpx.Client) -> None:
    first = api.post("/environmentshub/resolve", json={"name": "gsm8k", "team_id": "t1"}).json()
    again = api.post("/environmentshub/resolve", json={"name": "gsm8k", "team_id": "t1"}).json()
    assert first["data"]["created"] is True and again["data"]["created"] is False
    assert first["data"]["id"] == again["data"]["id"]
    latest = api.get("/environmentshub/t1/gsm8k/@latest").json()
    assert latest["data"]["id"] == first["data"]["id"]
    assert api.post("/environmentshub/lookup", json={"id": first["data"]["id"]}).is_success
    assert api.post("/environmentshub/resolve", json={"name": "bad name!"}).status_code == 422


def _train(api: httpx.Client, team: str = "team-a") -> httpx.Response:
    body = {
        "base_model": "m",
        "max_steps": 10,
        "environments": [],
        "team_id": team,
        "run_config": {"lr": 0.1},
    }
    return api.post("/rft/external-runs", json=body)


def _parquet(rows: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"sample_id": list(range(rows))}), buf)
    return buf.getvalue()


def test_training_run_metrics_samples_and_finalize(
    api: httpx.Client, platform: LocalPlatform
) -> None:
    assert _train(api, "team-b").status_code == 403
    run_id = _train(api).json()["run"]["id"]
    for step, loss in ((0, 1.0), (1, 0.5), (1, 0.4)):
        r = api.post(
            "/rft/metrics", json={"run_id": run_id, "metrics": {"step": step, "loss": loss}}
        )
        assert r.is_success
    presigned = api.post("/rft/samples/presign", json={"run_id": run_id, "step": 0}).json()["data"]
    url, key = presigned["presignedUrl"], presigned["s3Key"]
    confirm = {"run_id": run_id, "step": 0, "s3_key": key}
    assert api.post("/rft/samples/confirm", json=confirm).status_code == 400  # not uploaded yet
    assert httpx.put(url, content=b"x", headers={"Authorization": "Bearer k"}).status_code == 400
    assert httpx.put(url.replace("token=", "token=x"), content=b"x").status_code == 403
    assert httpx.put(url, content=b"not parquet").status_code == 200
    assert api.post("/rft/samples/confirm", json=confirm).status_code == 400
    put = httpx.put(url, content=_parquet(3), headers={"Content-Type": "application/parquet"})
    assert put.status_code == 200
    assert api.post("/rft/samples/confirm", json=confirm).json()["rows"] == 3
    assert api.post("/rft/samples/confirm", json=confirm).is_success  # repeat is fine
    assert api.post("/rft/samples/confirm", json={**confirm, "step": 1}).status_code == 400
    assert api.post("/rft/samples/confirm", json={**confirm, "s3_key": "nope"}).status_code == 404
    assert api.post("/rft/finalize", json={"run_id": run_id, "exit_code": 0}).is_success
    assert api.post("/rft/finalize", json={"run_id": run_id, "exit_code": 0}).is_success
    assert (
        api.put(f"/rft/external-runs/{run_id}/status", json={"status": "failed"}).status_code == 409
    )
    report = platform.run(run_id)
    assert (report["kind"], report["status"], report["config"]) == (
        "train",
        "COMPLETED",
        {"lr": 0.1},
    )
    assert report["train_metrics"] == {"rows": 2, "steps": 2}
    assert report["parquet_objects"] == [{"step": 0, "key": key, "rows": 3}]
    metrics = api.get(f"/rft/runs/{run_id}/metrics").json()["metrics"]
    assert [m["loss"] for m in metrics] == [1.0, 0.4]


@pytest.mark.parametrize("name", ["min_step", "max_step", "limit"])
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_a_metrics_read_bound_beyond_64_bits_is_refused_naming_it_not_a_500(
    api: httpx.Client, name: str, value: int
) -> None:
    # SQLite holds 64-bit integers: one past them failed binding the query,
    # a 500 (the SDK never sends one, but a platform must not 500 on input).
    run_id = _train(api).json()["run"]["id"]
    r = api.get(f"/rft/runs/{run_id}/metrics", params={name: value})
    assert r.status_code == 422 and name in r.json()["detail"]
    edge = 2**63 - 1 if value > 0 else -(2**63)
    assert api.get(f"/rft/runs/{run_id}/metrics", params={name: edge}).status_code == 200


@pytest.mark.parametrize(
    ("path", "name"),
    [("/evaluations/{eval_id}/samples", "page"), ("/evaluations/", "skip")],
)
def test_an_evaluation_read_position_beyond_64_bits_is_refused_not_a_500(
    api: httpx.Client, path: str, name: str
) -> None:
    r = api.get(path.format(eval_id=_eval(api)), params={name: 10**30})
    assert r.status_code == 422 and name in r.json()["detail"]


def test_failed_training_run_refuses_finalize(api: httpx.Client) -> None:
    run_id = _train(api).json()["run"]["id"]
    r = api.put(
        f"/rft/external-runs/{run_id}/status", json={"status": "failed", "error_message": "x"}
    )
    assert r.json()["run"]["status"] == "FAILED"
    assert api.post("/rft/finalize", json={"run_id": run_id, "exit_code": 0}).status_code == 409


def test_api_key_on_public_and_internal_roots(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    p = make_local_platform(api_key="sekret")
    r = httpx.post(f"{p.url}/api/v1/evaluations/", json={"environments": [{"id": "e"}]})
    assert r.status_code == 401 and "sekret" not in r.text
    good = {"Authorization": "Bearer sekret"}
    run_id = httpx.post(
        f"{p.url}/api/v1/rft/external-runs",
        headers=good,
        json={"base_model": "m", "max_steps": 0, "team_id": "any"},
    ).json()["run"]["id"]
    internal = f"{p.url}/api/internal/rft"
    body = {"run_id": run_id, "metrics": {"step": 0, "x": 1}}
    assert httpx.post(f"{internal}/metrics", json=body).status_code == 401
    assert httpx.post(f"{internal}/metrics", json=body, headers={"x-api-key": "sekret"}).is_success
    # The internal router has no run registration.
    assert (
        httpx.post(
            f"{internal}/external-runs", headers={"x-api-key": "sekret"}, json={}
        ).status_code
        == 404
    )
    assert p.run(run_id)["train_metrics"]["rows"] == 1
