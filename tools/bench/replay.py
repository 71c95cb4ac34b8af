"""Replay: ship a backlog journal (``primeruns replay``) vs one-stream upload.

Run ``python tools/bench/replay.py`` (``--quick``: a 2,000-episode backlog
instead of 20,000) from the repository root. It builds the backlog as
``backlog.py`` does (platform down while episodes are logged), then starts the
local platform on the very port the run was pointed at and times
``primeruns.ship.backlog.ship_journal`` (what ``primeruns replay`` runs): register
the run, ship every sink (Prime Traces and the evaluation sample table),
finalize.

Reference (DESIGN §7: "one-stream upload of the same requests, both sinks"),
in the same run against the same server, on one ``httpx.Client`` connection,
one request after the other, nothing else of the SDK in the timed part:

- Prime Traces: the same episodes (with other ids, so nothing is deduplicated
  against the replay) as one JSONL stream, POSTed to ``/api/v1/traces`` as
  multipart requests of ~30 MiB, uncompressed;
- the evaluation sample table: the same episodes' v0 sample rows, made before
  the clock starts by the sample sink's own ``EvalSamplesSink.prepare`` (the
  bodies it would send) for an evaluation the reference creates for itself
  (untimed), in the very batch sizes the replay's sink sent (recorded during
  the replay), each POSTed to ``/api/v1/evaluations/{id}/samples``.

The traces-only reference (the first part alone, timed on its own) is kept as
an extra row. Replay does more than the reference: it also reads the journal
back (importing it into its sync journal first), stamps each record with its
run, gzips the traces body, reads the table's length before each push, and
registers and finalizes the run. After the run, both evaluations are read back:
each must hold every row. Budget (DESIGN §7): replay ≥ 0.8× the both-sinks
one-stream rate. CPU seconds are process CPU (user + system) of this process
(replay, reference client) and of the server, per phase.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import benchlib
import httpx
import orjson
from backlog import make_backlog
from benchlib import API_KEY, Table

from primeruns.journal import Entry, EntryKind
from primeruns.local import LocalPlatform
from primeruns.platform.binding import Binding
from primeruns.ship.backlog import ship_journal
from primeruns.sinks.eval_samples import EvalSamplesSink

_BATCH_BYTES = 30 * 1024 * 1024


@dataclass(frozen=True)
class Timed:
    """One timed phase: wall seconds, this process's CPU and the server's."""

    wall_s: float
    cpu_s: float
    server_cpu_s: float


def _traces_batches(lines: Sequence[bytes]) -> list[bytes]:
    """The JSONL lines as ~30 MiB uploads."""
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
    return batches


def _sample_pushes(lines: Sequence[bytes], eval_id: str, sizes: Sequence[int]) -> list[bytes]:
    """The bodies the sample sink sends for ``lines`` (episode records) to
    evaluation ``eval_id``, in pushes of ``sizes`` episodes each: made by the
    sink's own ``prepare``, numbering its rollouts on from push to push."""
    sink = EvalSamplesSink(None)  # type: ignore[arg-type]  # prepare never sends
    binding = Binding(run_id=eval_id, kind="eval")
    bodies: list[bytes] = []
    start = 0
    for size in sizes:
        entries = [
            Entry(seq=start + i + 1, kind=EntryKind.EPISODE, payload=line)
            for i, line in enumerate(lines[start : start + size])
        ]
        prepared = sink.prepare(entries, binding)
        if prepared is None or prepared.records != size:
            raise RuntimeError(f"the sample sink took {prepared and prepared.records} of {size}")
        if prepared.carry is not None:
            sink.restore(prepared.carry)
        bodies.append(prepared.body)
        start += size
    return bodies


def _record_push_sizes() -> tuple[list[int], Any]:
    """Record the rows of each push the sample sink sends (the batch sizes
    the reference uses); returns (sizes, undo)."""
    sizes: list[int] = []
    original = EvalSamplesSink.send

    def send(self: EvalSamplesSink, body: bytes, ctx: Any) -> None:
        original(self, body, ctx)
        sizes.append(len(ctx.progress.sample_ids))

    EvalSamplesSink.send = send  # type: ignore[method-assign]

    def undo() -> None:
        EvalSamplesSink.send = original  # type: ignore[method-assign]

    return sizes, undo


def _timed(server: LocalPlatform, work: Any) -> Timed:
    s0, c0, t0 = benchlib.cpu_s(server.pid), time.process_time(), time.perf_counter()
    work()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Timed(wall, cpu, benchlib.cpu_s(server.pid) - s0)


