"""The sync journal: a copied journal's entries imported under their own numbers.

A cluster user copies a runs directory again and again while the job runs;
each sync imports what the newest copy holds beyond what was imported before.
These tests copy real journals with ``shutil.copytree`` (what ``cp -a`` and
rsync leave) and check the imported log against the original, entry by entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from damaging import put_stray
from spooled import power_cut_from

from primeruns.exceptions import JournalError
from primeruns.journal import EntryKind, Journal
from primeruns.journal.frames import HEADER_SIZE
from primeruns.journal.origin import K_ORIGIN, Origin
from primeruns.journal.spool import APPEND
from primeruns.models import CRASH_ERROR
from primeruns.ship import mirror
from primeruns.ship.copies import K_SOURCE_LOSSES
from primeruns.ship.mirror import K_SOURCE_ORIGIN, fingerprint, import_new, open_sync_journal
from primeruns.spec import SPEC_KEY


def _rows(journal: Journal) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    after = 0
    while True:
        result = journal.read(after, max_entries=10_000)
        out.extend((e.seq, int(e.kind), e.payload) for e in result.entries)
        if result.next_after <= after:
            return out
        after = result.next_after


def _log(journal: Journal, start: int, n: int) -> None:
    for i in range(start, start + n):
        kind = EntryKind.EPISODE if i % 3 else EntryKind.METRICS
        journal.append(kind, [json.dumps({"i": i}).encode()])


@contextlib.contextmanager
def _synced(copy: Path, root: Path) -> Iterator[tuple[Journal, Journal, bool]]:
    """(the copy read-only, its sync journal, whether that was created now)."""
    with Journal.open(copy, owner=False) as source:
        sync, created = open_sync_journal(source, root)
        try:
            yield source, sync, created
        finally:
            sync.close()


def _copy(src: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)  # the next copy replaces the last, as rsync would
    shutil.copytree(src, dest)
    return dest


def test_copies_taken_mid_run_import_each_entry_once_under_its_number(tmp_path: Path) -> None:
    producer = Journal.create(tmp_path / "node", meta={"spec": {"kind": "eval", "mode": "offline"}})
    producer.append(EntryKind.RUN_OPEN, [b'{"kind": "eval"}'], essential=True)
    root = tmp_path / "synced"
    imported = 0
    for round_ in range(3):
        _log(producer, round_ * 50, 50)
        producer.sync()
        copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
        with Journal.open(copy, owner=False) as source:
            sync, created = open_sync_journal(source, root)
            assert created == (round_ == 0)
            try:
                done = import_new(source, sync)
                imported += done.entries
                assert done.stopped is None
                assert done.upto == source.last_seq() == sync.last_seq()
            finally:
                sync.close()
    producer.append(EntryKind.FINISH, [b'{"status": "completed"}'], essential=True, final=True)
    producer.sync()
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    with _synced(copy, root) as (source, sync, _):
        assert import_new(source, sync).entries == 1
        assert import_new(source, sync).entries == 0  # nothing new: nothing imported
        assert _rows(sync) == _rows(producer)
        assert sync.local_id == producer.local_id
        assert sync.get_meta("spec") == {"kind": "eval", "mode": "offline"}
        origin = Origin.from_json(sync.get_meta(K_SOURCE_ORIGIN))
        assert origin is not None and origin.path == str(producer.path.absolute())
    producer.close()
    assert imported == 151


def test_an_older_copy_after_a_newer_one_imports_nothing_and_loses_nothing(
    tmp_path: Path,
) -> None:
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 20)
    producer.sync()
    old = _copy(producer.path, tmp_path / "old" / producer.local_id)
    _log(producer, 20, 20)
    producer.sync()
    new = _copy(producer.path, tmp_path / "new" / producer.local_id)
    root = tmp_path / "synced"
    for copy, expect in ((new, 40), (old, 0)):
        with _synced(copy, root) as (source, sync, _):
            assert import_new(source, sync).entries == expect
            assert sync.last_seq() == 40
    producer.close()


def test_the_spec_a_newer_copy_holds_is_kept_and_an_older_copys_is_not(tmp_path: Path) -> None:
    # An evaluation's config edited before finish() is stored in the spec at
    # the finish: the close-out sends it, not the spec of an earlier copy.
    spec = {"kind": "eval", "mode": "offline", "model": "m", "config": {"lr": 1}}
    producer = Journal.create(tmp_path / "node", meta={SPEC_KEY: spec})
    _log(producer, 0, 5)
    producer.sync()
    old = _copy(producer.path, tmp_path / "old" / producer.local_id)
    edited = {**spec, "config": {"lr": 1, "best": 0.9}}
    producer.set_meta(SPEC_KEY, edited)
    _log(producer, 5, 1)
    producer.sync()
    new = _copy(producer.path, tmp_path / "new" / producer.local_id)
    root = tmp_path / "synced"
    for copy in (old, new, old):
        with _synced(copy, root) as (source, sync, _):
            import_new(source, sync)
    with Journal.open(root / producer.local_id, owner=False) as sync:
        assert sync.get_meta(SPEC_KEY) == edited
    producer.close()


def _marked_at_eleven(tmp_path: Path, marker: bytes) -> Journal:
    """A journal of 30 entries whose 11th holds ``marker`` uncompressed (for ``_flip``)."""
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 10)
    producer.append(EntryKind.EPISODE, [b'{"marker": "' + marker + b'"}'])
    _log(producer, 11, 19)
    return producer


def test_a_copy_damaged_at_an_entry_stops_there_and_a_later_copy_fills_it_in(
    tmp_path: Path,
) -> None:
    producer = _marked_at_eleven(tmp_path, b"torn-entry-eleven")
    producer.sync()
    torn = _copy(producer.path, tmp_path / "torn" / producer.local_id)
    _flip(torn, b"torn-entry-eleven")  # as a copy taken mid-write may read
    root = tmp_path / "synced"
    with _synced(torn, root) as (source, sync, _):
        done = import_new(source, sync)
        assert (done.entries, done.upto, done.source_end) == (10, 10, 30)
        assert done.stopped is not None and "entry 11" in done.stopped
    good = _copy(producer.path, tmp_path / "good" / producer.local_id)
    with _synced(good, root) as (source, sync, _):
        assert import_new(source, sync).entries == 20
        assert _rows(sync) == _rows(producer)
    producer.close()


@pytest.mark.parametrize("final", [False, True])
def test_an_entry_damaged_before_a_stray_key_is_where_the_import_stops_or_passes(
    tmp_path: Path, final: bool
) -> None:
    """Found by an adversarial review: a range read lists damage found
    decoding after the damage of the structure its walk met anywhere in the
    read (a key no entry has), and the import took such a key past the
    damaged entry for what stood there. A copy stopped "at entry 11
    (malformed entry key ...)", and a final copy (its producer gone) stopped
    there for good, where it passes over the damaged entry, counted lost,
    and imports the rest."""
    producer = _marked_at_eleven(tmp_path, b"damaged-entry-eleven")
    producer.close()
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    with Journal.open(copy) as moved:
        moved.compact(())  # every entry in LMDB, where the stray key goes
    _flip(copy, b"damaged-entry-eleven")
    with Journal.open(copy) as damaged:
        put_stray(damaged, b"\xff" * 9, b"stray")  # after every entry's key
    with _synced(copy, tmp_path / "synced") as (source, sync, _):
        done = import_new(source, sync, final=final)
    if final:
        assert [d.seq for d in done.passed] == [11] and "entry 11:" in done.passed[0].what
        assert (done.entries, done.upto, done.stopped) == (29, 30, None)
    else:
        assert done.upto == 10 and done.stopped is not None
        assert done.stopped.startswith("entry 11:"), done.stopped


def test_a_copy_whose_newest_spool_segment_is_damaged_stops_there_not_at_its_end(
    tmp_path: Path,
) -> None:
    # The copy's producer was killed with every entry still spooled, and the
    # append of entry 11 is damaged: no entry of the copy says 11 to 30 were
    # there, and taken for the copy's end they were closed out as crashed,
    # uncounted. The import stops at them as at any damage; a later copy
    # fills them in.
    producer = Journal.create(tmp_path / "node")
    producer._mover.stop()
    _log(producer, 0, 10)
    producer.append(EntryKind.EPISODE, [b'{"marker": "appended-eleven"}'])
    _log(producer, 11, 19)
    copy = _copy(producer.path, tmp_path / "damaged" / producer.local_id)
    [segment] = copy.glob("spool-*")
    raw = bytearray(segment.read_bytes())
    at = raw.find(b'{"marker": "appended-eleven"}') - HEADER_SIZE - APPEND.size
    raw[at] ^= 0xFF  # the magic of its append
    segment.write_bytes(bytes(raw))
    root = tmp_path / "synced"
    with _synced(copy, root) as (source, sync, _):
        assert source.last_seq() == 10
        done = import_new(source, sync)
        assert (done.entries, done.upto, done.source_end) == (10, 10, 30)
        assert done.stopped is not None and "20 entries" in done.stopped
    producer._mover.start()
    good = _copy(producer.path, tmp_path / "good" / producer.local_id)
    with _synced(good, root) as (source, sync, _):
        assert import_new(source, sync).entries == 20
        assert _rows(sync) == _rows(producer)
    producer.close()


def _flip(directory: Path, marker: bytes) -> None:
    """Flip one byte of ``marker`` wherever the copy stores it (LMDB or the spool)."""
    hits = 0
    for path in directory.rglob("*"):
        if not path.is_file():
            continue
        raw = bytearray(path.read_bytes())
        at = raw.find(marker)
        if at >= 0:
            raw[at] ^= 0x01
            path.write_bytes(bytes(raw))
            hits += 1
    assert hits, "the marker is stored uncompressed somewhere in the copy"


def test_a_copy_that_was_shipping_hands_over_its_offsets_once(tmp_path: Path) -> None:
    producer = Journal.create(tmp_path / "node", meta={"platform": {"run_id": "r1"}})
    _log(producer, 0, 30)
    producer.sync()
    producer.ack("traces", 20)
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    with _synced(copy, tmp_path / "synced") as (_source, sync, _):
        assert sync.cursor("traces").acked == 20
        assert sync.get_meta("platform") == {"run_id": "r1"}
        assert sync.last_seq() == 30
    producer.close()


def test_a_copy_whose_uplink_compacted_what_it_shipped_hands_over_the_rest(
    tmp_path: Path,
) -> None:
    # Found by an adversarial review: an online run whose node died with a
    # backlog (its uplink too), the entries every sink acknowledged
    # compacted away under its byte budget. Its copy, synced with
    # --job-ended, was refused for good as if taken mid-write ("copy the
    # journal again once its job has ended"): its backlog was never shipped
    # nor counted lost.
    producer = Journal.create(tmp_path / "node", meta={"platform": {"run_id": "r1"}})
    _log(producer, 0, 30)
    producer.sync()
    producer.ack("traces", 20)
    assert producer.compact(["traces"]) == 20
    producer.sync()
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    with _synced(copy, tmp_path / "synced") as (_source, sync, _):
        assert sync.cursor("traces").acked == 20
        assert sync.last_seq() == 30
        assert [seq for seq, _, _ in _rows(sync)] == list(range(21, 31))
    producer.close()


def test_the_producer_counted_losses_are_carried_over_as_they_grow(tmp_path: Path) -> None:
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 5)
    producer.record_loss("journal", 3, "the journal was full")
    root = tmp_path / "synced"
    for extra in (0, 4):
        if extra:
            producer.record_loss("journal", extra, "the journal was full")
        producer.sync()
        copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
        with _synced(copy, root) as (source, sync, _):
            import_new(source, sync)
            assert sync.losses()["journal"]["count"] == 3 + extra
    producer.close()


def test_a_carried_loss_count_that_is_no_count_carried_nothing(tmp_path: Path) -> None:
    """A journal is untrusted input, and its meta is handed to the sync
    journal made from it: a negative count of what was carried over
    (``sync.source_losses``) made the import count more records lost than
    the copy's producer had (3 - -5: 8). It carried nothing: 3 are lost."""
    producer = Journal.create(tmp_path / "node", meta={K_SOURCE_LOSSES: {"journal": -5}})
    _log(producer, 0, 5)
    producer.record_loss("journal", 3, "the journal was full")
    producer.close()
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    with _synced(copy, tmp_path / "synced") as (source, sync, _):
        import_new(source, sync)
        assert sync.losses()["journal"]["count"] == 3
        assert sync.get_meta(K_SOURCE_LOSSES) == {"journal": 3}


