"""Request ceiling: metrics rows per second with one row per request, against
what a bare HTTP server of the same stack answers.

Why it exists: the wire takes one metrics row per ``POST /rft/metrics``
(contract §3.5), so a backlog drains at most as fast as this machine does
round trips of httpx against uvicorn, whatever the SDK or the platform does
besides. Issue #32 asks ``sync`` for 2,000 metric rows/s; this says what the
stack itself allows here: the same request to a bare Starlette route under
uvicorn that only decodes it and answers (the ceiling), to the local
platform's route (its own cost: auth, the guard, the fault layer, SQLite),
and through the SDK's client (its own cost: the deadline-bounded read, the
error mapping), each one request at a time and several in flight, with the
CPU per row of the client and of the server: what a machine shared with
other work pays, whatever the wall time.

Run from the repository root::

    python tools/bench/request_ceiling.py [--quick]
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import benchlib
import httpx
from benchlib import API_KEY, SERVING, TEAM, Table, cpu_s, local_platform, parse_args, print_tables

from primeruns.platform import PlatformClient, Settings

WIDTHS = (1, 4, 8)
_FLOOR = 2_000.0  # metric rows/s, issue #32
_PATH = "/api/v1/rft/metrics"

# The ceiling: the route (``_PATH``) decodes the body and answers as the platform does.
_ECHO = (
    """
import json, sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
import uvicorn

async def metrics(request):
    body = json.loads(await request.body())
    return JSONResponse({"run_id": body["run_id"], "step": body["metrics"].get("step"),
                         "status": "ok"})

app = Starlette(routes=[Route("/api/v1/rft/metrics", metrics, methods=["POST"])])
# h11, as serve runs (primeruns/local/cli.py), even where httptools is installed.
config = uvicorn.Config(app, host="127.0.0.1", port=0, http="h11", log_level="warning",
                        access_log=False)
"""
    + SERVING
)


@contextmanager
def echo_server() -> Iterator[tuple[str, int]]:
    """The bare server: (its origin, its pid)."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                log.seek(0)
                found = re.search(rb"listening on (http://\S+)", log.read())
                if found:
                    yield found.group(1).decode(), proc.pid
                    return
                time.sleep(0.05)
            raise SystemExit("the bare echo server did not start")
        finally:
            proc.terminate()
            proc.wait(10)


def _rows(run_id: str, first: int, n: int) -> list[dict[str, Any]]:
    return [
        {"run_id": run_id, "metrics": {"loss": i * 0.001, "step": i, "_timestamp": time.time()}}
        for i in range(first, first + n)
    ]


def measure(
    post: Callable[[dict[str, Any]], object],
    rows: list[dict[str, Any]],
    width: int,
    server_pid: int,
) -> tuple[float, float, float]:
    """(rows/s, client CPU ms/row, server CPU ms/row) of posting ``rows``."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    served = cpu_s(server_pid)
    t0 = time.perf_counter()
    if width == 1:
        for row in rows:
            post(row)
    else:
        with ThreadPoolExecutor(width) as pool:
            list(pool.map(post, rows))
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    client = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    n = len(rows)
    return n / seconds, client / n * 1000, (cpu_s(server_pid) - served) / n * 1000


def bound(client_ms: float, server_ms: float) -> float:
    """Rows/s with each process alone on an idle core: its CPU per row bounds it."""
    return 1000.0 / max(client_ms, server_ms, 1e-6)


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    n = 300 if quick else 1_000
    t = Table(
        f"Request ceiling: {n:,} metrics rows, one per request, by requests in flight",
        [
            "server",
            "client",
            "in flight",
            "rows/s",
            "÷ bare echo",
            "client CPU ms/row",
            "server CPU ms/row",
            "CPU-bound rows/s",
        ],
    )
    ceiling: dict[int, float] = {}
    bounds: list[float] = []
    with echo_server() as (origin, pid), httpx.Client() as http:
        for width in WIDTHS:
            rate, client, server = measure(
                lambda row: http.post(origin + _PATH, json=row).json(), _rows("r", 0, n), width, pid
            )
            ceiling[width] = rate
            t.add(
                "bare echo",
                "httpx",
                width,
                f"{rate:,.0f}",
                "1.00",
                f"{client:.2f}",
                f"{server:.2f}",
                f"{bound(client, server):,.0f}",
            )
            bounds.append(bound(client, server))
    with tempfile.TemporaryDirectory() as tmp, local_platform(Path(tmp) / "platform") as platform:
        settings = Settings(
            api_key=API_KEY,
            origin=platform.url,
            api_prefix="/api/v1",
            internal=False,
            team_id=TEAM,
            traces_url=platform.url,
            frontend_url=platform.url,
            traces_opt_out=True,
        )
        sdk = PlatformClient(settings)
        run_id = sdk.api(
            "POST",
            "/rft/external-runs",
            {"base_model": "m", "team_id": TEAM, "max_steps": 1, "name": "ceiling"},
        )
        run_id = run_id["run"]["id"]
        headers = {"Authorization": f"Bearer {API_KEY}"}
        first = 0
        with httpx.Client(headers=headers) as http:
            clients: list[tuple[str, Callable[[dict[str, Any]], object]]] = [
                ("httpx", lambda row: http.post(platform.url + _PATH, json=row).json()),
                ("the SDK's", lambda row: sdk.api("POST", "/rft/metrics", row)),
            ]
            for name, post in clients:
                for width in WIDTHS:
                    rows = _rows(run_id, first, n)
                    first += n
                    rate, client, server = measure(post, rows, width, platform.pid)
                    t.add(
                        "local platform",
                        name,
                        width,
                        f"{rate:,.0f}",
                        f"{rate / ceiling[width]:.2f}",
                        f"{client:.2f}",
                        f"{server:.2f}",
                        f"{bound(client, server):,.0f}",
                    )
        sdk.close()
    best, cpu_best = max(ceiling.values()), max(bounds)
    t.notes.append(
        f"the bare echo: at best {best:,.0f} rows/s measured, {cpu_best:,.0f} CPU-bound; "
        f"issue #32 asks {_FLOOR:,.0f} rows/s of sync "
        f"({benchlib.verdict(cpu_best, _FLOOR, at_least=True)} for the bare stack: "
        "one row per request, httpx against uvicorn with h11 and asyncio)"
    )
    t.notes.append(
        "CPU-bound rows/s: 1000 ÷ the larger of the client's and the server's CPU ms per "
        "row, what each process alone on an idle core could do (the client's threads "
        "share one interpreter lock, the server is one event loop)"
    )
    t.notes.append(
        "CPU ms/row: the client process's and the server's CPU per row; rows/s on a machine "
        "shared with other work is bound by waiting for a core, the CPU is not"
    )
    return [t]


def main() -> None:
    args = parse_args(__doc__)
    print_tables(run(args.quick))


if __name__ == "__main__":
    main()
