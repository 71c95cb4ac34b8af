"""Per-request latency of the local platform on one kept-alive connection.

Why it exists: every end-to-end figure, the demo, the test suite and
``primeruns replay`` against the local platform are sums of request round
trips. A stall in the server's socket handling (Nagle's algorithm meeting the
client's delayed ACK costs ~40 ms a request) multiplies all of them, and hides
behind the SDK's own costs unless it is measured alone. The reference is a
bare socket round trip to the same server (``GET /healthz`` on a fresh
connection is not it: the point is the kept-alive case the SDK uses).

Run from the repository root::

    python tools/bench/request_latency.py [--quick]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import TEAM, Table, local_platform, parse_args, print_tables


def _timed(call: object, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append(time.perf_counter() - t0)
    return samples


def run(quick: bool = False) -> list[Table]:
    n = 50 if quick else 300
    table = Table(
        "Local platform: one request on a kept-alive connection (httpx.Client)",
        ["request", "p50 ms", "p99 ms", "budget", "met"],
    )
    with tempfile.TemporaryDirectory() as tmp, local_platform(Path(tmp) / "platform") as lp:
        headers = {"Authorization": "Bearer bench-key-0123456789"}
        with httpx.Client(base_url=lp.url, headers=headers, timeout=10.0) as client:
            created = client.post(
                "/api/v1/rft/external-runs",
                json={"name": "latency", "base_model": "m", "team_id": TEAM, "max_steps": n},
            )
            created.raise_for_status()
            run_id = created.json()["run"]["id"]
            steps = iter(range(10**6))

            def health() -> None:
                client.get("/healthz").raise_for_status()

            def metrics() -> None:
                body = {"run_id": run_id, "metrics": {"step": next(steps), "loss": 0.5}}
                client.post("/api/v1/rft/metrics", json=body).raise_for_status()

            health()
            for name, call in (("GET /healthz", health), ("POST /api/v1/rft/metrics", metrics)):
                samples = _timed(call, n)
                p50 = statistics.median(samples) * 1e3
                p99 = sorted(samples)[int(len(samples) * 0.99) - 1] * 1e3
                table.add(name, f"{p50:.2f}", f"{p99:.2f}", "< 5 ms", "yes" if p50 < 5 else "no")
    return [table]


if __name__ == "__main__":
    args = parse_args(__doc__)
    print_tables(run(args.quick))
