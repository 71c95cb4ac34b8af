"""What a Parquet bomb, and an honest sample object, cost the local platform.

Starts a local platform in a temporary folder, uploads one training sample
object (presign, PUT, confirm) and reads it back (a page of samples, the
distributions, the last page, the dashboard's step page), printing for each
the server process's CPU time (``/proc/PID/stat``) and peak RSS (VmHWM).
``bomb`` is a 60 KB zstd object whose one 64 KiB value a dictionary repeats
over 20,000 rows (1.25 GiB decoded); refused at confirm, it is then marked
confirmed in the database, as a platform before the bounds stored it, so its
reads are measured too. ``honest`` is the SDK's schema, ROWS rows::

    PYTHONPATH=. python3 tools/security/parquet_bomb.py bomb
    PYTHONPATH=. python3 tools/security/parquet_bomb.py honest [ROWS]

Against an older tree: ``git archive REV primeruns | tar -x -C OLD`` and
``PYTHONPATH=OLD python3 tools/security/parquet_bomb.py ...`` (run from a
folder other than this checkout, so that its own package is not imported).
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from primeruns.local import LocalPlatform
from primeruns.projection import train_sample_schema

BOMB_ROWS, BOMB_VALUE = 20_000, 64 * 1024


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bomb(rows: int = BOMB_ROWS, value: int = BOMB_VALUE, compression: str = "zstd") -> bytes:
    """A dictionary column of one long value in every row, zstd, without the
    Arrow schema (so a reader decodes it to plain strings), plus the columns
    the step page shows (the tests' bomb too: ``tests/local/hostile.py``)."""
    text = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value]))
    table = pa.table(
        {
            "completion": text,
            "sample_id": pa.array(range(rows)),
            "problem_id": pa.array([0] * rows),
            "reward": pa.array([0.5] * rows),
            "advantage": pa.array([0.0] * rows),
            "env_name": pa.array(["e"] * rows),
            "num_input_tokens": pa.array([1] * rows),
            "num_output_tokens": pa.array([1] * rows),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression=compression, store_schema=False)
    return buf.getvalue()


def honest(rows: int) -> bytes:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    step = json.dumps([{"prompt": "p" * 800, "completion": "c" * 1200}])
    records = [
        {
            "run_id": "r",
            "step": 0,
            "tag": "",
            "problem_id": i // 8,
            "sample_id": i,
            "prompt": "",
            "completion": json.dumps([{"role": "assistant", "content": f"answer {i} " * 40}]),
            "trajectory": step + str(i),
            "answer": "",
            "env_name": "env",
            "task": "t",
            "info": "{}",
            "reward": (i % 17) / 16,
            "advantage": (i % 5) - 2.0,
            "metrics": "{}",
            "timing": "{}",
            "num_input_tokens": 200,
            "num_output_tokens": 300,
            "created_at": created,
        }
        for i in range(rows)
    ]
    buf = io.BytesIO()
    table = pa.Table.from_pylist(records, schema=train_sample_schema())
    pq.write_table(table, buf, compression="snappy", use_dictionary=True, write_statistics=True)
    return buf.getvalue()


def main(argv: list[str]) -> None:
    mode = argv[0] if argv else "bomb"
    rows = BOMB_ROWS if mode == "bomb" else int(argv[1]) if len(argv) > 1 else 4000
    blob = bomb() if mode == "bomb" else honest(rows)
    repeats = 1 if mode == "bomb" else 20
    with tempfile.TemporaryDirectory() as folder, LocalPlatform(Path(folder)) as platform:
        pid = platform.pid
        api = httpx.Client(base_url=f"{platform.url}/api/v1", timeout=600)
        body = {"base_model": "m", "max_steps": 1, "team_id": "t"}
        run = api.post("/rft/external-runs", json=body).json()["run"]["id"]
        data = api.post("/rft/samples/presign", json={"run_id": run, "step": 0}).json()["data"]
        assert httpx.put(data["presignedUrl"], content=blob, timeout=600).status_code == 200
        print(f"{mode}: object {len(blob)} bytes; VmHWM {peak_rss_mb(pid):.0f} MB")
        cpu = cpu_seconds(pid)
        confirmed = api.post(
            "/rft/samples/confirm", json={"run_id": run, "step": 0, "s3_key": data["s3Key"]}
        )
        print(
            f"confirm: {confirmed.status_code} {confirmed.text[-110:]}; "
            f"{cpu_seconds(pid) - cpu:.2f} s CPU; VmHWM {peak_rss_mb(pid):.0f} MB"
        )
        if confirmed.status_code != 200:
            with sqlite3.connect(Path(folder) / "platform.sqlite3") as db:
                db.execute(
                    "UPDATE objects SET confirmed_at = 1, rows = ? WHERE key = ?",
                    (rows, data["s3Key"]),
                )
            print("(marked confirmed in the database, as stored before the bounds)")
        last = (rows + 99) // 100
        reads = {
            "samples page 1 (10 rows)": f"/api/v1/rft/runs/{run}/samples?step=0&limit=10",
            "distributions": f"/api/v1/rft/runs/{run}/distributions?step=0",
            "samples last page (100 rows)": f"/api/v1/rft/runs/{run}/samples?step=0&page={last}",
            "dashboard step page": f"/dashboard/training/{run}/steps/0",
        }
        for name, path in reads.items():
            cpu, wall = cpu_seconds(pid), time.perf_counter()
            for _ in range(repeats):
                answer = httpx.get(platform.url + path, timeout=600)
            spent = (cpu_seconds(pid) - cpu) / repeats * 1000
            took = (time.perf_counter() - wall) / repeats * 1000
            print(
                f"{name}: {answer.status_code}, {len(answer.content)} bytes; {spent:.1f} ms CPU,"
                f" {took:.1f} ms wall a read; VmHWM {peak_rss_mb(pid):.0f} MB"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
