"""The training sample table's Parquet objects are untrusted: a Parquet bomb
(a tiny object that decodes to a huge table) is refused at confirm, a read
of a stored one decodes only what it shows, and honest objects read as
before (every page, the distributions, the dashboard's step page)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile import PARQUET_BOMB_ROWS as BOMB_ROWS
from hostile import PARQUET_BOMB_VALUE as BOMB_VALUE
from hostile import parquet_bomb as long_value_bomb

from primeruns.local import LocalPlatform, parquet_bounds
from primeruns.local.app import build_app
from primeruns.local.errors import PlatformError
from primeruns.local.parquet_bounds import (
    MAX_OBJECT_DECODED_BYTES,
    MAX_OBJECT_ROWS,
    column_histogram,
    read_rows,
)
from primeruns.local.rft_reads import histogram
from primeruns.local.settings import ServerSettings
from primeruns.projection import train_sample_schema

MIB = 1024 * 1024
#: One 64 KiB value repeated by a dictionary: 20,000 rows decode to 1.25
#: GiB, past MAX_OBJECT_DECODED_BYTES, from a 60 KB object (its sample ids;
#: without them it is 521 bytes).


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _parquet(table: pa.Table, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kwargs)
    return buf.getvalue()


def honest_rows(count: int, *, first: int = 0, odd: bool = False) -> list[dict[str, Any]]:
    """Rows of the SDK's schema (``train_sample_schema``), unique text per row
    as a trajectory has; the first rewards null (and, ``odd``, NaN and an
    infinity, which a histogram skips and JSON cannot carry)."""
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    rewards: list[float | None] = [None, math.nan, -math.inf] if odd else [None, None, 1.5]
    return [
        {
            "run_id": "r",
            "step": 0,
            "tag": "",
            "problem_id": i // 4,
            "sample_id": i,
            "prompt": "",
            "completion": json.dumps([{"role": "assistant", "content": f"answer {i}"}]),
            "trajectory": json.dumps([{"completion": "c" * (i % 50), "n": i}]),
            "answer": "",
            "env_name": "env",
            "task": "t",
            "info": "{}",
            "reward": rewards[i] if i < 3 else (i % 17) / 16 - 0.3,
            "advantage": (i % 5) - 2.0,
            "metrics": "{}",
            "timing": "{}",
            "num_input_tokens": 200,
            "num_output_tokens": i,
            "created_at": created,
        }
        for i in range(first, first + count)
    ]


def honest_object(rows: list[dict[str, Any]], **kwargs: Any) -> bytes:
    table = pa.Table.from_pylist(rows, schema=train_sample_schema())
    options = {"compression": "snappy", "use_dictionary": True, "write_statistics": True}
    return _parquet(table, **{**options, **kwargs})


class Run:
    """An external training run on a platform, and its sample objects."""

    def __init__(self, platform: LocalPlatform) -> None:
        self.platform = platform
        self.api = httpx.Client(base_url=f"{platform.url}/api/v1", timeout=120)
        body = {"base_model": "m", "max_steps": 1, "team_id": "t"}
        self.id: str = self.api.post("/rft/external-runs", json=body).json()["run"]["id"]

    def upload(self, blob: bytes, step: int = 0) -> tuple[str, str]:
        presigned = self.api.post("/rft/samples/presign", json={"run_id": self.id, "step": step})
        data = presigned.json()["data"]
        put = httpx.put(data["presignedUrl"], content=blob, timeout=120)
        assert put.status_code == 200, put.text
        return data["presignedUrl"], data["s3Key"]

    def confirm(self, key: str, step: int = 0) -> httpx.Response:
        body = {"run_id": self.id, "step": step, "s3_key": key}
        return self.api.post("/rft/samples/confirm", json=body)

    def store(self, blob: bytes, step: int = 0) -> str:
        _, key = self.upload(blob, step)
        r = self.confirm(key, step)
        assert r.status_code == 200, r.text
        return key

    def samples(self, **params: Any) -> dict[str, Any]:
        r = self.api.get(f"/rft/runs/{self.id}/samples", params={"step": 0, **params})
        assert r.status_code == 200, r.text
        got: dict[str, Any] = r.json()
        return got


@pytest.fixture
def run(local_platform: LocalPlatform) -> Iterator[Run]:
    r = Run(local_platform)
    yield r
    r.api.close()


def _refusal(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    message: str = r.json()["detail"]
    return message


def test_a_parquet_bomb_is_refused_at_confirm_naming_the_cap_and_cheaply(run: Run) -> None:
    """A 60 KB object whose one dictionary value repeats to 1.25 GiB: before,
    confirm took it and a read of one page cost 7.6 s of CPU and 3.7 GB."""
    blob = long_value_bomb()
    assert len(blob) < 64 * 1024
    _, key = run.upload(blob)
    pid = run.platform.pid
    before, cpu = _peak_rss(pid), _cpu_seconds(pid)
    message = _refusal(run.confirm(key))
    assert f"MAX_OBJECT_DECODED_BYTES={MAX_OBJECT_DECODED_BYTES}" in message
    # Counted from the dictionary's indices, never decoded to strings.
    assert _peak_rss(pid) - before < 200 * MIB
    assert _cpu_seconds(pid) - cpu < 2
    assert run.samples()["total"] == 0


def test_an_object_of_more_rows_than_an_sdk_step_is_refused_from_its_footer(run: Run) -> None:
    blob = _parquet(
        pa.table({"reward": pa.array([0.0] * (MAX_OBJECT_ROWS + 1))}), compression="zstd"
    )
    _, key = run.upload(blob)
    message = _refusal(run.confirm(key))
    assert f"MAX_OBJECT_ROWS={MAX_OBJECT_ROWS}" in message and str(MAX_OBJECT_ROWS + 1) in message


def test_a_nested_column_is_refused(run: Run) -> None:
    """A list's one row could repeat a dictionary value without bound."""
    blob = _parquet(pa.table({"completion": pa.array([["a", "b"]])}))
    _, key = run.upload(blob)
    assert "nested column 'completion" in _refusal(run.confirm(key))


