"""A producer killed with SIGKILL loses nothing its ``log_*`` calls returned for."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdk_helpers import point_at

from primeruns.journal import EntryKind, Journal

HERE = Path(__file__).resolve().parent


def _kill_after(
    args: list[str], lines_before_kill: int, env: dict[str, str]
) -> tuple[Path, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "producer_script.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    journal_line = proc.stdout.readline().strip()
    assert journal_line.startswith("journal "), journal_line
    acked: list[str] = []
    for _ in range(lines_before_kill):
        line = proc.stdout.readline()
        if not line:
            break
        acked.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)
    # Lines printed after the last one read were acknowledged too: keep them.
    rest = proc.stdout.read()  # through the buffered reader: communicate() would
    proc.stdout.close()  # read the raw pipe and skip what readline() buffered
    proc.wait(timeout=30)
    acked.extend(line.strip() for line in rest.splitlines() if line.strip())
    return Path(journal_line.split(" ", 1)[1]), acked


def _journaled(path: Path) -> tuple[list[str], list[int]]:
    journal = Journal.open(path, owner=False)
    try:
        eps = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6, max_bytes=1 << 34)
        mets = journal.read(0, kinds={EntryKind.METRICS}, max_entries=10**6, max_bytes=1 << 34)
        assert not eps.damaged and not mets.damaged
        ids = [json.loads(e.payload)["id"] for e in eps.entries]
        steps = [json.loads(e.payload)["step"] for e in mets.entries]
        return ids, steps
    finally:
        journal.close()


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_mid_run_loses_nothing_that_was_logged(
    seed: int, make_local_platform: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lp = make_local_platform(latency_ms=5)
    runs = point_at(monkeypatch, tmp_path, lp.url)
    rng = random.Random(seed)
    kind = "train" if seed % 2 else "eval"
    n = 40 if kind == "train" else 150
    path, acked = _kill_after(
        [str(runs), kind, str(n), lp.url], rng.randrange(1, n), dict(os.environ)
    )
    ids, steps = _journaled(path)
    logged_ids = [line.split(" ", 1)[1] for line in acked if line.startswith("episode ")]
    logged_steps = [int(line.split(" ", 1)[1]) for line in acked if line.startswith("metrics ")]
    assert logged_ids, "the producer was killed before it logged anything"
    assert ids[: len(logged_ids)] == logged_ids  # all present, in order, no gaps
    assert steps[: len(logged_steps)] == logged_steps
