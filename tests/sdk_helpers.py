"""Helpers shared by the SDK tests: an isolated environment pointed at a local
platform, and waits on real conditions (never fixed sleeps)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import procs
import pytest

API_KEY = "test-key-0123456789"


def point_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str | None) -> Path:
    """Isolate settings from the machine (HOME, PRIME_* variables) and point the
    SDK at ``url``. Returns the runs directory to pass as ``runs_dir``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    for var in (
        "PRIME_API_KEY",
        "PRIME_API_BASE_URL",
        "PRIME_BASE_URL",
        "PRIME_TEAM_ID",
        "PRIME_TRACES_URL",
        "PRIME_TRACES_OPT_OUT",
        "PRIME_RUNS_MODE",
        "PRIME_RUNS_DIR",
        "XDG_STATE_HOME",  # the sync journals live under it
    ):
        monkeypatch.delenv(var, raising=False)
    # Short backoff so fault-injection tests finish quickly; the policy is the same.
    monkeypatch.setenv("PRIME_RUNS_RETRY_BASE_S", "0.02")
    if url is not None:
        monkeypatch.setenv("PRIME_TRACES_URL", url)
    runs = tmp_path / "runs"
    return runs


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def gated_interpreter(tmp_path: Path) -> tuple[Path, Path]:
    """(a stand-in for this interpreter, its gate file): the stand-in waits
    until the gate exists, as an interpreter still in its start-up and
    imports, then becomes the interpreter with its arguments."""
    gate = tmp_path / "gate"
    stand_in = tmp_path / "python-gated"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "deadline = time.monotonic() + 300  # a gate the test never opens fails, not hangs\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    if time.monotonic() > deadline:\n"
        "        sys.exit('gated interpreter: the gate never opened')\n"
        "    time.sleep(0.01)  # a start-up that has not got this far\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
    )
    stand_in.chmod(0o700)
    return stand_in, gate


class GatedSys:
    """``sys`` as ``primeruns.ship.link`` sees it, with the gated stand-in as
    its interpreter: only the uplink process is held, not every child this
    process starts with ``sys.executable`` (the journal listing's probe, a
    local platform)."""

    def __init__(self, stand_in: Path) -> None:
        self.executable = str(stand_in)

    def __getattr__(self, name: str) -> Any:
        return getattr(sys, name)


def held_uplink_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Uplink processes this process starts from now on are held in their
    start-up until the returned gate file exists (``gated_interpreter``).
    Touch the gate at the end of the test: a process still held then goes
    on as the uplink."""
    import primeruns.ship.link as link

    stand_in, gate = gated_interpreter(tmp_path)
    monkeypatch.setattr(link, "sys", GatedSys(stand_in))
    return gate


def kill_the_uplink(run: Any) -> None:
    """SIGKILL a live run's uplink process alone (an out-of-memory kill, a
    cleanup of stray processes), once it has begun, and wait for its exit."""
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    wait_for(uplink.begun, timeout=60, what="the uplink process to begin")
    assert uplink.pid is not None
    os.kill(uplink.pid, signal.SIGKILL)
    uplink.wait_exit(30)


TESTS = Path(__file__).resolve().parent


def kill_producer(
    args: list[str], lines_before_kill: int, *, whole_job: bool = True
) -> tuple[Path, list[str]]:
    """Run tests/producer_script.py, SIGKILL it after that many acknowledged
    lines (``whole_job``: with its uplink, as a scheduler kills a job; else
    the producer alone, as an out-of-memory kill does); returns its journal
    and every line it printed (all acknowledged)."""
    proc = procs.start(
        [sys.executable, str(TESTS / "producer_script.py"), *args],
        stdin=subprocess.PIPE,  # never written: it waits there, unfinished, for the kill
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ),
        cwd=TESTS,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    assert first.startswith("journal "), first
    acked: list[str] = []
    for _ in range(lines_before_kill):
        line = proc.stdout.readline()
        if not line:
            break
        acked.append(line.strip())
    if whole_job:
        procs.kill_job(proc)  # uplink and all: replay has work to do
    else:
        os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()  # through the buffered reader: communicate() would
    proc.stdout.close()  # read the raw pipe and skip what readline() buffered
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)
    acked.extend(line.strip() for line in rest.splitlines() if line.strip())
    return Path(first.split(" ", 1)[1]), acked


def _stored(data_dir: Path, column: str, table: str, run_id: str) -> list[Any]:
    """One column of the local platform's rows for ``run_id``, read-only."""
    uri = f"file:{data_dir / 'platform.sqlite3'}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        query = f"SELECT {column} FROM {table} WHERE run_id = ?"
        return [r[0] for r in conn.execute(query, (run_id,))]
    finally:
        conn.close()


def closed_after_every_record(data_dir: Path, run_id: str) -> bool:
    """Whether the local platform closed the training run after it stored the
    last of its records (traces, metric rows, confirmed sample objects)."""
    conn = sqlite3.connect(f"file:{data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        (closed,) = conn.execute(
            "SELECT completed_at FROM train_runs WHERE id = ?", (run_id,)
        ).fetchone()
        latest = [
            conn.execute(query, (run_id,)).fetchone()[0]
            for query in (
                "SELECT max(ingested_at) FROM traces WHERE run_id = ?",
                "SELECT max(received_at) FROM train_metrics WHERE run_id = ?",
                "SELECT max(confirmed_at) FROM objects WHERE run_id = ?",
            )
        ]
    finally:
        conn.close()
    return closed is not None and all(t is not None and t <= closed for t in latest)


def platform_episode_ids(data_dir: Path, run_id: str) -> Counter[str]:
    """Every episode id the local platform stored for ``run_id``, with multiplicity."""
    return Counter(str(v) for v in _stored(data_dir, "episode_id", "episodes", run_id))


def platform_trace_ids(data_dir: Path, run_id: str) -> Counter[str]:
    """Every trace id the local platform stored for ``run_id``, with multiplicity."""
    return Counter(str(v) for v in _stored(data_dir, "trace_id", "traces", run_id))


def platform_metric_steps(data_dir: Path, run_id: str) -> Counter[int]:
    """Every training metrics step stored for ``run_id``, with multiplicity."""
    return Counter(int(v) for v in _stored(data_dir, "step", "train_metrics", run_id))