def test_a_confirmed_object_is_not_swapped_for_an_unchecked_one(run: Run) -> None:
    """The presigned URL lives an hour: a PUT after confirm must not replace
    what confirm checked. A resend of the same bytes (a retry) is taken."""
    rows = honest_rows(5)
    blob = honest_object(rows)
    url, key = run.upload(blob)
    assert run.confirm(key).status_code == 200
    swapped = httpx.put(url, content=long_value_bomb(), timeout=60)
    assert swapped.status_code == 409, swapped.text
    assert httpx.put(url, content=blob, timeout=60).status_code == 200
    assert run.confirm(key).status_code == 200
    assert [r["sample_id"] for r in run.samples()["samples"]] == list(range(5))


def test_a_put_while_confirm_checks_the_object_does_not_replace_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Confirm measures an object it cannot prove small off the event loop,
    then marks it confirmed: a PUT to the same URL meanwhile (a retry, or
    whoever holds the hour-long URL) replaced the checked object with a
    bomb, and the bomb was marked confirmed. The PUT now waits for the
    confirm, then finds the object confirmed (409)."""
    checked = honest_object(honest_rows(5), compression="zstd")  # measured, not proven
    measuring, go = threading.Event(), threading.Event()
    measure = parquet_bounds._measure

    def held(source: Any, meta: Any, key: str) -> None:
        measuring.set()
        go.wait(60)  # released below, once the PUT has gone as far as it can
        measure(source, meta, key)

    monkeypatch.setattr(parquet_bounds, "_measure", held)
    app = build_app(ServerSettings(data_dir=tmp_path / "platform"))

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as c:
            body = {"base_model": "m", "max_steps": 1, "team_id": "t"}
            run_id = (await c.post("/api/v1/rft/external-runs", json=body)).json()["run"]["id"]
            minted = await c.post("/api/v1/rft/samples/presign", json={"run_id": run_id, "step": 0})
            url, key = minted.json()["data"]["presignedUrl"], minted.json()["data"]["s3Key"]
            assert (await c.put(url, content=checked)).status_code == 200
            confirm = {"run_id": run_id, "step": 0, "s3_key": key}
            confirming = asyncio.create_task(c.post("/api/v1/rft/samples/confirm", json=confirm))
            await asyncio.to_thread(measuring.wait, 60)
            putting = asyncio.create_task(c.put(url, content=long_value_bomb()))
            for _ in range(1000):  # the PUT's turns of the loop: done, or waiting for confirm
                if putting.done():
                    break
                await asyncio.sleep(0)
            go.set()
            return await confirming, await putting

    try:
        confirmed, put = asyncio.run(scenario())
    finally:
        go.set()
        app.state.ctx.db.close()
    assert confirmed.status_code == 200, confirmed.text
    assert put.status_code == 409, put.text
    (stored,) = (tmp_path / "platform" / "objects").glob("*.parquet")
    assert stored.read_bytes() == checked


def test_only_a_small_footer_is_parsed_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Confirm checks an SDK object on the server's event loop (a hop to a
    thread cost more, once per training step of a sync), but a file under
    1 MiB can carry a large footer (thousands of row groups: 15-25 ms to
    parse, every other request waiting): that one is parsed in a thread."""
    import threading as _threading

    from primeruns.local import rft

    loop_thread: list[int] = []
    parsed_on: list[tuple[str, bool]] = []
    checked = rft.checked_rows

    def watched(path: Path, key: str, *, measure: bool = True) -> int | None:
        on_loop = _threading.get_ident() in loop_thread
        parsed_on.append(("loop" if on_loop else "thread", measure))
        return checked(path, key, measure=measure)

    monkeypatch.setattr(rft, "checked_rows", watched)
    sdk_object = honest_object(honest_rows(5))
    many_groups = _parquet(pa.table({"reward": [0.5] * 2000}), row_group_size=1)
    assert len(many_groups) < rft.INLINE_CHECK_BYTES
    assert parquet_bounds.footer_bytes(_written(tmp_path, many_groups)) > rft.INLINE_FOOTER_BYTES
    app = build_app(ServerSettings(data_dir=tmp_path / "platform"))

    async def scenario() -> list[int]:
        loop_thread.append(_threading.get_ident())
        transport = httpx.ASGITransport(app=app)
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://local") as c:
            body = {"base_model": "m", "max_steps": 1, "team_id": "t"}
            run_id = (await c.post("/api/v1/rft/external-runs", json=body)).json()["run"]["id"]
            for blob in (sdk_object, many_groups):
                minted = await c.post(
                    "/api/v1/rft/samples/presign", json={"run_id": run_id, "step": 0}
                )
                url, key = minted.json()["data"]["presignedUrl"], minted.json()["data"]["s3Key"]
                assert (await c.put(url, content=blob)).status_code == 200
                confirm = {"run_id": run_id, "step": 0, "s3_key": key}
                confirmed = await c.post("/api/v1/rft/samples/confirm", json=confirm)
                statuses.append(confirmed.status_code)
        return statuses

    try:
        assert asyncio.run(scenario()) == [200, 200]
    finally:
        app.state.ctx.db.close()
    assert parsed_on == [("loop", False), ("thread", True)]


