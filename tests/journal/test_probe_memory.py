"""The probe's verdicts stay bounded in a process that lives long (the
dashboard): one per journal, however often a live journal changes."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

import pytest

from primeruns.journal import EntryKind, Journal, probe


def _vouched(directory: Path) -> None:
    """What a current summary does for a reader of one journal (``vouch``)."""
    st = os.stat(directory / "data.mdb")
    probe.vouch(directory, [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])


def test_a_reader_watching_a_live_journal_keeps_one_verdict_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a verdict was kept per state of the file (its size and times),
    for the process's life: the dashboard watching a live run held one more
    entry per change, 200 here, and a run of days millions."""
    monkeypatch.setattr(probe, "_known", OrderedDict())
    with Journal.create(tmp_path / "runs") as journal:
        directory = journal.path
        for i in range(200):
            journal.append(EntryKind.METRICS, [json.dumps({"step": i}).encode()])
            # Each change is a new state of the file by ``stat``: its times
            # move on a coarse clock, so set them apart here.
            os.utime(directory / "data.mdb", ns=(i * 10**9, i * 10**9))
            if i % 40 == 0:  # a walk in a child now and then, as a page with no summary does
                assert probe.probe(directory) is None
            else:
                _vouched(directory)
            assert probe.probe(directory) is None
            assert len(probe._known) == 1


def test_past_its_bound_the_least_recently_read_journal_is_walked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "_known", OrderedDict())
    monkeypatch.setattr(probe, "KNOWN_MAX", 3)
    directories = []
    for name in "abcd":
        with Journal.create(tmp_path / name) as journal:
            journal.append(EntryKind.METRICS, [b'{"step": 1}'])
            directories.append(journal.path)
    walks: list[list[Path]] = []
    monkeypatch.setattr(
        probe, "_run_child", lambda ds: (walks.append(list(ds)), ([None] * len(ds), False))[1]
    )
    probe.probe_many(directories[:3])
    probe.probe(directories[0])  # read again: the most recently used
    probe.probe(directories[3])  # the fourth drops the least recently read, b
    assert len(probe._known) == 3
    probe.probe_many(directories)  # a, c and d are known: only b is walked again
    assert walks == [directories[:3], [directories[3]], [directories[1]]]
