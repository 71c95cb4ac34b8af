"""Reading a long journal holds a bounded part of it in memory, not all of it.

LMDB maps the whole file, and every page a read touches stays resident in
the reading process until the map goes: ``show``'s checksum scan of a 200 MB
journal, its probe child's walk, or a shipper going through a long backlog
each held the whole file (``show`` of a 100,000-step run peaked at 249 MB,
where the issue's bound is 150 MB). Long reads now drop the map every
``REMAP_AFTER_BYTES`` (the probe every ``_REMAP_AFTER_BYTES``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from mapped import resident_bytes

from primeruns.journal import Damage, EntryKind, Journal, journal_info, probe, txn
from primeruns.journal.reading import Reader
from primeruns.reports import load_rows

MIB = 1 << 20


@pytest.fixture
def long_journal(tmp_path: Path) -> Path:
    """A journal of ~24 MiB on disk (hex digits: zstd halves them), all in LMDB."""
    with Journal.create(tmp_path / "runs") as journal:
        for _ in range(48):
            payloads = [os.urandom(64 << 10).hex().encode() for _ in range(8)]
            journal.append(EntryKind.EPISODE, payloads)
        path = journal.path
    assert (path / "data.mdb").stat().st_size > 20 * MIB
    return path


def test_a_scan_of_a_long_journal_keeps_a_bounded_part_of_it_resident(
    long_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txn, "REMAP_AFTER_BYTES", 2 * MIB, raising=False)
    data = long_journal / "data.mdb"
    peak = [0]
    read = Reader.read

    def watched(self: Reader, *args: object, **kwargs: object) -> object:
        result = read(self, *args, **kwargs)  # type: ignore[arg-type]
        peak[0] = max(peak[0], resident_bytes(data))
        return result

    monkeypatch.setattr(Reader, "read", watched)
    with Journal.open(long_journal, owner=False) as journal:
        scan = journal.checksums()
        for seq in range(1, 385, 8):
            assert journal.get(seq) is not None
        after = resident_bytes(data)
    assert not scan.damage and len(scan.seqs[EntryKind.EPISODE]) == 384
    # Each read copies out up to 8 MiB (the scan's own bound), so the map
    # holds at most that plus the 2 MiB between drops, never the 24 MiB file.
    assert peak[0] <= 12 * MIB, f"{peak[0] / MIB:.1f} MiB of the journal resident during a scan"
    assert after <= 4 * MIB, f"{after / MIB:.1f} MiB resident after 48 single reads"


def _peak_between_drops(data: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The most of ``data`` found resident when a transaction ended, before
    the drop of the map it may make (``count_read``), as it goes; the drop
    made every 2 MiB read."""
    monkeypatch.setattr(txn, "REMAP_AFTER_BYTES", 2 * MIB, raising=False)
    peak = [0]
    count_read = txn.Transactions.count_read

    def watched(self: txn.Transactions, nbytes: int) -> None:
        peak[0] = max(peak[0], resident_bytes(data))
        count_read(self, nbytes)

    monkeypatch.setattr(txn.Transactions, "count_read", watched)
    return peak


@pytest.mark.parametrize("scan", ["checksums", "tally"])
def test_no_transaction_of_a_scan_holds_the_journal_resident_before_the_map_is_dropped(
    scan: str, long_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The map is dropped between transactions (``count_read``), so what one
    reads stays resident until it ends. ``show``'s checksum scan (its bound
    counted only entries copied out: it checks them in place) and the count
    of entries by kind (``show``, ``ls``) each went over the whole journal
    in one transaction: a journal of a few large entries was all resident."""
    peak = _peak_between_drops(long_journal / "data.mdb", monkeypatch)
    with Journal.open(long_journal, owner=False) as journal:
        getattr(journal, scan)()
    # A checksum read goes over up to 8 MiB (the scan's bound, in decoded
    # bytes: hex, half that stored), a count 2 MiB; never the 24 MiB file.
    assert peak[0] <= 12 * MIB, f"{peak[0] / MIB:.1f} MiB of the journal resident in a {scan}"


@pytest.fixture
def large_entries(tmp_path: Path) -> Path:
    """A crashed run's journal (no finish) of 16 episodes of 1 MiB stored
    each, then one metrics row."""
    with Journal.create(tmp_path / "runs") as journal:
        for _ in range(16):
            journal.append(EntryKind.EPISODE, [os.urandom(MIB).hex().encode()])
        journal.append(EntryKind.METRICS, [b'{"step": 1, "loss": 0.5}'])
        return journal.path


def test_a_listing_of_a_journal_of_large_entries_keeps_a_bounded_part_of_it_resident(
    large_entries: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing (``ls``, ``show``) looks for the run's finish among its last
    16 entries, passing over the others by their headers; but each one passed
    over is paged in whole (py-lmdb touches a value's pages as it hands it
    out), and the one read held 16 large episodes resident at once."""
    peak = _peak_between_drops(large_entries / "data.mdb", monkeypatch)
    info = journal_info(large_entries, tally=True)
    assert info.finish is None and info.last_seq == 17 and not info.damage
    # Between two drops: 2 MiB gone over, and an entry (1 MiB stored) or two.
    assert peak[0] <= 6 * MIB, f"{peak[0] / MIB:.1f} MiB of the journal resident in a listing"