def test_losses_a_repaired_copy_brought_are_not_counted_again_by_a_later_copy(
    tmp_path: Path,
) -> None:
    """Found by an adversarial review: a damaged copy of a finished run
    became its sync journal rebuilt (``adopt_repaired``), with the losses its
    producer counted; the next copy of the same journal carried those losses
    over again, and the run reported twice the records lost that were."""
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 10)
    producer.append(EntryKind.EPISODE, [b'{"marker": "damaged-entry-eleven"}'])
    _log(producer, 11, 9)
    producer.record_loss("journal", 3, "the journal was full")
    producer.close()
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    _flip(copy, b"damaged-entry-eleven")
    root = tmp_path / "synced"
    origin = Origin.read_beside(copy)
    assert origin is not None
    with mirror.snapshot(copy, root) as taken:
        with Journal.open(taken, owner=False) as source:
            end = source.last_seq()
        sync = mirror.adopt_repaired(taken, copy, origin, root, producer.local_id, end)
    try:
        assert sync.losses()["journal"]["count"] == 3
        again = _copy(producer.path, tmp_path / "login" / producer.local_id)
        with Journal.open(again, owner=False) as source:
            import_new(source, sync)
        assert sync.losses()["journal"]["count"] == 3
    finally:
        sync.close()


@pytest.mark.parametrize("value", [None, 1, "x", [], {"host": 1}, {"host": "h", "pid": "1"}])
def test_a_malformed_origin_reads_as_none(value: object) -> None:
    assert Origin.from_json(value) is None


