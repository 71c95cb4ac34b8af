"""A live page's poll: the digest of what the page shows is made from its
data, not from that data put as text (a long training run's 300,000 charted
values took 0.6 s as text on every poll, every 2 s, most answered 204)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from starlette.applications import Starlette

from primeruns.local.dashboard.routes import VERSION_HEADER, dashboard_routes
from primeruns.local.dashboard.views import RunDetail, RunRow


class _Untexted(dict[str, Any]):
    """A metric row that fails the page if anything puts it as text."""

    def __repr__(self) -> str:
        raise AssertionError("a metric row was put as text")


class _LiveRun:
    def run(self, run_id: str) -> RunDetail:
        rows = [_Untexted(step=s, loss=1.0 / (s + 1)) for s in range(100)]
        row = RunRow(run_id, "train", "live", None, "RUNNING", None, 1.0, None)
        return RunDetail(row, {}, None, {}, metrics=rows)


def test_a_live_training_pages_version_is_digested_from_its_rows_not_their_text() -> None:
    app = Starlette(routes=dashboard_routes())
    app.state.dashboard_source = _LiveRun()

    async def fetch(headers: dict[str, str]) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/dashboard/training/live", headers=headers)

    page = asyncio.run(fetch({}))
    assert page.status_code == 200
    version = re.search(r'data-version="([0-9a-f]+)"', page.text)
    assert version is not None
    again = asyncio.run(fetch({VERSION_HEADER: version.group(1)}))
    assert again.status_code == 204  # the same rows: the same version
