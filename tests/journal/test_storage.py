"""Storage behaviour: dictionaries, map growth, durability modes, listing damaged runs."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdk_helpers import wait_for

from primeruns.exceptions import JournalFullError
from primeruns.journal import EntryKind, Journal, journal_info, list_journals, spool
from primeruns.journal.dicts import K_DICT_PREFIX, Dictionaries
from primeruns.journal.frames import peek_header
from primeruns.journal.layout import is_chunk_key, seq_of
from primeruns.journal.meta import K_UNREADABLE
from primeruns.journal.mover import _ABSORB_BATCH, Mover
from primeruns.journal.txn import Transactions


def _episode(i: int) -> bytes:
    rng = random.Random(i)
    words = ["Solve", "step", "total", "answer", "apples", "each", "costs", "so"]
    return json.dumps(
        {
            "task": "gsm8k",
            "system": "You are a careful math tutor. Think step by step. " * 8,
            "question": " ".join(rng.choice(words) for _ in range(60)),
            "reward": rng.random(),
        }
    ).encode()


def test_dictionary_trained_stored_and_used(tmp_path: Path) -> None:
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()  # trained here, not by the mover's thread
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(100)])
        assert j.train_dictionaries() == [EntryKind.EPISODE]
        assert j.train_dictionaries() == []  # once per kind
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(100, 400)])
        j.append(EntryKind.METRICS, [b'{"loss":1}'])
        j._absorb()
        assert _dictionary_use(j) == (401, 400)  # too few metrics rows to train on
    # Readers (another process's view, a reopened owner) decode with the stored dictionary.
    with Journal.open(tmp_path / "run", owner=False) as ro:
        got = ro.read(0, max_entries=1000)
        assert [e.payload for e in got.entries[:400]] == [_episode(i) for i in range(400)]
        assert got.damaged == [] and ro.damage() == []


def test_a_listing_keeps_the_summary_of_a_journal_with_a_dictionary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The dictionary is stored among the meta values as bytes, not JSON: a
    # bounded listing (the dashboard's) named it unreadable and so kept no
    # summary, and every page of the run counted its entries again.
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(100)])
        assert j.train_dictionaries() == [EntryKind.EPISODE]
        j._absorb()
    bounds = (1 << 20, lambda value: value)
    first = journal_info(tmp_path / "run", tally=True, meta_bounds=bounds)
    assert K_UNREADABLE not in first.meta and first.damage == []
    assert first.after[0][EntryKind.EPISODE] == 100

    def unopened(*args: Any, **kwargs: Any) -> Journal:
        raise AssertionError("the journal was read again, not its summary")

    monkeypatch.setattr(Journal, "open", unopened)
    again = journal_info(tmp_path / "run", tally=True, meta_bounds=bounds)
    assert again.after == first.after and again.meta == first.meta


def test_dictionary_trained_by_the_mover_not_the_producer_that_handed_it_over(
    tmp_path: Path,
) -> None:
    # Training holds the GIL for ~0.2 s: a producer whose uplink moves (and
    # so compresses) must not spend its loop on it.
    with Journal.create(tmp_path, local_id="run") as j:
        j.hand_over_moving()
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(100)])
        assert not j._dicts.due()
        view = spool.SpoolView(j.path)
        uplinks = Dictionaries(j._tx)
        mover = Mover(j._tx, uplinks, j.path, view, j._reader)
        while mover.step():  # trains on the first batch it moves
            pass
        assert not uplinks.due() and EntryKind.EPISODE in uplinks.active
        assert j.train_dictionaries() == []  # the producer has nothing to train on
        view.close()


def _dictionary_use(j: Journal) -> tuple[int, int]:
    """(entries in LMDB, of which compressed with a dictionary)."""
    stored = with_dict = 0
    with j._tx.read() as txn:
        for raw_key, value in txn.cursor(db=j._tx.dbs["entries"]):
            if is_chunk_key(raw_key) or seq_of(raw_key) == 0:
                continue
            stored += 1
            with_dict += peek_header(value).dict_id != 0
    return stored, with_dict


def test_a_burst_is_compressed_with_the_dictionary_its_first_batch_trained(
    tmp_path: Path,
) -> None:
    # A loop that logs faster than the mover moves (an evaluation's burst, a
    # backlog with the platform down) spools thousands of entries before the
    # mover's first look. The dictionary is trained on the first batch's own
    # records before they are compressed, so the whole burst is compressed
    # with it: trained only once the whole burst had moved, it served none
    # of it (0.44 journal bytes per raw byte on the gsm8k backlog instead of
    # ~0.25), and trained after the first batch, not that batch.
    burst = 4 * _ABSORB_BATCH
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        for i in range(burst):
            j.append(EntryKind.EPISODE, [_episode(i)])
        j._mover.start()
        j._mover.wake()
        wait_for(lambda: _dictionary_use(j)[0] == burst, what="the burst moved into LMDB")
        assert _dictionary_use(j) == (burst, burst)  # the first batch too
        got = j.read(0, max_entries=burst + 10, max_bytes=1 << 30)
        assert [e.payload for e in got.entries] == [_episode(i) for i in range(burst)]


def test_a_burst_closed_before_the_movers_first_look_is_compressed_with_a_dictionary(
    tmp_path: Path,
) -> None:
    # An evaluation that logs its results at its end and finishes: close()
    # moves what is spooled, in the closing thread, and the dictionary is
    # trained on the first batch it moves. Before, no dictionary was ever
    # trained there: the journal kept 0.45 bytes a raw byte of gsm8k
    # episodes at rest instead of ~0.22.
    burst = _ABSORB_BATCH + 100
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()  # the background thread never looks
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(burst)])
        j.append(EntryKind.METRICS, [b'{"loss":1}'])  # too few of its kind to train on
    with Journal.open(tmp_path / "run", owner=False) as ro:
        assert _dictionary_use(ro) == (burst + 1, burst)
        assert list(ro._dicts.active) == [EntryKind.EPISODE]
        got = ro.read(0, max_entries=burst + 10, max_bytes=1 << 30)
        assert [e.payload for e in got.entries[:burst]] == [_episode(i) for i in range(burst)]
        assert ro.damage() == []


def test_two_trainers_never_give_one_id_two_dictionaries(tmp_path: Path) -> None:
    # Two movers for a moment (a hand-over) may both train: each stores its
    # dictionary under an id of its own, and entries compressed with either decode.
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(100)])  # spooled: samples
        first, second = Dictionaries(j._tx), Dictionaries(j._tx)
        for d in (first, second):
            d.seen(int(EntryKind.EPISODE), 100)
        assert first.train(j._reader.read, 0) == [EntryKind.EPISODE]
        ids = {first.active[int(EntryKind.EPISODE)]}
        # The second trained without having seen the first's (a stale view).
        second.train(j._reader.read, 0)
        ids.add(second.active[int(EntryKind.EPISODE)])
        assert len(ids) == 2
        for d, base in ((first, 1000), (second, 2000)):
            mover = Mover(j._tx, d, j.path, spool.SpoolView(j.path), j._reader)
            d.refresh = lambda: None  # type: ignore[method-assign]  # keep its own choice
            j.append(EntryKind.EPISODE, [_episode(base + i) for i in range(20)])
            while mover.step():
                pass
            mover._spool.close()
    with Journal.open(tmp_path / "run", owner=False) as ro:
        got = ro.read(0, max_entries=1000)
        expected = [_episode(i) for i in range(100)]
        expected += [_episode(1000 + i) for i in range(20)]
        expected += [_episode(2000 + i) for i in range(20)]
        assert [e.payload for e in got.entries] == expected
        assert got.damaged == [] and ro.damage() == []


def test_map_grows_past_initial_size(tmp_path: Path) -> None:
    big = random.Random(0).randbytes(2 << 20)  # incompressible: stored as is
    with Journal.create(tmp_path, local_id="run") as j:
        for _ in range(12):  # ~24 MiB > the 16 MiB initial map
            assert j.append(EntryKind.TRACE, [big]).count == 1
        while j._mover.step():  # into LMDB, as the background mover does
            pass
        assert (j.path / "data.mdb").stat().st_size > 16 << 20
        assert all(e.payload == big for e in j.read(0, max_bytes=1 << 30).entries)


_GROWER = """
import sys
from pathlib import Path
from primeruns.journal import EntryKind, Journal
j = Journal.open(Path(sys.argv[1]))
import os
for _ in range(12):
    j.append(EntryKind.TRACE, [os.urandom(1 << 20)])
