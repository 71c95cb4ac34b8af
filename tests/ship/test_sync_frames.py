"""A sync journal's import stores its copy's compressed frames as they are.

The copy's mover compressed its entries (with the dictionary it trained);
decoding them on import verifies them, and compressing them again in the
sync journal was a third of a replay's own CPU. They are stored as they
are, under their own seqs, with the dictionary they name; only where the
sync journal holds another dictionary under that id are they compressed
again there.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import pytest

from primeruns.exceptions import JournalFullError
from primeruns.journal import EntryKind, Journal
from primeruns.journal import dicts as dicts_module
from primeruns.journal import mover as mover_module
from primeruns.journal.dictionary import MAX_TRAINED_DICT_BYTES
from primeruns.journal.frames import FLAG_ZSTD, peek_header
from primeruns.ship.mirror import import_new, open_sync_journal


def _episode(i: int) -> bytes:
    """A record like an episode: long, and much like its neighbours."""
    turns = [{"role": "user", "content": f"Question {i}: what is {i} plus {i * 7}?"}] * 8
    return json.dumps({"id": f"ep-{i:06d}", "reward": i % 2, "turns": turns}).encode()


def _producer(path: Path, start: int, n: int) -> Path:
    """Log ``n`` episodes into the journal at ``path`` (made in the runs
    directory ``path`` when it is not one) and close it (its mover
    compresses them, training a dictionary on the first batch)."""
    if (path / "data.mdb").exists():
        journal = Journal.open(path, owner=True)
    else:
        journal = Journal.create(path, meta={"spec": {"kind": "eval", "mode": "offline"}})
    with journal:
        for i in range(start, start + n):
            journal.append(EntryKind.EPISODE, [_episode(i)])
    return journal.path


def _stored(journal: Journal) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """(payloads, stored frames) of every entry, by seq."""
    payloads: dict[int, bytes] = {}
    frames: dict[int, bytes] = {}
    after = 0
    while True:
        result = journal.read(after, max_entries=10_000, frames=True)
        assert not result.damaged
        payloads.update((e.seq, e.payload) for e in result.entries)
        frames.update(result.frames)
        if result.next_after <= after:
            return payloads, frames
        after = result.next_after


def _copy(src: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    return dest


def _compressions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The payloads the movers compress from now on (counted)."""
    counted: list[int] = []
    real = mover_module.encode_frames_off_gil

    def counting(kind, payloads, *args, **kwargs):  # type: ignore[no-untyped-def]
        counted.append(len(payloads))
        return real(kind, payloads, *args, **kwargs)

    monkeypatch.setattr(mover_module, "encode_frames_off_gil", counting)
    return counted


def test_the_copys_compressed_frames_are_stored_as_they_are_each_copy_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _producer(tmp_path / "node", 0, 300)
    root = tmp_path / "synced"
    for more in (0, 200):  # copied, then copied again once it logged more
        _producer(node, 300, more)
        copy = _copy(node, tmp_path / "copy")
        with Journal.open(copy, owner=False) as source:
            want_payloads, want_frames = _stored(source)
            compressed = [
                seq for seq, frame in want_frames.items() if peek_header(frame).flags & FLAG_ZSTD
            ]
            assert any(peek_header(want_frames[s]).dict_id for s in compressed), "no dictionary"
            sync, _ = open_sync_journal(source, root)
            counted = _compressions(monkeypatch)
            try:
                done = import_new(source, sync, final=True)
                assert done.stopped is None and done.upto == source.last_seq()
                payloads, frames = _stored(sync)
            finally:
                sync.close()
            monkeypatch.undo()
        assert payloads == want_payloads  # each entry once, under its own seq
        assert {s: frames[s] for s in compressed} == {s: want_frames[s] for s in compressed}
        assert sum(counted) == 0, "the copy's entries were compressed again"
    with Journal.open(root / sync.local_id, owner=False) as again:
        assert _stored(again)[0] == want_payloads  # read anew: its dictionaries are stored


def test_a_sync_journal_holding_another_dictionary_under_that_id_compresses_them_again(
    tmp_path: Path,
) -> None:
    node = _producer(tmp_path / "node", 0, 300)
    with Journal.open(node, owner=False) as source:
        want, frames = _stored(source)
        ids = {peek_header(f).dict_id for f in frames.values()} - {0}
        sync, _ = open_sync_journal(source, tmp_path / "synced")
        try:
            for dict_id in ids:  # its own dictionary, trained before, under the same id
                theirs = source.dictionary(dict_id)
                assert theirs is not None
                assert sync.adopt_dictionary(dict_id, theirs[:-1] + b"x")
            done = import_new(source, sync, final=True)
            assert done.stopped is None
            payloads, stored = _stored(sync)
        finally:
            sync.close()
    assert payloads == want
    assert all(stored[s] != frames[s] for s in want if peek_header(frames[s]).dict_id in ids)


