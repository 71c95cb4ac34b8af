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
from primeruns.ship.backlog import _damaged_and_final


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


class _GoneProducer:
    """A copy's origin whose producer cannot be asked about (another host)."""

    def producer_state(self) -> str:
        return "unknown"


def test_a_final_copys_look_for_damage_keeps_nothing_per_entry(tmp_path: Path) -> None:
    """Before a final copy is imported, its damage is looked for from every
    entry's checksum (``backlog._damaged_and_final``). That look kept the
    intact entries' seqs too (``Journal.checksums``: eight bytes an entry,
    unread there), so its memory grew with the copy: a megabyte per
    120,000 entries, held to the end of the scan."""
    entries = 150_000  # their seqs: 1.2 MB
    with Journal.create(tmp_path, local_id="run") as j:
        for start in range(0, entries, 10_000):
            j.append(EntryKind.METRICS, [b'{"step": %d}' % i for i in range(start, start + 10_000)])
    with Journal.open(tmp_path / "run", owner=False) as copy:
        tracemalloc.start()
        try:
            damage = _damaged_and_final(
                copy, tmp_path / "run", _GoneProducer(), tmp_path / "root", job_ended=True
            )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert damage == []
    assert peak < 600_000, f"the look for damage held {peak / 2**20:.1f} MB at once"