def test_a_read_of_one_kind_past_large_entries_of_others_keeps_a_bounded_part_resident(
    large_entries: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``show`` reads a run's metric rows (a shipper its kinds) passing over
    the episodes between them by their headers, each paged in whole all the
    same: a read ended its transaction only after 50,000 entries, and held
    a journal of large episodes resident whole to find one row."""
    peak = _peak_between_drops(large_entries / "data.mdb", monkeypatch)
    with Journal.open(large_entries, owner=False) as journal:
        damage: list[Damage] = []
        assert load_rows(journal, {EntryKind.METRICS}, damage) == [{"step": 1, "loss": 0.5}]
        assert damage == []
    assert peak[0] <= 6 * MIB, f"{peak[0] / MIB:.1f} MiB of the journal resident in a read"


def test_the_probe_child_walks_a_long_journal_holding_a_bounded_part_of_it(
    long_journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "_REMAP_AFTER_BYTES", 2 * MIB)
    data = long_journal / "data.mdb"
    peaks: list[int] = []
    walk_some = probe._walk_some

    def watched(*args: object) -> object:
        start = walk_some(*args)  # type: ignore[arg-type]
        peaks.append(resident_bytes(data))
        return start

    monkeypatch.setattr(probe, "_walk_some", watched)
    probe._walk(str(long_journal))  # what the child runs, here to look inside
    assert len(peaks) > 5 and max(peaks) <= 6 * MIB, [p // MIB for p in peaks]


_GROW = """
import lmdb, os, sys
env = lmdb.open(sys.argv[1], map_size=256 << 20, max_dbs=4)
db = env.open_db(b"entries")
with env.begin(write=True) as txn:
    for i in range(int(sys.argv[2]), int(sys.argv[3])):
        txn.put(b"%08d" % i, os.urandom(4000), db=db)
env.close()
"""


def _grow(directory: Path, first: int, last: int) -> None:
    subprocess.run([sys.executable, "-c", _GROW, str(directory), str(first), str(last)], check=True)


def test_the_probe_walk_reads_a_journal_another_process_grows_meanwhile_as_healthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal's uplink or a listing probes a journal its run is still
    writing. The walk is now many transactions, each table's first one begun
    after the tables before it were walked (seconds, on a long journal): a
    writer that grew the file past the walker's map meanwhile made that begin
    fail with MapResizedError: the probe called a healthy journal damaged (it
    is then salvaged from a page scan), or, where the failing begin was the
    table's opening, passed over the table as a plain key and never read
    it, so a damaged page there went unseen."""
    _grow(tmp_path, 0, 100)
    env = lmdb.open(str(tmp_path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v", db=env.open_db(b"meta", txn=txn))
    env.close()
    walk_some = probe._walk_some
    tables = []

    def writer_meanwhile(*args: object) -> object:
        start = walk_some(*args)  # type: ignore[arg-type]
        if start is None:
            tables.append(args[1])
            if len(tables) == 1:  # the end of "entries": 20 MB more of it
                _grow(tmp_path, 100, 5100)
        return start

    monkeypatch.setattr(probe, "_walk_some", writer_meanwhile)
    probe._walk(str(tmp_path))  # what the child runs
    assert len(tables) == 2, "the meta table was never walked"


def test_many_single_reads_spread_over_a_long_journal_keep_a_bounded_part_resident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``show`` samples 2,000 metric rows evenly over a long run, a read of
    one small row each. Each read faults pages in around the row (Linux maps
    up to 64 KiB around a fault, and a look goes down the tree) but counted
    only the row's bytes as read: the map was never dropped, and ``show`` of
    a 100,000-step run held most of its 200 MB journal (peak 191 MB; the
    issue's bound is 150 MB)."""
    monkeypatch.setattr(txn, "REMAP_AFTER_BYTES", 512 << 10, raising=False)
    with Journal.create(tmp_path / "runs") as journal:
        for _ in range(40):  # small entries that do not compress: ~10 MiB of leaf pages
            journal.append(EntryKind.METRICS, [os.urandom(120).hex().encode() for _ in range(1000)])
        path, last = journal.path, journal.last_seq()
    data = path / "data.mdb"
    assert data.stat().st_size > 8 * MIB
    peak = 0
    with Journal.open(path, owner=False) as journal:
        for seq in range(1, last + 1, last // 500):
            read = journal.read(seq - 1, kinds={EntryKind.METRICS}, max_entries=1)
            assert [entry.seq for entry in read.entries] == [seq]
            peak = max(peak, resident_bytes(data))
    assert peak <= 2 * MIB, f"{peak / MIB:.1f} MiB of the journal resident in single reads"