def test_a_new_journal_records_where_it_was_written(tmp_path: Path) -> None:
    with Journal.create(tmp_path) as journal:
        origin = Origin.from_json(journal.get_meta(K_ORIGIN))
        assert origin is not None
        assert origin.is_original(journal.path)
        assert not origin.is_original(tmp_path / "elsewhere")
        assert origin.producer_state() == "alive"  # this process


def test_a_sync_journal_interrupted_while_made_leaves_nothing_half_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of a run that was shipping: a sync journal without its offsets
    # would ship everything again into the same run.
    producer = Journal.create(tmp_path / "node", meta={"platform": {"run_id": "r1"}})
    _log(producer, 0, 30)
    producer.sync()
    producer.ack("traces", 20)
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    root = tmp_path / "synced"

    def interrupted(source: Journal, dest: Journal) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(mirror, "_hand_over_shipping", interrupted)
        with pytest.raises(KeyboardInterrupt), Journal.open(copy, owner=False) as source:
            open_sync_journal(source, root)
    assert not (root / producer.local_id).exists()
    assert [p.name for p in root.iterdir()] == []  # no staging folder left either
    with _synced(copy, root) as (_, sync, created):
        assert created and sync.cursor("traces").acked == 20
    producer.close()


@pytest.mark.parametrize("local_id", ["../victim", "/abs", ".hidden", ""])
def test_a_copy_naming_a_hostile_local_id_is_refused(tmp_path: Path, local_id: str) -> None:
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 3)
    producer.set_meta("journal.local_id", local_id)
    producer.sync()
    copy = _copy(producer.path, tmp_path / "login" / "copy")
    with Journal.open(copy, owner=False) as source, pytest.raises(JournalError):
        open_sync_journal(source, tmp_path / "synced")
    producer.close()


