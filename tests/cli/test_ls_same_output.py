"""``primeruns ls`` says the same whether it reads its journals or what it kept of them.

A listing keeps what it read of each journal (``journal/summary.py``) and
the summaries of a whole runs directory in one index
(``journal/summary_index.py``), and reads the journals again only where
their files changed: that is what holds ``ls`` of 3,000 past runs under a
second. None of it may change a line a user reads. Here one runs directory
holds each kind of entry a listing meets (a finished run with its summary
current, one changed since its summary, a live run being written, a
damaged journal, a link to a journal elsewhere, never followed, copies
brought from elsewhere), and both
forms of ``ls`` print the same with no summary kept, with every summary
kept, and with the index written.
"""

from __future__ import annotations

import difflib
import os
import shutil
import time
from pathlib import Path

import pytest
from cli_helpers import cli, named_offline_eval
from sdk_helpers import point_at

from primeruns.journal import EntryKind, Journal
from primeruns.journal.summary import FOLDER
from primeruns.journal.summary_index import INDEX_NAME, stale_most


def _diff(first: list[str], again: list[str]) -> str:
    """What differs, line by line (the outputs are long)."""
    lines = [out.splitlines() for out in (*first, *again)]
    return "\n".join(difflib.unified_diff(lines[0] + lines[1], lines[2] + lines[3], lineterm=""))


def _listed(capsys: pytest.CaptureFixture[str], runs: Path) -> list[str]:
    """What ``ls --json`` and ``ls`` print of ``runs``, in that order."""
    outs = []
    for argv in (["ls", "--json"], ["ls"]):
        code, out, _ = cli(capsys, *argv, "--runs-dir", str(runs))
        assert code == 0
        outs.append(out)
    return outs


def test_ls_prints_the_same_from_its_journals_and_from_what_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    fresh = named_offline_eval(runs, "fresh")
    for i in range(stale_most(0) + 1):  # copies brought from elsewhere: enough for an index
        shutil.copytree(fresh, runs / f"copy-{i:02d}", symlinks=True)
    stale = named_offline_eval(runs, "stale")
    elsewhere = named_offline_eval(tmp_path / "elsewhere", "linked")
    os.symlink(elsewhere, runs / "linked")  # never followed: listed as not opened
    damaged = runs / "damaged"
    damaged.mkdir(mode=0o700)
    (damaged / "data.mdb").write_bytes(os.urandom(3 * 4096))
    # Held by its writer (this process) throughout; its mover and background
    # sync stopped, so that its files do not change between two listings.
    live = Journal.create(
        runs, local_id="live", meta={"spec": {"kind": "eval", "mode": "offline", "name": "live"}}
    )
    live.append(EntryKind.EPISODE, [b'{"id": "e1"}', b'{"id": "e2"}'])
    live.quiesce()
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)  # ages alike in every listing

    def listed() -> list[str]:
        return _listed(capsys, runs)

    shutil.rmtree(runs / FOLDER)
    first = listed()  # every journal read
    data = stale / "data.mdb"
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # its change time moved: stale
    again = listed()  # summaries kept, the stale journal read again
    assert again == first, _diff(first, again)
    shutil.rmtree(runs / FOLDER)
    for _ in range(3):
        again = listed()
        assert again == first, _diff(first, again)
    assert (runs / FOLDER / INDEX_NAME).is_file()
    for name in ("fresh", "stale", "live", "damaged", "linked"):
        assert name in first[0] or any(name in line for line in first[1].splitlines())
    assert "not opened" in first[0] and '"outcome": "running"' in first[0]
    live.close()


