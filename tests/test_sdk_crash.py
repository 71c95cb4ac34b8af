"""A producer killed with SIGKILL loses nothing its ``log_*`` calls returned for."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from sdk_helpers import kill_producer, point_at

from primeruns.journal import EntryKind, Journal

HERE = Path(__file__).resolve().parent


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
    path, acked = kill_producer([str(runs), kind, str(n), lp.url], rng.randrange(1, n))
    ids, steps = _journaled(path)
    logged_ids = [line.split(" ", 1)[1] for line in acked if line.startswith("episode ")]
    logged_steps = [int(line.split(" ", 1)[1]) for line in acked if line.startswith("metrics ")]
    assert logged_ids, "the producer was killed before it logged anything"
    assert ids[: len(logged_ids)] == logged_ids  # all present, in order, no gaps
    assert steps[: len(logged_steps)] == logged_steps