def _written(tmp_path: Path, blob: bytes) -> Path:
    path = tmp_path / "object.parquet"
    path.write_bytes(blob)
    return path


def _store_unchecked(run: Run, blob: bytes, rows: int) -> None:
    """An object confirmed as a platform before the bounds would have."""
    _, key = run.upload(blob)
    with sqlite3.connect(run.platform.data_dir / "platform.sqlite3") as db:
        db.execute("UPDATE objects SET confirmed_at = 1, rows = ? WHERE key = ?", (rows, key))


def test_a_page_of_a_stored_bomb_costs_a_page(run: Run) -> None:
    """Stored before the bounds: a page decodes only its rows (before: the
    whole 1.25 GiB, 7.6 s of CPU, 3.7 GB peak), the distributions only their
    column (before: 3.0 s, 4.2 GB), the dashboard's step page its page
    (before: 7.3 s, 3.7 GB)."""
    _store_unchecked(run, long_value_bomb(), BOMB_ROWS)
    pid = run.platform.pid
    before, cpu = _peak_rss(pid), _cpu_seconds(pid)
    page = run.samples(limit=10, page=3)
    assert page["total"] == BOMB_ROWS
    assert [r["sample_id"] for r in page["samples"]] == list(range(20, 30))
    assert len(page["samples"][0]["completion"]) == BOMB_VALUE
    dist = run.api.get(f"/rft/runs/{run.id}/distributions", params={"step": 0}).json()
    assert dist["bins"] == [{"min": 0.5, "max": 0.5, "count": BOMB_ROWS}]
    step_page = httpx.get(f"{run.platform.url}/dashboard/training/{run.id}/steps/0", timeout=60)
    assert step_page.status_code == 200
    assert _peak_rss(pid) - before < 200 * MIB
    assert _cpu_seconds(pid) - cpu < 2


