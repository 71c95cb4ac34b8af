"""Replay: ship a backlog journal (``primeruns replay``) vs one-stream upload.

Run ``python tools/bench/replay.py`` (``--quick``: a 2,000-episode backlog
instead of 20,000) from the repository root. It builds the backlog as
``backlog.py`` does (platform down while episodes are logged), then starts the
local platform on the very port the run was pointed at and times
``primeruns.ship.backlog.ship_journal`` (what ``primeruns replay`` runs): register
the run, ship every sink, finalize.

Reference, in the same run against the same server: the same episodes (with
other ids, so nothing is deduplicated against the replay) as one JSONL stream,
POSTed to ``/api/v1/traces`` by plain ``httpx`` multipart requests of ~30 MiB,
uncompressed, one after the other. Replay does more than that reference: it
also reads the journal back (decompressing every entry), stamps each record
with its run, gzips the wire body, and writes the eval sample table (a second
sink) alongside. Budget (DESIGN §7): replay ≥ 0.8× the one-stream rate.
"""

from __future__ import annotations

import hashlib
import os
import time

import benchlib
import httpx
import orjson
from backlog import make_backlog
from benchlib import API_KEY, Table

from primeruns.local import LocalPlatform
from primeruns.ship.backlog import ship_journal

_BATCH_BYTES = 30 * 1024 * 1024


def one_stream(url: str, n: int) -> tuple[float, int]:
    """Upload ``n`` episodes as sequential ~30 MiB multipart POSTs; (seconds, raw bytes)."""
    base = benchlib.records("gsm8k-eval")
    lines: list[bytes] = []
    for i in range(n):
        lines.append(orjson.dumps(benchlib.renew_ids(base[i % len(base)], f"stream-{i:08d}")))
    batches: list[bytes] = []
    current: list[bytes] = []
    size = 0
    for line in lines:
        if current and size + len(line) + 1 > _BATCH_BYTES:
            batches.append(b"\n".join(current) + b"\n")
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        batches.append(b"\n".join(current) + b"\n")
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Prime-Line-Format": "episode"}
    t0 = time.perf_counter()
    with httpx.Client(timeout=300.0) as client:
        for jsonl in batches:
            key = "sha256:" + hashlib.sha256(jsonl).hexdigest()
            response = client.post(
                f"{url}/api/v1/traces",
                headers={**headers, "Idempotency-Key": key},
                files={
                    "metadata": (None, b'{"schema_version": 1}', "application/json"),
                    "traces": ("traces.jsonl", jsonl, "application/x-ndjson"),
                },
            )
            response.raise_for_status()
    return time.perf_counter() - t0, sum(len(b) for b in batches)


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    n = 2000 if quick else 20_000
    with benchlib.isolated_env(None) as scratch:
        backlog = make_backlog(scratch, n)
        os.environ["PRIME_API_KEY"] = API_KEY  # replay takes the key from the environment
        server = LocalPlatform(scratch / "platform", port=backlog.port)
        server.start()
        try:
            os.environ["PRIME_TRACES_URL"] = server.url
            t0 = time.perf_counter()
            report = ship_journal(backlog.journal, timeout=600)
            replay_s = time.perf_counter() - t0
            if not report.ok or report.run_id is None:
                raise RuntimeError(f"replay did not finish cleanly: {report}")
            stored = server.run(report.run_id)
            landed = (stored.get("traces") or {}).get("distinct_episodes")
            if landed != n:
                raise RuntimeError(f"replay landed {landed} of {n} episodes")
            stream_s, stream_bytes = one_stream(server.url, n)
        finally:
            server.stop()
    ratio = (n / replay_s) / (n / stream_s)
    table = Table(
        f"Replay: ship a {n:,}-episode backlog vs one-stream upload of the same records",
        ["path", "records/s", "MB/s (raw JSON)", "÷ one stream", "seconds"],
    )
    table.add(
        "primeruns replay (ship_journal)",
        f"{n / replay_s:.0f}",
        f"{backlog.raw_bytes / replay_s / 1e6:.1f}",
        f"{ratio:.2f} {benchlib.verdict(ratio, 0.8, at_least=True)}",
        f"{replay_s:.2f}",
    )
    table.add(
        "one stream (httpx multipart, ~30 MiB)",
        f"{n / stream_s:.0f}",
        f"{stream_bytes / stream_s / 1e6:.1f}",
        "1.00",
        f"{stream_s:.2f}",
    )
    table.notes += [
        "replay also writes the eval sample table and includes register + finalize; one run",
        f"replay verified on the server: {n:,} distinct episodes in Prime Traces",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