def test_another_journal_claiming_the_same_local_id_is_refused(tmp_path: Path) -> None:
    first = Journal.create(tmp_path / "a", local_id="same-id")
    second = Journal.create(tmp_path / "b", local_id="same-id")
    root = tmp_path / "synced"
    for journal in (first, second):
        journal.sync()
    with _synced(_copy(first.path, tmp_path / "c1" / "same-id"), root):
        pass
    with Journal.open(_copy(second.path, tmp_path / "c2" / "same-id"), owner=False) as source:
        with pytest.raises(JournalError, match="not the journal"):
            open_sync_journal(source, root)
    first.close()
    second.close()


def test_reading_a_copy_does_not_change_its_fingerprint(tmp_path: Path) -> None:
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 3)
    producer.sync()
    copy = _copy(producer.path, tmp_path / "login" / producer.local_id)
    before = fingerprint(copy)
    with Journal.open(copy, owner=False) as reader:
        reader.read(0)
    assert fingerprint(copy) == before
    producer.close()


def test_a_producer_whose_original_is_not_here_or_booted_elsewhere_is_unknown(
    tmp_path: Path,
) -> None:
    with Journal.create(tmp_path) as journal:
        origin = Origin.from_json(journal.get_meta(K_ORIGIN))
        assert origin is not None
        assert dataclasses.replace(origin, boot="another-boot").producer_state() == "unknown"
        moved = dataclasses.replace(origin, path=str(tmp_path / "gone"))
        assert moved.producer_state() == "unknown"
    assert origin.producer_state() == "dead"  # its original is here, unlocked