def _old_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """What the reads gave before the bounds: every object decoded whole."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows += pq.read_table(path).to_pylist()
    return rows


def _honest_objects(tmp_path: Path) -> list[Path]:
    """Three objects of one step: one row group, several small row groups,
    and one written without dictionaries (plain pages)."""
    blobs = [
        honest_object(honest_rows(23)),
        honest_object(honest_rows(57, first=23), row_group_size=10),
        honest_object(honest_rows(9, first=80), use_dictionary=False, compression="zstd"),
    ]
    paths = []
    for i, blob in enumerate(blobs):
        path = tmp_path / f"object-{i}.parquet"
        path.write_bytes(blob)
        paths.append(path)
    return paths


def test_every_page_of_honest_objects_reads_as_before(tmp_path: Path) -> None:
    paths = _honest_objects(tmp_path)
    old = _old_rows(paths)
    for counted in (True, False):
        objects = [(p, pq.read_metadata(p).num_rows if counted else None) for p in paths]
        for limit in (1, 7, 10, 23, 100, None):
            for offset in range(0, len(old) + 2, 3 if limit else 1):
                shown, total = read_rows(objects, offset, limit)
                end = None if limit is None else offset + limit
                assert (shown, total) == (old[offset:end], len(old)), (offset, limit)


def test_the_distributions_of_honest_objects_are_as_before(tmp_path: Path) -> None:
    paths = _honest_objects(tmp_path)
    old = _old_rows(paths)
    for column in ("reward", "advantage", "num_output_tokens", "completion", "missing"):
        assert column_histogram(paths, column, 10) == histogram([r.get(column) for r in old])
    odd = tmp_path / "odd.parquet"
    odd.write_bytes(honest_object(honest_rows(40, odd=True), row_group_size=16))
    rows = _old_rows([odd, *paths])
    assert column_histogram([odd, *paths], "reward", 10) == histogram([r["reward"] for r in rows])
    single = tmp_path / "single.parquet"
    single.write_bytes(honest_object([{**r, "reward": 2.5} for r in honest_rows(4)]))
    assert column_histogram([single], "reward", 10) == [{"min": 2.5, "max": 2.5, "count": 4}]


def test_honest_objects_read_over_http_as_before(run: Run, tmp_path: Path) -> None:
    """The samples route, its paging and the distributions answer what they
    answered when every object was decoded whole."""
    paths = _honest_objects(tmp_path)
    for path in paths:
        run.store(path.read_bytes())
    old = [
        {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
        for row in _old_rows(paths)
    ]
    for limit, page in ((100, 1), (10, 3), (7, 4), (25, 4), (1000, 1), (10, 20)):
        got = run.samples(limit=limit, page=page)
        assert got["samples"] == json.loads(json.dumps(old[(page - 1) * limit : page * limit]))
        assert (got["total"], got["total_pages"]) == (len(old), math.ceil(len(old) / limit))
    dist = run.api.get(f"/rft/runs/{run.id}/distributions", params={"type": "advantages"})
    assert dist.json()["bins"] == histogram([r["advantage"] for r in old])
    step_page = httpx.get(
        f"{run.platform.url}/dashboard/training/{run.id}/steps/0", params={"page": 2}, timeout=60
    )
    assert step_page.status_code == 200


def _repeating(encoding: str, compression: str, rows: int, value: int) -> bytes:
    """``rows`` copies of one ``value``-byte string, repeated by ``encoding``."""
    if encoding == "DELTA_BYTE_ARRAY":
        table = pa.table({"completion": pa.array(["a" * value] * rows)})
        options: dict[str, Any] = {
            "use_dictionary": False,
            "column_encoding": {"completion": encoding},
        }
        return _parquet(table, compression=compression, **options)
    if encoding == "dictionary":
        return long_value_bomb(rows, value, compression)
    text = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value]))
    return _parquet(pa.table({"completion": text}), compression=compression)


ENCODINGS = ["DELTA_BYTE_ARRAY", "dictionary", "arrow dictionary"]


@pytest.mark.parametrize("compression", ["zstd", "snappy", "none"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_each_encoding_that_repeats_a_value_for_free_is_counted_as_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str, compression: str
) -> None:
    """A DELTA_BYTE_ARRAY value is its predecessor's prefix; a dictionary one
    an index (read back as strings, or as Arrow's dictionary when the file
    stores its Arrow schema): each is counted as the bytes it decodes to,
    under a cap lowered to 8 MiB so the object stays small to write, in a
    codec of unbounded ratio (zstd) and in those the file's size bounds."""
    monkeypatch.setattr(parquet_bounds, "MAX_OBJECT_DECODED_BYTES", 8 * MIB)
    rows, value = 200, 64 * 1024  # 12.5 MiB decoded
    path = tmp_path / "object.parquet"
    path.write_bytes(_repeating(encoding, compression, rows, value))
    assert path.stat().st_size < 128 * 1024
    with pytest.raises(PlatformError) as refused:
        parquet_bounds.checked_rows(path, "k")
    assert refused.value.status == 400
    assert f"MAX_OBJECT_DECODED_BYTES={8 * MIB}" in refused.value.message
    monkeypatch.setattr(parquet_bounds, "MAX_OBJECT_DECODED_BYTES", 16 * MIB)
    assert parquet_bounds.checked_rows(path, "k") == rows


