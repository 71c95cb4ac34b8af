"""Prime Traces' upload route scripted for the sink tests (behind
``httpx.MockTransport``): each upload checked by the local platform's own
validator (``primeruns.local.traces_ingest``), committed once per
Idempotency-Key, a resend answered with the receipt committed, as the real
service does."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from scripted_platform import ScriptedPlatform, error

from primeruns.local.errors import TracesError
from primeruns.local.traces_ingest import stage_rows, verify_request


class TracesService:
    """``POST /api/v1/traces``: validated whole, committed once per key.

    ``held``: trace ids stored by earlier uploads, refused as repeats (400
    ``duplicate_trace_id`` naming the id), as a service scoping repeats
    wider than one request would (the local platform scopes them to one).
    ``routed``: answers the route itself; else a test's own route answers,
    passing requests on to ``upload``.
    """

    def __init__(
        self, platform: ScriptedPlatform, *, held: frozenset[str] = frozenset(), routed: bool = True
    ) -> None:
        self.receipts: dict[str, bytes] = {}
        self.episodes: list[dict[str, Any]] = []
        self.traces: list[dict[str, Any]] = []
        self.replays = 0
        self.held = held
        if routed:
            platform.route("upload", "POST", "/api/v1/traces", self.upload)

    def upload(self, request: httpx.Request, _: dict[str, str]) -> httpx.Response:
        try:
            upload = verify_request(
                content_type=request.headers.get("content-type", ""),
                body=request.content,
                key_header=request.headers.get("idempotency-key"),
                format_header=request.headers.get("x-prime-line-format"),
            )
            if upload.upload_id in self.receipts:
                self.replays += 1
                return httpx.Response(200, content=self.receipts[upload.upload_id])
            stage_rows(upload, time.time())
        except TracesError as exc:
            return error(exc.status, exc.message, code=exc.code)
        for row in upload.traces:
            if row["trace_id"] in self.held:
                message = f"trace id {row['trace_id']!r} is stored already"
                return error(400, message, code="duplicate_trace_id")
        receipt = {"upload_id": upload.upload_id, "status": "committed", "lines": upload.lines}
        self.receipts[upload.upload_id] = json.dumps(receipt).encode()
        self.episodes.extend(upload.episodes)
        self.traces.extend(upload.traces)
        return httpx.Response(201, content=self.receipts[upload.upload_id])

    def episode_ids(self) -> list[str]:
        return [row["episode_id"] for row in self.episodes]

    def trace_ids(self) -> list[str]:
        return [row["trace_id"] for row in self.traces]