print(j.last_seq(), flush=True)
j.close()
"""


def test_reader_follows_a_writer_that_grew_the_map(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, local_id="run")
    j.append(EntryKind.METRICS, [b"{}"])
    path = j.path
    j.close()
    with Journal.open(path, owner=False) as ro:
        assert ro.last_seq() == 1
        out = subprocess.run(
            [sys.executable, "-c", _GROWER, str(path)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert ro.last_seq() == 13  # the map grew past this reader's: it adopts the new size
        assert len(ro.read(1, max_bytes=1 << 30).entries) == 12


def test_fsync_mode_roundtrip(tmp_path: Path) -> None:
    with Journal.create(tmp_path, local_id="run", durability="fsync") as j:
        assert j.durability == "fsync"
        assert j.append(EntryKind.FINISH, [b'{"status":"completed"}']).first_seq == 1
    with Journal.open(tmp_path / "run", durability="fsync") as j2:
        assert j2.get(1) is not None


def test_listing_reports_damage_and_never_raises(tmp_path: Path) -> None:
    with Journal.create(tmp_path, local_id="a-good") as j:
        j.append(EntryKind.METRICS, [b'{"x":1}'])
        j.ack("metrics", 1)
    bad = tmp_path / "b-bad"
    bad.mkdir()
    (bad / "data.mdb").write_bytes(bytes(9000))
    good, broken = list_journals(tmp_path)
    assert good.local_id == "a-good" and good.last_seq == 1 and good.cursors == {"metrics": 1}
    assert good.damage == [] and good.owner is None and not good.owner_alive
    assert broken.path == bad and broken.last_seq == 0
    assert any("no valid meta page" in d.what for d in broken.damage)


def test_the_background_sync_follows_a_write_and_nothing_else_wakes_it(
    tmp_path: Path,
) -> None:
    # "process" durability: the disk is synced within a second of a write,
    # by a thread that sleeps without a timer until one comes. Were its
    # wake-up lost, this would wait for ever (pytest's timeout ends it).
    import threading

    with Journal.create(tmp_path, local_id="run") as j:
        synced = threading.Event()
        real = j._tx.store.sync

        def sync(*args: object) -> None:
            real(*args)
            synced.set()

        j._tx.store.sync = sync  # type: ignore[method-assign]
        j.set_meta("probe", 1)  # an LMDB write
        synced.wait()
        assert not j._tx.dirty
        synced.clear()
        j.append(EntryKind.METRICS, [b'{"loss":1}'])  # a spool write
        j._absorb()  # into LMDB: a write the sync must follow too
        synced.wait()
        assert not j._tx.dirty


def test_a_kind_logged_a_few_records_a_batch_still_gets_its_dictionary(
    tmp_path: Path,
) -> None:
    # A training run logs an episode or two between the mover's looks: the
    # batch that brings the kind's 64th record holds a few records, too few
    # to train on alone. The dictionary is trained on the journal's records
    # then, as before; trained on that batch alone, the kind was marked tried
    # and never got one (the long runs' journals at 0.45 bytes a raw byte).
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()  # moved here, one small batch at a time
        view = spool.SpoolView(j.path)
        uplinks = Dictionaries(j._tx)
        mover = Mover(j._tx, uplinks, j.path, view, j._reader)
        for i in range(0, 100, 2):
            j.append(EntryKind.EPISODE, [_episode(i), _episode(i + 1)])
            while mover.step():
                pass
            if uplinks.due():
                mover._train()  # as the mover's thread does between batches
        assert EntryKind.EPISODE in uplinks.active
        view.close()


def test_a_dictionary_that_cannot_be_stored_never_keeps_a_batch_from_moving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Storing the dictionary fails (the journal's byte budget, a full disk):
    # the batch it was trained for is moved without it, as it was when
    # training ran between batches. Before, close() moved none of the burst
    # (the journal left spooled), and an absorb (compaction) moved nothing.
    real = Transactions.put_meta_bytes

    def refuse_dictionaries(self: Transactions, txn: Any, key: str, value: bytes) -> None:
        if key.startswith(K_DICT_PREFIX):
            raise JournalFullError("no room for a dictionary")
        real(self, txn, key, value)

    monkeypatch.setattr(Transactions, "put_meta_bytes", refuse_dictionaries)
    with Journal.create(tmp_path, local_id="run") as j:
        j._mover.stop()  # moved by close()
        j.append(EntryKind.EPISODE, [_episode(i) for i in range(100)])
    assert spool.list_segments(tmp_path / "run") == []  # at rest: all in LMDB
    with Journal.open(tmp_path / "run", owner=False) as ro:
        assert _dictionary_use(ro) == (100, 0)
