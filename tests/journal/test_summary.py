"""Listings read a past journal from its summary while its files are unchanged, and the
journal itself otherwise: a listing costs what changed, never a stale answer.

What a user depends on: ``ls`` (and the dashboard, and the hint ``init()``
logs) shows each run as it is now, however it changed (appended to, damaged,
replaced by a copy from another machine, its summary lost or mangled), and
does not open thousands of unchanged past runs to show them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from primeruns.journal import (
    EntryKind,
    Journal,
    delete_journal,
    journal_info,
    list_journals,
    summary,
    summary_index,
)
from primeruns.journal.origin import K_ORIGIN
from primeruns.journal.summary import FOLDER
from primeruns.journal.summary_index import INDEX_NAME
from primeruns.reports import describe

ONLINE = {"spec": {"kind": "eval", "mode": "online"}}


def _journal(runs: Path, name: str, entries: int, *, finish: bool = True) -> Path:
    with Journal.create(runs, local_id=name, meta=ONLINE) as journal:
        for i in range(entries):
            journal.append(EntryKind.EPISODE, [json.dumps({"id": f"{name}-{i}"}).encode()])
        if finish:
            journal.append(EntryKind.FINISH, [b'{"status": "completed"}'])
        return journal.path


@pytest.fixture(params=["a summary file a journal", "one index of them all"])
def kept_as(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way a listing finds what it kept: a runs directory of a few
    journals reads their summary files; one of many, one index of them all
    (``summary_index``), here written at every listing that found a change."""
    if request.param == "one index of them all":
        monkeypatch.setattr(summary_index, "stale_most", lambda journals: 0)
    return str(request.param)


def _opened(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The journals opened from now on (each time one is)."""
    opened: list[Path] = []
    real = Journal.open

    def spy(path: Path, *args: Any, **kwargs: Any) -> Journal:
        opened.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Journal, "open", spy)
    return opened


def _shown(runs: Path, **kwargs: Any) -> dict[str, tuple[Any, ...]]:
    """What a listing says of each journal: entries, counts, finish, damage."""
    return {
        info.path.name: (
            info.last_seq,
            dict(info.after.get(0, {})),
            (describe(info).finish or {}).get("status"),
            [d.what for d in info.damage],
        )
        for info in list_journals(runs, tally=True, **kwargs)
    }


def _same_times(path: Path, like: os.stat_result) -> None:
    """Give ``path`` the access and modification times of ``like``: a change
    within the file system's timestamp granularity, or a copy that kept them."""
    os.utime(path, ns=(like.st_atime_ns, like.st_mtime_ns))


def test_an_unchanged_journal_is_listed_from_its_summary_without_being_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept_as: str
) -> None:
    """Before, every listing opened every past journal (and a child walked
    each one's tree): ``ls`` of 3,000 runs took ~20 s."""
    runs = tmp_path / "runs"
    _journal(runs, "a", 3)
    _journal(runs, "b", 2, finish=False)
    first = _shown(runs)
    opened = _opened(monkeypatch)
    assert _shown(runs) == first
    assert opened == []
    assert first["a"] == (4, {int(EntryKind.EPISODE): 3, int(EntryKind.FINISH): 1}, "completed", [])
    assert first["b"][2] is None


def test_a_journal_that_changed_is_read_again_even_within_its_timestamp(
    tmp_path: Path, kept_as: str
) -> None:
    runs = tmp_path / "runs"
    path = _journal(runs, "run", 2, finish=False)
    assert _shown(runs)["run"][:3] == (2, {int(EntryKind.EPISODE): 2}, None)
    before = (path / "data.mdb").stat()
    with Journal.open(path) as journal:  # replay, or a requeued job, writes it again
        journal.append(EntryKind.EPISODE, [b'{"id": "late"}'])
        journal.append(EntryKind.FINISH, [b'{"status": "failed"}'])
    _same_times(path / "data.mdb", before)
    assert _shown(runs)["run"][:3] == (
        4,
        {int(EntryKind.EPISODE): 3, int(EntryKind.FINISH): 1},
        "failed",
    )