def test_a_sync_journal_made_now_is_not_walked_first_but_one_found_there_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Walking a journal's tree in a child (journal.probe) guards against a
    # file this process did not write; the one it just made is not such a
    # file (the child cost a third of a sync's start). One found in place,
    # made by an earlier sync or by another sync first, is walked.
    from primeruns.journal import store

    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 5)
    producer.close()
    walked: list[Path] = []
    real_probe = store.probe
    monkeypatch.setattr(store, "probe", lambda d: walked.append(Path(d).name) or real_probe(d))
    root = tmp_path / "synced"
    with _synced(producer.path, root) as (_, _, created):
        assert created
    assert walked == [producer.local_id]  # the copy itself, not the sync journal
    walked.clear()
    with _synced(producer.path, root) as (_, _, created):
        assert not created
    assert walked == [producer.local_id, producer.local_id]  # copy, then sync journal

    # Another sync renames its sync journal into place first: this one's is
    # dropped, and the one in place (not this process's) is walked.
    shutil.rmtree(root / producer.local_id)
    real_rename = mirror.os.rename

    def another_first(src: str | Path, dest: str | Path) -> None:
        shutil.copytree(src, Path(dest))
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr(mirror.os, "rename", another_first)
    walked.clear()
    with _synced(producer.path, root) as (_, _, created):
        assert created
    monkeypatch.setattr(mirror.os, "rename", real_rename)
    assert walked == [producer.local_id, producer.local_id]


_SNAPSHOT_OF_A_CHANGED_JOURNAL = """
import json, mmap, os, sys
from pathlib import Path
from primeruns.journal import EntryKind, Journal, probe
from primeruns.ship import mirror

tmp = Path(sys.argv[1])
with Journal.create(tmp / "runs", local_id="run") as journal:
    for i in range(300):  # incompressible: enough pages for interior ones
        journal.append(
            EntryKind.EPISODE, [json.dumps({"i": i, "pad": os.urandom(450).hex()}).encode()]
        )
data = journal.path / "data.mdb"
raw = data.read_bytes()
for page in range(2, len(raw) // 4096):  # one whose loss aborts an LMDB reader
    with open(data, "r+b") as f:
        f.seek(page * 4096)
        f.write(bytes(4096))
    killed = "killed the reader" in (probe.probe(journal.path) or "")
    data.write_bytes(raw)
    if killed:
        break
else:
    raise AssertionError("no single page aborts LMDB in this journal")
probe._known.clear()
# A writer through a shared mapping: the kernel updates the file's times at
# the first write to a clean page only, never at later ones to that page.
fd = os.open(data, os.O_RDWR)
mapped = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
mapped[page * 4096] = mapped[page * 4096]
with Journal.open(journal.path, owner=False) as original:  # walked: healthy
    assert original.last_seq() == 300 and original.damage() == []
def seen(st):
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
walked = seen(os.stat(data))
mapped[page * 4096 : page * 4096 + 4096] = bytes(4096)
print("unchanged" if seen(os.stat(data)) == walked else "changed", flush=True)
with mirror.snapshot(journal.path, tmp / "synced") as taken:
    with Journal.open(taken, owner=False) as copy:
        print(json.dumps([copy.last_seq(), [d.what for d in copy.damage()]]), flush=True)
"""


