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


def _peak_of_a_scan(path: Path) -> int:
    """The most the full scan of the journal at ``path`` (finding no damage) held at once."""
    with Journal.open(path, owner=False) as j:
        tracemalloc.start()
        try:
            assert j.damage() == []
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def test_a_scan_for_damage_holds_a_bounded_part_of_a_large_journal(tmp_path: Path) -> None:
    rng = random.Random(7)
    size = 0
    with Journal.create(tmp_path, local_id="run") as j:
        # Episodes of ~100 KB each, five times the scan's bound in all.
        while size < 5 * SCAN_BYTES:
            payload = json.dumps({"noise": rng.randbytes(50_000).hex()}).encode()
            j.append(EntryKind.EPISODE, [payload])
            size += len(payload)
    peak = _peak_of_a_scan(tmp_path / "run")
    # A read holds its entries' stored and decoded forms at once: ~2.5x.
    assert peak < 3 * SCAN_BYTES, f"the scan held {peak / 2**20:.0f} MB at once"


def test_a_scan_of_large_entries_holds_one_of_them_at_a_time(tmp_path: Path) -> None:
    """A read of ``SCAN_BYTES`` returns one entry at least, however large:
    ``show --full`` checks a journal of a few large episodes by decoding
    each. The scan held the read before while the next one decoded, and
    the decode a second copy of the stored bytes: three times an entry."""
    rng = random.Random(7)
    entry_bytes = 2 * SCAN_BYTES
    with Journal.create(tmp_path, local_id="run") as j:
        for _ in range(3):
            j.append(EntryKind.EPISODE, [rng.randbytes(entry_bytes // 2).hex().encode()])
    peak = _peak_of_a_scan(tmp_path / "run")
    # One entry decoded and its stored form (hex: zstd halves it): ~1.5x.
    assert peak < 1.75 * entry_bytes, f"the scan held {peak / 2**20:.0f} MB at once"