def one_stream(
    server: LocalPlatform, n: int, push_sizes: Sequence[int]
) -> tuple[Timed, Timed, int, str, int]:
    """Upload ``n`` episodes to both sinks, one request after another on one
    connection; (traces part, sample part, raw bytes, the reference's
    evaluation id, its rows)."""
    url = server.url
    base = benchlib.records("gsm8k-eval")
    lines = [
        orjson.dumps(benchlib.renew_ids(base[i % len(base)], f"stream-{i:08d}")) for i in range(n)
    ]
    batches = _traces_batches(lines)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    traces_headers = {**auth, "X-Prime-Line-Format": "episode"}
    json_headers = {**auth, "Content-Type": "application/json"}
    with httpx.Client(timeout=300.0) as client:
        created = client.post(
            f"{url}/api/v1/evaluations/",
            json={"name": "bench-one-stream", "environments": [{"id": "gsm8k"}]},
            headers=auth,
        )
        created.raise_for_status()
        eval_id = str(created.json()["evaluation_id"])
        pushes = _sample_pushes(lines, eval_id, push_sizes)
        rows = sum(len(orjson.loads(body)["samples"]) for body in pushes)
        del lines
        samples_path = f"{url}/api/v1/evaluations/{eval_id}/samples"

        def upload_traces() -> None:
            for jsonl in batches:
                key = "sha256:" + hashlib.sha256(jsonl).hexdigest()
                response = client.post(
                    f"{url}/api/v1/traces",
                    headers={**traces_headers, "Idempotency-Key": key},
                    files={
                        "metadata": (None, b'{"schema_version": 1}', "application/json"),
                        "traces": ("traces.jsonl", jsonl, "application/x-ndjson"),
                    },
                )
                response.raise_for_status()

        def push_samples() -> None:
            for body in pushes:
                client.post(samples_path, content=body, headers=json_headers).raise_for_status()

        traces = _timed(server, upload_traces)
        samples = _timed(server, push_samples)
    return traces, samples, sum(len(b) for b in batches), eval_id, rows


def _stored_rows(server: LocalPlatform, eval_id: str) -> int:
    """The rows the server's sample table holds for ``eval_id``."""
    response = httpx.get(
        f"{server.url}/api/v1/evaluations/{eval_id}",
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60.0,
    )
    response.raise_for_status()
    return int(response.json()["total_samples"])


def run(quick: bool, repeat: int | None = None) -> list[Table]:
    n = 2000 if quick else 20_000
    with benchlib.isolated_env(None) as scratch:
        backlog = make_backlog(scratch, n)
        os.environ["PRIME_API_KEY"] = API_KEY  # replay takes the key from the environment
        server = LocalPlatform(scratch / "platform", port=backlog.port)
        server.start()
        try:
            os.environ["PRIME_TRACES_URL"] = server.url
            sizes, undo = _record_push_sizes()
            reports: list[Any] = []
            try:
                replay = _timed(
                    server, lambda: reports.append(ship_journal(backlog.journal, timeout=600))
                )
            finally:
                undo()
            report = reports[0]
            if not report.ok or report.run_id is None:
                raise RuntimeError(f"replay did not finish cleanly: {report}")
            stored = server.run(report.run_id)
            landed = (stored.get("traces") or {}).get("distinct_episodes")
            if landed != n:
                raise RuntimeError(f"replay landed {landed} of {n} episodes")
            if sum(sizes) != n:
                raise RuntimeError(f"the replay's sample pushes held {sum(sizes)} of {n} episodes")
            traces, samples, stream_bytes, eval_id, rows = one_stream(server, n, sizes)
            replay_rows = _stored_rows(server, report.run_id)
            stream_rows = _stored_rows(server, eval_id)
            if replay_rows != rows or stream_rows != rows:
                raise RuntimeError(
                    f"sample rows stored: replay {replay_rows}, reference {stream_rows}, "
                    f"of {rows} each"
                )
        finally:
            server.stop()
    both_s = traces.wall_s + samples.wall_s
    ratio = both_s / replay.wall_s
    traces_ratio = traces.wall_s / replay.wall_s
    table = Table(
        f"Replay: ship a {n:,}-episode backlog vs one-stream upload of the same requests",
        [
            "path",
            "records/s",
            "÷ one stream (both sinks)",
            "÷ traces only",
            "seconds",
            "CPU s (client)",
            "CPU s (server)",
        ],
    )
    table.add(
        "primeruns replay (ship_journal)",
        f"{n / replay.wall_s:.0f}",
        f"{ratio:.2f} {benchlib.verdict(ratio, 0.8, at_least=True)}",
        f"{traces_ratio:.2f}",
        f"{replay.wall_s:.2f}",
        f"{replay.cpu_s:.2f}",
        f"{replay.server_cpu_s:.2f}",
    )
    table.add(
        "one stream, both sinks (httpx: traces ~30 MiB + sample pushes)",
        f"{n / both_s:.0f}",
        "1.00",
        "-",
        f"{both_s:.2f}",
        f"{traces.cpu_s + samples.cpu_s:.2f}",
        f"{traces.server_cpu_s + samples.server_cpu_s:.2f}",
    )
    table.add(
        "one stream, traces only (httpx multipart, ~30 MiB)",
        f"{n / traces.wall_s:.0f}",
        "-",
        "1.00",
        f"{traces.wall_s:.2f}",
        f"{traces.cpu_s:.2f}",
        f"{traces.server_cpu_s:.2f}",
    )
    table.notes += [
        f"one stream: {stream_bytes / 1e6:.0f} MB of traces JSONL in ~30 MiB uploads, then "
        f"{len(sizes)} sample pushes ({rows:,} rows) in the replay sink's batch sizes; "
        "one connection",
        "replay includes its journal import, register + finalize; one run; "
        "CPU: process user + system time",
        f"verified on the server: {n:,} distinct episodes in Prime Traces from the replay; "
        f"{rows:,} sample rows in each evaluation (replay's and reference's)",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    args = benchlib.parse_args(__doc__, argv)
    benchlib.print_tables(run(args.quick, args.repeat))


if __name__ == "__main__":
    main()