def test_a_copys_dictionary_larger_than_any_trained_here_is_not_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A journal is untrusted input: a copy may name up to 255 dictionaries of
    # up to 1 MiB each, all adopted into the sync journal and held in memory
    # (~255 MB). One larger than training ever makes is not adopted; the
    # frames naming it are compressed again, their payloads the same.
    node = _producer(tmp_path / "node", 0, 300)
    with Journal.open(node, owner=False) as source:
        want, frames = _stored(source)
        ids = {peek_header(f).dict_id for f in frames.values()} - {0}
        sizes = {len(source.dictionary(i) or b"") for i in ids}
        sync, _ = open_sync_journal(source, tmp_path / "synced")
        try:
            assert not sync.adopt_dictionary(1, os.urandom(MAX_TRAINED_DICT_BYTES + 1))
            monkeypatch.setattr(dicts_module, "MAX_TRAINED_DICT_BYTES", min(sizes) - 1)
            done = import_new(source, sync, final=True)
            assert done.stopped is None
            payloads, stored = _stored(sync)
            assert all(sync.dictionary(i) != source.dictionary(i) for i in ids)
        finally:
            sync.close()
    assert payloads == want
    assert all(stored[s] != frames[s] for s in want if peek_header(frames[s]).dict_id in ids)


def _fill(journal: Journal) -> None:
    """Fill ``journal``'s LMDB to its byte budget (incompressible meta
    values, ever smaller, until even a 1 KiB one no longer fits)."""
    n = 0
    for size in (256 << 10, 64 << 10, 16 << 10, 4 << 10, 1 << 10):
        while True:
            try:
                journal.set_meta(f"filler.{n}", base64.b64encode(os.urandom(size)).decode())
            except JournalFullError:
                break
            n += 1


def test_a_sync_journal_at_its_byte_budget_still_takes_the_copys_entries(
    tmp_path: Path,
) -> None:
    """A dictionary that no longer fits the sync journal's LMDB (at its
    byte budget) is not adopted: the frames naming it are appended as
    payloads, spooled as every import's entries were, and the import goes
    on. Its write raised JournalFullError out of the import: the sync
    failed where it had imported every entry before."""
    node = _producer(tmp_path / "node", 0, 300)
    with Journal.open(node, owner=False) as source:
        want, _ = _stored(source)
        dest = Journal.create(tmp_path / "synced", local_id=source.local_id, max_bytes=1 << 20)
        try:
            _fill(dest)
            done = import_new(source, dest, final=True)
            assert done.stopped is None and done.upto == source.last_seq()
            payloads, _ = _stored(dest)
        finally:
            dest.close()
    assert payloads == want


def test_a_read_in_the_process_as_frames_are_stored_reports_no_entry_missing(
    tmp_path: Path,
) -> None:
    """Frames stored as they are go into LMDB past the spool, and the next
    append opens a spool segment named past them. A read of the same
    process that looked at LMDB before they were stored, and at the spool
    after that segment was opened, found the segment and reported the
    frames' entries missing (and read past them, as a shipper then does):
    it reads again instead, as after a segment the mover closed."""
    node = _producer(tmp_path / "node", 0, 20)
    with Journal.open(node, owner=False) as source:
        want, frames = _stored(source)
    dest = Journal.create(tmp_path / "synced", local_id="run")
    try:
        assert dest.put_frames([(seq, frames[seq]) for seq in range(1, 6)])
        looked = dest._tx.count_read  # called between a read's look at LMDB and at the spool
        stored: list[int] = []

        def store_between(nbytes: int) -> None:
            looked(nbytes)
            if not stored:
                stored.append(1)
                assert dest.put_frames([(seq, frames[seq]) for seq in range(6, 11)])
                dest.append(EntryKind.EPISODE, [want[11]])

        dest._tx.count_read = store_between  # type: ignore[method-assign]
        result = dest.read(0, max_entries=100)
        assert result.damaged == []
        assert [e.seq for e in result.entries] == list(range(1, len(result.entries) + 1))
        assert result.next_after == len(result.entries)
    finally:
        dest.close()
