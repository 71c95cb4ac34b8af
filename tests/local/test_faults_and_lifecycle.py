"""Fault injection, restart on the same data, SIGTERM, and hostile input."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from local_helpers import episode, jsonl, post_upload, trace

from primeruns.local import LocalPlatform


def _retrying(send: Callable[[], httpx.Response], attempts: int = 40) -> httpx.Response:
    """The smallest honest client: retry 429/502/503 and transport errors."""
    for _ in range(attempts):
        try:
            response = send()
        except httpx.TransportError:
            continue
        if response.status_code in (429, 502, 503):
            time.sleep(float(response.headers.get("Retry-After", "0")))
            continue
        return response
    raise AssertionError("gave up")


def test_retryable_faults_carry_retry_after_and_store_nothing(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    p = make_local_platform(retryable_rate=1.0, fault_seed=3)
    seen: dict[int, httpx.Response] = {}
    for _ in range(30):
        r = post_upload(p.url, jsonl([trace("run-refused")]))
        seen.setdefault(r.status_code, r)
    assert set(seen) == {429, 502, 503}
    assert float(seen[429].headers["Retry-After"]) > 0
    assert float(seen[503].headers["Retry-After"]) > 0
    assert seen[429].json()["error"]["code"] == "rate_limited"
    assert httpx.get(f"{p.url}/healthz").status_code == 200  # never faulted
    assert p.runs() == []


def test_thirty_percent_faults_with_retries_store_everything_once(
    make_local_platform: Callable[..., LocalPlatform],
) -> None:
    p = make_local_platform(retryable_rate=0.2, ambiguous_rate=0.1, fault_seed=7)
    assert p.set_faults(seed=7)["retryable_rate"] == 0.2
    api = f"{p.url}/api/v1"
    run_id = _retrying(
        lambda: httpx.post(
            f"{api}/rft/external-runs", json={"base_model": "m", "max_steps": 5, "team_id": "t"}
        )
    ).json()["run"]["id"]
    episodes = [episode(run_id, step=i % 5) for i in range(40)]
    for i in range(0, 40, 4):
        body = jsonl(episodes[i : i + 4])
        r = _retrying(lambda b=body: post_upload(p.url, b, episode_format=True))  # type: ignore[misc]
        assert r.json()["status"] == "committed"
    for step in range(5):
        _retrying(
            lambda s=step: httpx.post(
                f"{api}/rft/metrics",
                json={  # type: ignore[misc]
                    "run_id": run_id,
                    "metrics": {"step": s, "loss": 1.0 / (s + 1)},
                },
            )
        )
    _retrying(lambda: httpx.post(f"{api}/rft/finalize", json={"run_id": run_id, "exit_code": 0}))
    report = p.run(run_id)
    assert report["status"] == "COMPLETED"
    assert report["traces"]["episodes"] == report["traces"]["distinct_episodes"] == 40
    assert report["traces"]["traces"] == report["traces"]["distinct_traces"] == 80
    assert report["train_metrics"] == {"rows": 5, "steps": 5}


def test_ambiguous_failure_commits(make_local_platform: Callable[..., LocalPlatform]) -> None:
    p = make_local_platform(ambiguous_rate=1.0)
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{p.url}/api/v1/evaluations/", json={"environments": [{"id": "e"}]})
    with pytest.raises(httpx.TransportError):
        post_upload(p.url, jsonl([trace("run-ambiguous")]))
    kinds = sorted((r["kind"] or "") for r in p.runs())
    assert kinds == ["eval", "eval"]
    assert p.run("run-ambiguous")["traces"]["traces"] == 1
    p.set_faults(ambiguous_rate=0.0)
    replay = post_upload(p.url, jsonl([trace("run-other")]))
    assert replay.status_code == 201


def test_bad_fault_settings_are_rejected(local_platform: LocalPlatform) -> None:
    r = httpx.post(f"{local_platform.url}/_local/faults", json={"retryable_rate": 2})
    assert r.status_code == 422
    r = httpx.post(f"{local_platform.url}/_local/faults", json={"bogus": 1})
    assert r.status_code == 422
    # Past an hour, a wait would hold every faulted request for good (2**64 ms).
    for name, value in (("latency_ms", 2**64), ("slowloris_interval_s", 3601)):
        r = httpx.post(f"{local_platform.url}/_local/faults", json={name: value})
        assert r.status_code == 422, (name, r.text)
        assert name in r.json()["detail"]
    settings = httpx.get(f"{local_platform.url}/_local/faults").json()
    assert settings["retryable_rate"] == 0.0
    assert settings["latency_ms"] == 0


def test_bogus_faults_answer_200_with_nothing_and_a_body_limit_answers_413(
    local_platform: LocalPlatform,
) -> None:
    # What a gateway in front of the platform does (#28): the client must
    # neither count these as stored nor stop for them.
    p = local_platform
    with pytest.raises(httpx.HTTPStatusError):
        p.set_faults(bogus_rate=0.5, bogus_bodies=["xml"])
    p.set_faults(bogus_rate=1.0, seed=1, routes=["/api/v1/evaluations"])
    bodies = set()
    for _ in range(40):
        r = httpx.post(f"{p.url}/api/v1/evaluations/", json={"environments": [{"id": "e"}]})
        assert r.status_code == 200
        bodies.add("html" if r.text.startswith("<!DOCTYPE") else r.text[:3])
    assert bodies == {"", "{}", "html", '{"s', '{"e'}  # "{"e": a real answer cut short
    assert 0 < len(p.runs()) < 40  # forwarded or not, drawn evenly
    p.set_faults(bogus_rate=0.0, max_body_bytes=1000)
    big = {"environments": [{"id": "e"}], "description": "x" * 2000}
    assert httpx.post(f"{p.url}/api/v1/evaluations/", json=big).status_code == 413
    small = {"environments": [{"id": "e"}]}
    assert httpx.post(f"{p.url}/api/v1/evaluations/", json=small).status_code == 201
    assert p.set_faults(max_body_bytes=0)["injected"] == 41


def test_the_body_limit_answers_413_to_a_chunked_body_over_it_as_a_proxy_does(
    local_platform: LocalPlatform,
) -> None:
    """A body sent chunked (no Content-Length: httpx streams an iterator so)
    is measured as it comes, as a proxy's limit does: over the limit it is a
    413 and never reaches the platform; under it, it reaches it whole. Before,
    only a Content-Length was looked at, so every chunked body went through."""
    p = local_platform
    url = f"{p.url}/api/v1/evaluations/"
    p.set_faults(max_body_bytes=1000, routes=["/api/v1/evaluations"])
    before = len(p.runs())
    big = json.dumps({"environments": [{"id": "e"}], "description": "x" * 2000}).encode()
    small = json.dumps({"environments": [{"id": "e"}], "name": "y" * 900}).encode()
    headers = {"Content-Type": "application/json"}

    def chunked(body: bytes) -> Iterator[bytes]:
        yield from (body[i : i + 300] for i in range(0, len(body), 300))

    r = httpx.post(url, content=chunked(big), headers=headers, timeout=30)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.status_code == 413, r.text
    assert len(p.runs()) == before, "a refused body reached the platform"
    r = httpx.post(url, content=chunked(small), headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    assert p.run(r.json()["evaluation_id"])["name"] == "y" * 900, "not whole"
    # A route outside ``routes`` is not limited, chunked or not.
    r = httpx.post(f"{p.url}/api/v1/rft/models", content=chunked(big), headers=headers)
    assert r.status_code != 413
    assert p.set_faults(max_body_bytes=0)["injected"] == 1


def test_restart_keeps_everything_and_sigterm_exits_zero(
    local_platform: LocalPlatform,
) -> None:
    p = local_platform
    url = p.url
    eval_id = httpx.post(
        f"{url}/api/v1/evaluations/", json={"environments": [{"id": "e"}], "metadata": {"k": "v"}}
    ).json()["evaluation_id"]
    httpx.post(f"{url}/api/v1/evaluations/{eval_id}/samples", json={"samples": [{"sample_id": 1}]})
    ep = episode("run-restart")
    assert post_upload(p.url, jsonl([ep]), episode_format=True).status_code == 201
    before = (p.run(eval_id), p.run("run-restart"))
    p.stop()
    assert p.returncode == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz")
    p.start()
    assert p.url == url
    assert (p.run(eval_id), p.run("run-restart")) == before
    page = httpx.get(f"{url}/api/v1/episodes", params={"run_id": "run-restart"}).json()
    assert [e["episode_id"] for e in page["items"]] == [ep["id"]]
    assert post_upload(p.url, jsonl([ep]), episode_format=True).status_code == 200
    assert "run-restart" in httpx.get(f"{url}/").text


def test_random_garbage_never_yields_500(local_platform: LocalPlatform) -> None:
    rng = random.Random(0)
    paths = [
        "/api/v1/traces",
        "/api/v1/evaluations/",
        "/api/v1/rft/metrics",
        "/api/v1/rft/samples/presign",
        "/api/v1/environmentshub/resolve",
        "/_local/faults",
        "/api/v1/rft/external-runs",
        "/api/internal/rft/finalize",
    ]
    types = [
        "application/json",
        "multipart/form-data; boundary=b",
        "multipart/form-data",
        "text/plain",
        "application/x-ndjson",
    ]
    with httpx.Client(base_url=local_platform.url, timeout=10) as client:
        for _ in range(150):
            body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 300)))
            if rng.random() < 0.5:
                body = b'--b\r\nContent-Disposition: form-data; name="traces"\r\n\r\n' + body
            r = client.post(
                rng.choice(paths),
                content=body,
                headers={
                    "Content-Type": rng.choice(types),
                    "Idempotency-Key": rng.choice(["sha256:" + "0" * 64, "junk"]),
                },
            )
            assert r.status_code < 500, (r.status_code, r.text)
    assert local_platform.returncode is None


def test_a_client_gone_mid_body_is_said_in_a_line_not_logged_as_a_server_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync killed while it sends a body (SIGKILL, a lost network) is the
    client's doing: one line at INFO names the request; no "unexpected error"
    with a traceback that reads as the platform's own fault."""
    import asyncio

    from primeruns.local.app import build_app
    from primeruns.local.settings import ServerSettings

    app = build_app(ServerSettings(data_dir=tmp_path / "data"))
    messages = iter(
        [
            {"type": "http.request", "body": b'{"samples": [', "more_body": True},
            {"type": "http.disconnect"},
        ]
    )

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        return None

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/api/v1/evaluations/e1/samples",
        "raw_path": b"/api/v1/evaluations/e1/samples",
        "query_string": b"",
        "root_path": "",
        "scheme": "http",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    with caplog.at_level(logging.INFO):
        asyncio.run(app(scope, receive, send))
    app.state.ctx.db.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    said = [r.getMessage() for r in caplog.records if "went away" in r.getMessage()]
    assert said == ["client went away during POST /api/v1/evaluations/e1/samples"]