def test_a_snapshot_is_walked_though_its_original_was_walked_as_stat_still_sees_it(
    tmp_path: Path,
) -> None:
    """Found by an adversarial review: a snapshot took the verdict of its
    original's walk when the original's ``stat`` (inode, size, times) was
    unchanged since. Its bytes need not be: a write through a shared mapping
    to a page already dirty changes no time, nor does a file changed on a
    network filesystem whose attributes the client caches. The sync then
    mapped a damaged page nothing had walked, and LMDB aborted it. The
    snapshot is private: the bytes walked are the bytes mapped only if the
    snapshot itself is walked."""
    done = subprocess.run(
        [sys.executable, "-c", _SNAPSHOT_OF_A_CHANGED_JOURNAL, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Where the kernel does update the times at such a write ("changed"), the
    # walk was never skipped; the snapshot must be found damaged either way.
    _, found = done.stdout.splitlines()
    last_seq, damage = json.loads(found)
    assert damage and any("tree damaged" in what for what in damage), damage
    assert last_seq >= 290


def test_a_snapshot_is_walked_in_a_child_before_it_is_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from primeruns.journal import probe

    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 5)
    producer.close()
    children: list[list[str]] = []
    real_child = probe._run_child
    monkeypatch.setattr(
        probe,
        "_run_child",
        lambda dirs: children.append([d.parent.name for d in dirs]) or real_child(dirs),
    )
    root = tmp_path / "synced"
    with Journal.open(producer.path, owner=False) as journal:
        assert journal.last_seq() == 5
    assert children == [["node"]]
    with mirror.snapshot(producer.path, root) as taken, Journal.open(taken, owner=False) as copy:
        assert copy.last_seq() == 5 and copy.damage() == []
    assert len(children) == 2 and children[1][0].startswith(".snapshot-")


def test_a_snapshot_is_not_damaged_by_what_its_original_walk_met(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an adversarial review: a snapshot took its original's
    verdict, damaged ones too, though some are about the walk of the
    original, not its bytes (a walk that outlasted its time on a loaded
    machine, a child killed by the OOM killer, the original's own lock file):
    a healthy snapshot was then salvaged, and a sync made its sync journal by
    rebuilding it as damaged (``adopt_repaired``)."""
    from primeruns.journal import probe

    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 5)
    producer.close()
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 0.001)
    with Journal.open(producer.path, owner=False) as journal:
        assert any("did not end within" in d.what for d in journal.damage())
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 120.0)
    with mirror.snapshot(producer.path, tmp_path / "synced") as taken:
        with Journal.open(taken, owner=False) as copy:
            assert copy.last_seq() == 5 and copy.damage() == []


def test_a_snapshot_another_sync_reads_from_is_left_to_it(tmp_path: Path) -> None:
    # A sync removes the working folders killed syncs left in the sync root,
    # never one a live sync holds (two copies synced at once).
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 5)
    producer.close()
    root = tmp_path / "synced"
    with mirror.snapshot(producer.path, root) as first:
        with mirror.snapshot(producer.path, root) as second:
            assert first != second
            with Journal.open(first, owner=False) as copy:
                assert copy.last_seq() == 5


def test_a_copy_whose_file_became_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    # Listed as a regular file, swapped for a FIFO before it is copied: the
    # open blocked until a writer came, which none would (a sync hung), and a
    # device in its place would be read for ever.
    copy = tmp_path / "copy"
    copy.mkdir()
    os.mkfifo(copy / "data.mdb")
    failed: list[BaseException] = []

    def snapshot_it() -> None:
        folder = os.open(copy, os.O_RDONLY | os.O_DIRECTORY)
        try:
            mirror._copy_file(copy / "data.mdb", tmp_path / "out", folder)
        except BaseException as exc:
            failed.append(exc)
        finally:
            os.close(folder)

    worker = threading.Thread(target=snapshot_it, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the copy waited on a FIFO"
    assert len(failed) == 1 and isinstance(failed[0], JournalError)
    assert "not a regular file" in str(failed[0]) and not (tmp_path / "out").exists()


def test_a_sync_journal_path_taken_by_something_else_is_named(tmp_path: Path) -> None:
    # A folder left where the sync journal goes (not one: no data.mdb) made
    # the rename fail with a bare OSError out of the sync.
    producer = Journal.create(tmp_path / "node")
    _log(producer, 0, 3)
    producer.close()
    root = tmp_path / "synced"
    (root / producer.local_id).mkdir(parents=True)
    (root / producer.local_id / "notes.txt").write_text("mine")
    with pytest.raises(JournalError, match="not a sync journal is there; move it away"):
        with _synced(producer.path, root):
            pass
    assert (root / producer.local_id / "notes.txt").read_text() == "mine"


def test_a_sync_journal_whose_spool_end_a_power_cut_zeroed_imports_those_entries_again(
    tmp_path: Path,
) -> None:
    # The sync journal's newest appends (the copy's entries 5 to 9) were lost
    # to zeros, its sink's offset kept past them. Its appends are the copy's
    # entries under their own seqs (checked): the ones the offset names come
    # back as they were, not as new entries after it (every sync refused).
    source = Journal.create(tmp_path / "node", local_id="run")
    _log(source, 0, 9)
    dest = Journal.create(tmp_path / "synced", local_id="run")
    dest._mover.stop()
    assert import_new(source, dest).upto == 9
    dest.ack("traces", 9)
    with Journal.open(power_cut_from(dest, 3)) as dest:
        assert dest.last_seq() == 4  # four appends of one kind each: 1, 2-3, 4, 5-6...
        assert import_new(source, dest).upto == 9
        assert _rows(dest) == _rows(source)
    source.close()


def _skipped_at_its_end(root: Path) -> Path:
    """A producer's journal under ``root`` whose entries 4 to 9 a power cut's
    zeros took while a sink's offset kept naming them, and whose next owner
    appended after them (entry 10, its skip recorded): its path."""
    producer = Journal.create(root, local_id="run")
    producer._mover.stop()
    for i in range(3):
        producer.append(
            EntryKind.EPISODE, [json.dumps({"i": 3 * i + k}).encode() for k in range(3)]
        )
    producer.ack("traces", 9)
    path = power_cut_from(producer, 1)
    with Journal.open(path) as reopened:
        assert reopened.append(EntryKind.EPISODE, [b'{"i": "new"}']).first_seq == 10
    return path


def test_a_copy_whose_owner_skipped_seqs_lost_at_its_end_imports_past_them(
    tmp_path: Path,
) -> None:
    # The producer's newest appends (entries 4 to 9) were lost to a power
    # cut's zeros while a sink's offset kept naming them; its next owner
    # appended after them (entry 10). No later copy brings 4 to 9: an import
    # that waited for them stopped there for good, the rest of the run
    # never synced. Its owner skipped them, said so, and so does the import.
    copy = _copy(_skipped_at_its_end(tmp_path / "node"), tmp_path / "login" / "run")
    with _synced(copy, tmp_path / "synced") as (source, sync, _):
        assert sync.last_seq() == 10 and sync.acked("traces") == 9
        assert _rows(sync) == _rows(source) and [row[0] for row in _rows(sync)] == [1, 2, 3, 10]


def test_a_copy_whose_skipped_range_names_a_seq_no_spool_could_hold_is_not_skipped_to(
    tmp_path: Path,
) -> None:
    # A copy is untrusted input: its record of the range its owner skipped
    # (entries 4 to 9, lost to a power cut) damaged to name seq 2**62. The
    # import skipped that far: the copy's next entry (10) was never
    # imported, and every sink of the sync journal counted 2**62 entries
    # lost. No spool held that many: the import stops at the gap, as at any
    # other the copy does not explain.
    path = _skipped_at_its_end(tmp_path / "node")
    with Journal.open(path) as reopened:
        reopened.set_meta("journal.skipped", {"4": 1 << 62})
    with (
        Journal.open(path, owner=False) as source,
        Journal.create(tmp_path / "synced", local_id="run") as sync,
    ):
        imported = import_new(source, sync)
        assert imported.upto == 3 and sync.last_seq() == 3
        assert imported.stopped is not None and "4" in imported.stopped
        assert [e.seq for e in sync.read(0).entries] == [1, 2, 3] and sync.read(0).damaged == []


def test_a_copy_whose_skipped_ranges_name_a_key_of_thousands_of_digits_imports_past_the_rest(
    tmp_path: Path,
) -> None:
    # A copy is untrusted input: beside its owner's real skipped range
    # (entries 4 to 9), a key of 5,000 digits. Python's ``int`` refuses a
    # string that long (ValueError): the import raised, and the run never
    # synced. That key names no seq; the real range is imported past.
    path = _skipped_at_its_end(tmp_path / "node")
    with Journal.open(path) as reopened:
        reopened.set_meta("journal.skipped", {"4": 9, "1" * 5000: 9})
    with (
        Journal.open(path, owner=False) as source,
        Journal.create(tmp_path / "synced", local_id="run") as sync,
    ):
        assert import_new(source, sync).upto == 10
        assert [e.seq for e in sync.read(0).entries] == [1, 2, 3, 10]


def test_a_sync_journal_that_imported_part_of_a_range_the_copys_owner_skipped_goes_on_past_it(
    tmp_path: Path,
) -> None:
    # A copy taken mid-run brought entries 1 to 21 (the producer's pages, not
    # yet on its disk). A power cut then zeroed the producer's entries 10 to
    # 30, a sink's offset naming 30: its next owner appended after them (31).
    # The next copy's import starts at 22, inside that range, not at its
    # start: it waited for 22, which no copy ever brings, and the rest of
    # the run never synced.
    producer = Journal.create(tmp_path / "node", local_id="run")
    producer._mover.stop()
    for i in range(10):
        producer.append(
            EntryKind.EPISODE, [json.dumps({"i": 3 * i + k}).encode() for k in range(3)]
        )
        if i == 6:
            early = _copy(producer.path, tmp_path / "early" / "run")
    producer.ack("traces", 30)
    path = power_cut_from(producer, 3)
    with Journal.open(path) as reopened:
        assert reopened.append(EntryKind.EPISODE, [b'{"i": "new"}']).first_seq == 31
    with Journal.create(tmp_path / "synced", local_id="run") as sync:
        for copy, upto in ((early, 21), (path, 31)):
            with Journal.open(_copy(copy, tmp_path / "login" / "run"), owner=False) as source:
                assert import_new(source, sync).upto == upto
        assert [row[0] for row in _rows(sync)] == [*range(1, 22), 31]


def _five_entries(tmp_path: Path) -> Path:
    """A journal of five entries, its producer gone."""
    with Journal.create(tmp_path / "node") as producer:
        _log(producer, 0, 5)
    return producer.path


def test_a_snapshot_a_sync_on_another_host_reads_from_is_left_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by an adversarial review: the sync root is in the home folder,
    # which a cluster's login nodes share over NFS, where the flock of a
    # folder is only the host's own (no network lock for a directory). A
    # sync on one login node removed the working folders of a live sync on
    # another, as if a killed sync had left them.
    node, root = _five_entries(tmp_path), tmp_path / "synced"
    host = ["login1"]
    monkeypatch.setattr(socket, "gethostname", lambda: host[0])
    with contextlib.ExitStack() as stack:
        with monkeypatch.context() as elsewhere:
            # Held in login1's kernel: login2 sees no lock on it.
            elsewhere.setattr(fcntl, "flock", lambda fd, how: None)
            first = stack.enter_context(mirror.snapshot(node, root))
        host[0] = "login2"
        with mirror.snapshot(node, root):
            pass
        with Journal.open(first, owner=False) as copy:
            assert copy.last_seq() == 5


def test_a_sync_root_whose_folders_take_no_lock_is_synced_into_sweeping_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by an adversarial review: where a folder's flock fails (ENOLCK:
    # no lock to be had there), every sync failed at its first working
    # folder. It works in one unheld, and a sweep, which cannot tell a live
    # sync's folder from a killed one's, removes none.
    node, root = _five_entries(tmp_path), tmp_path / "synced"
    real_flock = fcntl.flock

    def no_lock_on_folders(fd: int, how: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        real_flock(fd, how)

    monkeypatch.setattr(fcntl, "flock", no_lock_on_folders)
    with mirror.snapshot(node, root) as first:
        with mirror.snapshot(node, root) as second:
            assert first != second
            with Journal.open(first, owner=False) as copy:
                assert copy.last_seq() == 5
    assert [p for p in root.iterdir() if p.name.startswith(".snapshot-")] == []


def test_a_copy_compacted_past_its_summaries_closes_out_with_the_newest(tmp_path: Path) -> None:
    # Compaction keeps the run's spec (its first entry) and its last
    # summary: a copy of an online run whose uplink compacted was refused
    # ("holds entries only up to 1"), even once its job had ended, and its
    # sync journal would have lost the summary a crash is closed out with.
    from primeruns.ship.uplink import terminal_state

    for back in (2, 0):  # the last summary past what was compacted, or within it
        producer = Journal.create(tmp_path / f"node{back}", meta={"platform": {"run_id": "r1"}})
        producer.append(EntryKind.RUN_OPEN, [b"{}"])
        for step in range(10):
            _log(producer, step * 3, 3)
            producer.append(EntryKind.SUMMARY, [json.dumps({"step": step}).encode()])
        producer.sync()
        producer.ack("traces", producer.last_seq() - back)
        assert producer.compact(["traces"]) > 0
        producer.sync()
        assert terminal_state(producer)[2] == {"step": 9}
        copy = _copy(producer.path, tmp_path / f"login{back}" / producer.local_id)
        for _ in range(2):  # a copy synced again imports nothing more
            with _synced(copy, tmp_path / f"synced{back}") as (_source, sync, _):
                assert terminal_state(sync) == ("crashed", CRASH_ERROR, {"step": 9})
                assert sync.cursor("traces").acked == sync.last_seq() - back
                assert sync.damage() == []
                assert +sync.tally()[0] == {1: 1, 2: 20, 4: 10, 5: 10}
        producer.close()
