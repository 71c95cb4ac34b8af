"""Record builders and small HTTP helpers shared by the local platform tests."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

from primeruns.local import LocalPlatform
from primeruns.local.app import build_app
from primeruns.local.settings import ServerSettings
from primeruns.local.storage import Database


def trace(
    run_id: str | None = "run-1",
    *,
    step: int | None = None,
    reward: float = 1.0,
    trace_id: str | None = None,
    start: float | None = None,
) -> dict[str, Any]:
    run: dict[str, Any] | None = None
    if run_id is not None:
        run = {"id": run_id, "type": "train" if step is not None else "eval"}
        if step is not None:
            run["work"] = {"type": "train", "step": step}
    t0 = time.time() - 60 if start is None else start
    doc: dict[str, Any] = {
        "version": 1,
        "id": trace_id or uuid.uuid4().hex,
        "task": {"data": {"id": "task-1", "idx": 0}},
        "agent": {"name": "agent", "trainable": True, "config": {"model": "m-1"}},
        "rewards": {"correct": {"score": reward, "weight": 1.0}},
        "ok": True,
        "errors": [],
        "stop_condition": "done",
        "timing": {"start": t0, "scoring": {"start": t0 + 1, "end": t0 + 2}},
        "num_total_tokens": 42,
    }
    if run is not None:
        doc["run"] = run
    return doc


def episode(
    run_id: str = "run-1",
    *,
    traces: int = 2,
    step: int | None = None,
    episode_id: str | None = None,
) -> dict[str, Any]:
    members = [trace(run_id, step=step) for _ in range(traces)]
    return {
        "id": episode_id or uuid.uuid4().hex,
        "env": {"id": "gsm8k"},
        "run": {"id": run_id, "type": "train" if step is not None else "eval"},
        "ok": True,
        "errors": [],
        "traces": members,
    }


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(
        json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for r in records
    )


def post_upload(
    url: str,
    body: bytes,
    *,
    episode_format: bool = False,
    key: str | None = None,
    metadata: bytes = b'{"schema_version": 1}',
    compress: bool = True,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """A hand-built upload, for the error paths the vendor client never produces."""
    sent, files = upload_parts(
        body, episode_format=episode_format, key=key, metadata=metadata, compress=compress
    )
    sent.update(headers or {})
    return httpx.post(f"{url}/api/v1/traces", headers=sent, files=files, timeout=30)


def upload_parts(
    body: bytes,
    *,
    episode_format: bool = False,
    key: str | None = None,
    metadata: bytes = b'{"schema_version": 1}',
    compress: bool = True,
) -> tuple[dict[str, str], dict[str, Any]]:
    """The headers and multipart files of an upload of ``body`` (JSON lines),
    for ``httpx``'s ``post`` by any client (an in-process app's too)."""
    part_headers = {"Content-Encoding": "gzip"} if compress else {}
    payload = gzip.compress(body, mtime=0) if compress else body
    sent = {"Idempotency-Key": key or "sha256:" + hashlib.sha256(body).hexdigest()}
    if episode_format:
        sent["X-Prime-Line-Format"] = "episode"
    files: dict[str, Any] = {
        "metadata": (None, metadata, "application/json"),
        "traces": ("traces.jsonl", payload, "application/x-ndjson", part_headers),
    }
    return sent, files


def error_code(response: httpx.Response) -> str | None:
    code: str | None = response.json()["error"]["code"]
    return code


def plant(data: Path, insert: Callable[[sqlite3.Connection], None]) -> Path:
    """A data folder (made at ``data``) holding the rows ``insert`` writes:
    what an earlier version stored, planted as it stored it."""
    db = Database(data)
    try:
        db.write_sync(insert)
    finally:
        db.close()
    return data


@contextmanager
def served(data: Path, key: str) -> Iterator[httpx.Client]:
    """A client of the platform serving ``data`` with ``key``, while it runs."""
    headers = {"Authorization": f"Bearer {key}"}
    with (
        LocalPlatform(data, api_key=key) as platform,
        httpx.Client(base_url=platform.url, headers=headers, timeout=30) as api,
    ):
        yield api


def stored_totals(api: httpx.Client) -> tuple[int, int]:
    """How many training runs and evaluations the platform's lists hold;
    each list answers 200."""
    runs = api.get("/api/v1/rft/runs", params={"limit": 1000})
    evaluations = api.get("/api/v1/evaluations/", params={"limit": 1000})
    assert runs.status_code == 200, runs.text
    assert evaluations.status_code == 200, evaluations.text
    return runs.json()["total"], evaluations.json()["total"]


class Api:
    """The platform's app in this process (its connection is reachable), called
    one request at a time."""

    def __init__(self, data: Path) -> None:
        self.app: Starlette = build_app(ServerSettings(data_dir=data))
        self.db: Database = self.app.state.ctx.db

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://local") as c:
                return await c.request(method, path, **kwargs)

        return asyncio.run(call())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)
