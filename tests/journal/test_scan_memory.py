"""A full scan for damage holds a bounded part of the journal at a time:
``primeruns sync`` of a finished copy scans every entry before it ships, and
what the scan held stayed in the process's memory for the whole sync."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

from primeruns.journal import EntryKind, Journal
from primeruns.journal.maintenance import SCAN_BYTES


def test_a_scan_for_damage_holds_a_bounded_part_of_a_large_journal(tmp_path: Path) -> None:
    rng = random.Random(7)
    size = 0
    with Journal.create(tmp_path, local_id="run") as j:
        # Episodes of ~100 KB each, five times the scan's bound in all.
        while size < 5 * SCAN_BYTES:
            payload = json.dumps({"noise": rng.randbytes(50_000).hex()}).encode()
            j.append(EntryKind.EPISODE, [payload])
            size += len(payload)
    with Journal.open(tmp_path / "run", owner=False) as j:
        tracemalloc.start()
        try:
            assert j.damage() == []
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # A read holds its entries' stored and decoded forms at once: ~2.5x.
    assert peak < 3 * SCAN_BYTES, f"the scan held {peak / 2**20:.0f} MB at once"