def test_a_summary_that_is_missing_or_mangled_is_read_again_from_the_journal(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    _journal(runs, "run", 3)
    truth = _shown(runs)
    kept = runs / FOLDER / "run.json"
    assert kept.is_file()
    good = json.loads(kept.read_bytes())
    mangled = [
        b"",
        b"{not json",
        json.dumps({**good, "v": 999}).encode(),
        json.dumps({**good, "fields": {**good["fields"], "last_seq": "many"}}).encode(),
        json.dumps({**good, "fields": {**good["fields"], "after": {"0": {"x": 1}}}}).encode(),
        # Tallies that are no count: int() took 2.5 as 2, "7" as 7, -5 as it is.
        *(
            json.dumps({**good, "fields": {**good["fields"], "after": {"0": {"2": n}}}}).encode()
            for n in (2.5, "7", -5)
        ),
        json.dumps(
            {**good, "fields": {**good["fields"], "losses": {"traces": {"count": "many"}}}}
        ).encode(),
        # Counts that are none: a negative loss count was summed into ls's total.
        json.dumps(
            {**good, "fields": {**good["fields"], "losses": {"traces": {"count": -5}}}}
        ).encode(),
        json.dumps({**good, "fields": {**good["fields"], "last_seq": -1}}).encode(),
        json.dumps({**good, "fields": []}).encode(),
    ]
    for raw in mangled:
        kept.write_bytes(raw)
        assert _shown(runs) == truth, raw
        assert [info.losses for info in list_journals(runs)] == [{}], raw
    kept.unlink()
    assert _shown(runs) == truth
    assert json.loads(kept.read_bytes())["fields"]["last_seq"] == 4  # kept anew
    kept.unlink()
    kept.symlink_to(tmp_path / "elsewhere.json")  # never followed
    (tmp_path / "elsewhere.json").write_bytes(json.dumps(good).encode())
    assert _shown(runs) == truth


def test_a_summary_holding_an_integer_past_64_bits_is_read_again_from_the_journal(
    tmp_path: Path, kept_as: str
) -> None:
    """orjson reads an integer past 64 bits as a float, and ``int()`` took it
    back as another number: a summary's tally planted as 2**64 + 1 was
    listed as 2**64 episodes. Such a summary is damaged, wherever it is
    kept (its file, the index's copy of it, the index's listing row): the
    journal is read instead, and nothing raises into the listing."""
    runs = tmp_path / "runs"
    _journal(runs, "run", 3)
    truth = _shown(runs)
    rows_truth = _shown(runs, rows=True)
    episodes = str(int(EntryKind.EPISODE))
    kept, index = runs / FOLDER / "run.json", runs / FOLDER / INDEX_NAME
    for past in [2**64, 2**64 + 1, -(2**63) - 1, 10**400]:
        good = json.loads(kept.read_bytes())
        good["fields"]["after"]["0"][episodes] = past
        kept.write_bytes(json.dumps(good).encode())
        if index.exists():
            held = json.loads(index.read_bytes())
            held["entries"]["run"][1] = json.dumps(good)
            held["rows"]["run"]["after"]["0"][episodes] = past
            index.write_bytes(json.dumps(held).encode())
        assert _shown(runs) == truth, past
        assert _shown(runs, rows=True) == rows_truth, past
    assert kept_as != "one index of them all" or index.exists()


_LISTING = """
import json, sys
from pathlib import Path
from primeruns.journal import list_journals
print(json.dumps([[d.what for d in i.damage] for i in list_journals(Path(sys.argv[1]))]))
"""


def _zero_a_page_that_aborts_lmdb(path: Path) -> None:
    """Zero, in place, an interior page of the journal at ``path`` whose loss
    makes LMDB abort a reader (as the probe's child finds)."""
    from primeruns.journal.probe import probe

    data = path / "data.mdb"
    raw = data.read_bytes()
    for page in range(2, len(raw) // 4096):
        with open(data, "r+b") as f:
            f.seek(page * 4096)
            f.write(bytes(4096))
        if "killed the reader" in (probe(path) or ""):
            return
        data.write_bytes(raw)
    raise AssertionError("no single page aborts LMDB in this journal")


def test_a_journal_damaged_in_place_after_it_was_listed_is_probed_again(
    tmp_path: Path, kept_as: str
) -> None:
    """Its size and times unchanged, its summary still says it is healthy:
    the listing must walk its tree in a child again, not trust the summary
    (nor open it and let LMDB abort the process)."""
    runs = tmp_path / "runs"
    path = runs / "run"
    with Journal.create(runs, local_id="run", meta=ONLINE) as journal:
        for i in range(300):  # incompressible: enough pages for interior ones
            journal.append(
                EntryKind.EPISODE, [json.dumps({"i": i, "pad": os.urandom(450).hex()}).encode()]
            )
    assert _shown(runs)["run"][3] == []
    before = (path / "data.mdb").stat()
    _zero_a_page_that_aborts_lmdb(path)
    _same_times(path / "data.mdb", before)
    assert (path / "data.mdb").stat().st_size == before.st_size
    listing = subprocess.run(
        [sys.executable, "-c", _LISTING, str(runs)], capture_output=True, text=True, timeout=120
    )
    assert listing.returncode == 0, listing.stderr[-2000:]
    (damage,) = json.loads(listing.stdout)
    assert any("tree damaged" in what for what in damage), damage


def test_a_journal_copied_in_from_another_host_is_listed_as_the_copy_is(
    tmp_path: Path, kept_as: str
) -> None:
    """A runs directory refreshed from a compute node (rsync, ``cp -a``):
    the copy replaces the journal of the same name, its times kept, and
    must be listed as what it holds, not as the journal it replaced."""
    runs, node = tmp_path / "runs", tmp_path / "node"
    path = _journal(runs, "run", 1, finish=False)
    assert _shown(runs)["run"][0] == 1
    before = (path / "data.mdb").stat()
    there = _journal(node, "run", 5)
    with Journal.open(there) as journal:
        journal.set_meta(K_ORIGIN, {**journal.get_meta(K_ORIGIN), "host": "compute-7"})
    shutil.rmtree(path)
    shutil.copytree(there, path)  # times kept, as rsync -a and cp -a keep them
    _same_times(path / "data.mdb", before)
    (info,) = list_journals(runs, tally=True)
    assert (info.last_seq, info.after[0][int(EntryKind.EPISODE)]) == (6, 5)
    assert describe(info).state == "finished"
    assert (describe(info).finish or {}).get("status") == "completed"


def test_summaries_are_not_runs_and_go_with_their_journals(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    keep, gone = _journal(runs, "keep", 1), _journal(runs, "gone", 1)
    assert [i.path.name for i in list_journals(runs)] == ["gone", "keep"]
    assert sorted(p.name for p in (runs / FOLDER).iterdir()) == ["gone.json", "keep.json"]
    delete_journal(gone)
    assert [p.name for p in (runs / FOLDER).iterdir()] == ["keep.json"]
    shutil.rmtree(keep)  # deleted by hand: the next listing drops its summary
    assert list_journals(runs) == []
    assert list((runs / FOLDER).iterdir()) == []


def test_no_summary_is_kept_where_another_user_could_write(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    path = _journal(runs, "run", 2)
    os.chmod(runs, 0o770)
    assert journal_info(path, tally=True).last_seq == 3
    assert _shown(runs)["run"][0] == 3
    assert not (runs / FOLDER).exists()


def test_a_bounded_reader_is_given_meta_within_its_bounds_from_a_summary(tmp_path: Path) -> None:
    """The dashboard reads meta within bounds; a summary kept by ``ls`` (which
    reads it whole) must not give it more."""
    runs = tmp_path / "runs"
    with Journal.create(runs, local_id="run", meta={**ONLINE, "big": "x" * 5000}) as journal:
        journal.append(EntryKind.EPISODE, [b"{}"])
    kept = runs / FOLDER / "run.json"

    def clip(value: Any) -> Any:
        return value[:10] if isinstance(value, str) else value

    (info,) = list_journals(runs, meta_bounds=(1000, clip))  # read from the journal
    assert "big" not in info.meta and info.meta["journal.oversized"]["big"] > 1000
    assert not kept.exists()  # a value was left out: nothing whole to keep
    (info,) = list_journals(runs, meta_bounds=(10_000, clip))
    assert info.meta["big"] == "x" * 10 and kept.exists()
    (info,) = list_journals(runs, meta_bounds=(1000, clip))  # from the summary now
    assert "big" not in info.meta and info.meta["journal.oversized"]["big"] > 1000
    assert info.meta["spec"] == ONLINE["spec"]
    (info,) = list_journals(runs)
    assert info.meta["big"] == "x" * 5000


def test_the_crashed_run_hint_opens_no_past_journal_it_read_before_and_few_it_did_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every online ``init()`` looks for earlier runs that crashed, beside the
    user's loop. Before, it opened every past journal, with a child walking
    each one's tree: with 3,000 past runs the loop slowed by a quarter for
    ten seconds, and its worst ``log_*`` call took 80 ms."""
    import logging

    from primeruns import opening

    runs = tmp_path / "runs"
    crashed = [_journal(runs, f"crashed-{i:02d}", 1, finish=False) for i in range(12)]
    opened = _opened(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        opening._mention_crashed_runs(runs, set())
    assert sorted(opened) == crashed[-opening._HINT_UNREAD_MOST :]  # the newest, the first time
    assert f"{opening._HINT_UNREAD_MOST} earlier run(s)" in caplog.text
    list_journals(runs)  # `primeruns ls`, say: every journal read once
    opened.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        opening._mention_crashed_runs(runs, set())
    assert opened == []
    assert "12 earlier run(s)" in caplog.text


def test_a_listing_of_many_journals_reads_one_index_not_a_file_a_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ls`` of 3,000 past runs read 3,000 summary files, and each journal's
    first 8 KiB and folder listing for its stamp: on a busy disk, most of its
    time. Listed again, unchanged journals cost a ``stat`` or two each: what
    they are is in one index, read once, and what a ``stat`` proves unchanged
    is not read again (here their files settled long ago)."""
    runs = tmp_path / "runs"
    paths = [_journal(runs, f"run-{i:02d}", 1 + i % 3, finish=i % 2 == 0) for i in range(40)]
    # Listings from a minute on: every file changed long before their stamps.
    later = types.SimpleNamespace(time_ns=lambda: time.time_ns() + 60 * 10**9, time=time.time)
    monkeypatch.setattr(summary, "time", later)
    first = _shown(runs)
    _shown(runs)  # the index is written once the summaries are kept
    assert (runs / FOLDER / INDEX_NAME).is_file()
    read: list[str] = []
    for module, name in [(summary, "last_txnid"), (summary, "list_segments")]:
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, _name=name: read.append(_name) or _real(*a)
        )
    real_load = summary.Shelf.load
    monkeypatch.setattr(
        summary.Shelf, "load", lambda self, *a: read.append("summary file") or real_load(self, *a)
    )
    opened = _opened(monkeypatch)
    assert _shown(runs) == first
    assert (opened, read) == ([], [])
    with Journal.open(paths[3]) as journal:  # one changes: it alone is read
        journal.append(EntryKind.EPISODE, [b'{"id": "late"}'])
    (runs / FOLDER / "run-03.json").unlink()
    opened.clear()
    again = _shown(runs)
    assert first["run-03"] == (1, {int(EntryKind.EPISODE): 1}, None, [])
    assert again == {**first, "run-03": (2, {int(EntryKind.EPISODE): 2}, None, [])}
    assert opened == [paths[3]]
    index = runs / FOLDER / INDEX_NAME
    good = json.loads(index.read_bytes())
    for name, entry in good["entries"].items():  # each entry odd in its own way
        odd = [[], [[*entry[0][0][:6], "x", []], *entry[0][1:]], [entry[0][0], None, 0, 0, [1]]]
        good["entries"][name] = [odd[hash(name) % 3], entry[1][:-2]]
    for raw in [b"{mangled", json.dumps({**good, "v": 0}).encode(), json.dumps(good).encode()]:
        index.write_bytes(raw)  # missing or odd: each journal read as without it
        assert _shown(runs) == again
    opened.clear()
    assert _shown(runs) == again and opened == []  # written anew


def test_a_listing_that_finds_the_index_current_copies_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing of the whole directory that finds its index current writes
    nothing, and builds nothing to write: it made the index's every entry
    and row anew at each ``ls`` (~10 ms with 3,000 past runs) only to find
    them as written. One stale entry too few to write the index copies
    nothing either; one too many, and the index is written, whole."""
    runs = tmp_path / "runs"
    paths = [_journal(runs, f"run-{i:02d}", 1) for i in range(40)]
    later = types.SimpleNamespace(time_ns=lambda: time.time_ns() + 60 * 10**9, time=time.time)
    monkeypatch.setattr(summary, "time", later)
    first = _shown(runs)
    _shown(runs)  # the index is written once the summaries are kept
    index = runs / FOLDER / INDEX_NAME
    written = index.stat().st_mtime_ns, index.stat().st_ino
    copied: list[object] = []
    real = summary_index._files_json
    monkeypatch.setattr(
        summary_index, "_files_json", lambda found: copied.append(found) or real(found)
    )
    assert _shown(runs) == first
    with Journal.open(paths[3]) as journal:  # one changes: too few to write the index
        journal.append(EntryKind.EPISODE, [b'{"id": "late"}'])
    assert _shown(runs)["run-03"][0] == first["run-03"][0] + 1
    assert copied == []
    assert (index.stat().st_mtime_ns, index.stat().st_ino) == written
    monkeypatch.setattr(summary_index, "stale_most", lambda journals: 0)
    assert _shown(runs)["run-03"][0] == first["run-03"][0] + 1  # written: every entry
    assert len(copied) == len(paths)
    assert (index.stat().st_mtime_ns, index.stat().st_ino) != written