def test_ls_reads_listing_rows_and_prints_the_same_beside_a_stale_or_damaged_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ls`` of 3,000 past runs parsed every journal's whole summary (8.4 MB:
    each carries the journal's meta) to show about twenty values of each. Now
    the index keeps a listing row per journal (its summary's fields with the
    meta values ``ls`` reads), and ``ls`` reads those: the same lines, from
    rows; from the journal's summary where its row is stale (the journal
    changed); from the journal where a row is damaged."""
    import orjson

    from primeruns.journal.summary_index import ROW_META
    from primeruns.sinks.kinds import SINK_KINDS

    # Every meta value the listing's readers name is one a row keeps.
    assert {f"sink_off.{sink}" for sink in SINK_KINDS} <= ROW_META
    runs = point_at(monkeypatch, tmp_path, None)
    first_run = named_offline_eval(runs, "first")
    for i in range(stale_most(0) + 1):  # copies brought from elsewhere: enough for an index
        shutil.copytree(first_run, runs / f"copy-{i:02d}", symlinks=True)
    changed = named_offline_eval(runs, "changed")
    damaged = named_offline_eval(runs, "damaged-row")
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)

    def listed() -> list[str]:
        return _listed(capsys, runs)

    shutil.rmtree(runs / FOLDER)
    first = listed()  # every journal read, its summary kept
    assert listed() == first  # the index written, with a row per journal
    index = runs / FOLDER / INDEX_NAME
    doc = orjson.loads(index.read_bytes())
    rows = doc["rows"]
    assert set(rows) == {p.name for p in runs.iterdir() if not p.name.startswith(".")}
    assert set(rows[first_run.name]["meta"]) <= ROW_META
    assert rows[first_run.name]["meta"]["spec"]["name"] == "first"
    # One row damaged (counts that are none), another's journal changed since.
    rows[damaged.name]["cursors"] = {"traces": -1}
    rows[damaged.name]["last_seq"] = "many"
    index.write_bytes(orjson.dumps(doc))
    data = changed / "data.mdb"
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # its change time moved: stale
    opened: list[str] = []
    real_open = Journal.open.__func__  # type: ignore[attr-defined]

    def recorded(cls: type[Journal], path: Path, *args: object, **kwargs: object) -> Journal:
        opened.append(Path(path).name)
        return real_open(cls, path, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(Journal, "open", classmethod(recorded))
    again = listed()
    assert again == first, _diff(first, again)
    # The damaged row's journal is read from its summary, not opened.
    assert changed.name in opened and damaged.name not in opened


def test_ls_reads_no_lock_file_of_a_dead_owner_again_yet_sees_a_new_owner_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An online run's uplink leaves its name in the lock file, so ``ls`` of
    3,000 past runs read and judged 3,000 dead owners (a fifth of it). The
    index keeps each owner found dead by its pids, with its lock file's
    ``lstat``: ``ls`` reads none of those files again, and lists the same;
    a process that takes a journal over writes the file, and ``ls`` sees it
    running at once."""
    import json
    import subprocess
    import sys

    import orjson

    from primeruns.journal import lock, summary_index

    # Lock files written an instant before count as settled (their change
    # time cannot be set back two seconds).
    monkeypatch.setattr(summary_index, "RACY_NS", 0, raising=False)
    runs = point_at(monkeypatch, tmp_path, None)
    first_run = named_offline_eval(runs, "first")
    for i in range(stale_most(0) + 1):  # copies brought from elsewhere: enough for an index
        shutil.copytree(first_run, runs / f"copy-{i:02d}", symlinks=True)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    dead = {
        "pid": int(ended.stdout),
        "host": lock.this_host(),
        "started": time.time(),
        "proc_start": 1,
        "pid_ns": lock._pid_ns(),
    }
    journals = sorted(p for p in runs.iterdir() if not p.name.startswith("."))
    for path in journals:
        (path / lock.LOCK_NAME).write_text(json.dumps(dead))
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now)
    first = _listed(capsys, runs)  # every lock file read, the index written
    read: list[str] = []
    real_open = os.open

    def recorded(path: object, *args: object, **kwargs: object) -> int:
        read.append(os.fspath(path))  # type: ignore[call-overload]
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", recorded)
    again = _listed(capsys, runs)
    assert again == first, _diff(first, again)
    assert not [p for p in read if p.endswith(lock.LOCK_NAME)]
    doc = orjson.loads((runs / FOLDER / INDEX_NAME).read_bytes())
    assert set(doc["dead_owners"]) == {p.name for p in journals}
    monkeypatch.setattr(os, "open", real_open)
    # A takeover names its (live) process in the file.
    taken = journals[-1]
    me = os.getpid()
    live = {**dead, "pid": me, "proc_start": lock._proc_start(me), "command": "replay"}
    (taken / lock.LOCK_NAME).write_text(json.dumps(live))
    code, out, _ = cli(capsys, "ls", "--json", "--runs-dir", str(runs))
    assert code == 0
    (row,) = [r for r in json.loads(out) if r["path"] == str(taken)]
    assert row["outcome"] == "running", row
    assert sum(r["outcome"] == "running" for r in json.loads(out)) == 1
