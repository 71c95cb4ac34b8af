"""An unexpected failure on a traces route answers in the traces service's envelope, over loopback.

The traces service answers every error as ``{"error": {"code", "message"}}``
(its code may be null), the platform API as ``{"detail": ...}``. A failure
no route expected (here the data folder lost a table under the running
platform) was answered in the platform API's words on every route, the
traces service's included, so a client of the service read a body its
contract does not have.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx

from primeruns.local import LocalPlatform

KEY = "internal-error-key"


def test_an_unexpected_error_on_a_traces_route_is_the_services_envelope(tmp_path: Path) -> None:
    data = tmp_path / "data"
    headers = {"Authorization": f"Bearer {KEY}"}
    with LocalPlatform(data, api_key=KEY) as platform:
        conn = sqlite3.connect(data / "platform.sqlite3")
        try:
            conn.execute("DROP TABLE episodes")
            conn.commit()
        finally:
            conn.close()
        traces = httpx.get(f"{platform.url}/api/v1/episodes", headers=headers, timeout=10)
        # The platform API's routes keep their own dialect.
        evaluations = httpx.get(f"{platform.url}/api/v1/evaluations/", headers=headers, timeout=10)
        platform_run = httpx.get(f"{platform.url}/_local/runs/r", headers=headers, timeout=10)
    assert traces.status_code == 500, traces.text
    assert traces.json() == {"error": {"code": None, "message": "internal error"}}
    assert evaluations.status_code == 200, evaluations.text
    assert platform_run.status_code == 500, platform_run.text
    assert platform_run.json() == {"detail": "internal error"}