def test_an_sdk_object_is_proven_small_from_its_size_without_decoding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An SDK object (a few snappy rows) is bounded by rows x what its file
    can decompress to, so confirm does not decode it; a zstd one is measured."""

    def measured(*_: Any) -> None:
        raise AssertionError("decoded")

    path = tmp_path / "object.parquet"
    path.write_bytes(honest_object(honest_rows(5)))
    monkeypatch.setattr(parquet_bounds, "_measure", measured)
    assert parquet_bounds.checked_rows(path, "k") == 5
    path.write_bytes(honest_object(honest_rows(5), compression="zstd"))
    with pytest.raises(AssertionError, match="decoded"):
        parquet_bounds.checked_rows(path, "k")


@pytest.mark.parametrize("compression", ["snappy", "none"])
@pytest.mark.parametrize("encoding", [*ENCODINGS, "plain"])
def test_the_size_bound_is_never_below_what_an_object_decodes_to(
    tmp_path: Path, encoding: str, compression: str
) -> None:
    """The bound that spares the decode holds for the objects that repeat a
    value most cheaply (one long value of a single letter, and many rows of
    an empty one) and for plain text."""
    cases = [(200, 64 * 1024), (50_000, 0), (3, 1)]
    for rows, value in cases:
        if encoding == "plain":
            table = pa.table({"completion": pa.array([os.urandom(value).hex()] * rows)})
            blob = _parquet(table, compression=compression, use_dictionary=False)
        else:
            blob = _repeating(encoding, compression, rows, value)
        path = tmp_path / "object.parquet"
        path.write_bytes(blob)
        meta = pq.read_metadata(path)
        decoded = pq.read_table(path).get_total_buffer_size()
        bound = parquet_bounds._size_bound(parquet_bounds._chunks(meta), len(blob))
        assert bound is not None and bound >= decoded, (rows, value)
