"""The offline dashboard's per-journal index: a live run's new records appear,
and a step's rows come a page at a time.

The index (``dashboard/journal_index.py``) is read once and then only what a
journal appends after it, so a page of a live run must still show what was
logged since the last page; a training step of many episodes is shown in
pages of ``PAGE_SIZE`` rows, not decoded whole.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from damaging import flip_stored
from dashboard_helpers import fresh, serve_runs_dir
from sdk_helpers import point_at

import primeruns as pr
from primeruns.commands.demo_data import eval_episodes, train_episodes
from primeruns.journal import EntryKind, Journal
from primeruns.journal.summary import FOLDER
from primeruns.local.dashboard.journal_index import JournalIndex
from primeruns.local.dashboard.journal_source import JournalSource
from primeruns.local.dashboard.routes import PAGE_SIZE


def _live_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: int
) -> tuple[pr.Run, JournalSource, list[dict[str, Any]]]:
    """An evaluation still running, ``logged`` episodes in, its journals'
    source, and the demo episodes it logs copies of."""
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="live", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    demo = eval_episodes()
    run.log_episodes([fresh(demo[0]) for _ in range(logged)])
    return run, JournalSource(runs), demo


def test_a_live_runs_new_episodes_appear_on_the_next_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, source, demo = _live_evaluation(tmp_path, monkeypatch, 3)
    assert run.journal_path is not None
    rows, total = source.samples(run.journal_path.name, 0, PAGE_SIZE)
    assert total == 3 and len(rows) == 3
    later = [fresh(demo[1]) for _ in range(2)]
    run.log_episodes(later)
    rows, total = source.samples(run.journal_path.name, 0, PAGE_SIZE)
    assert total == 5 and [r.sample_id for r in rows[3:]] == [e["id"] for e in later]
    run.finish()


def test_a_steps_rows_are_paged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(
        name="t", kind="train", model="m", team_id="team-a", mode="offline", runs_dir=runs
    )
    assert run.journal_path is not None
    demo = train_episodes()[0]
    episodes = [fresh(demo[i % len(demo)]) for i in range(PAGE_SIZE + 3)]
    for episode in episodes:
        episode["run"]["work"]["step"] = 0
    run.log_episodes(episodes)
    run.finish()
    _, url = serve_runs_dir(runs)
    path = f"{url}/dashboard/training/{run.journal_path.name}/steps/0"
    first, second = httpx.get(path, timeout=30), httpx.get(f"{path}?page=2", timeout=30)
    assert first.status_code == 200 and second.status_code == 200
    assert f"{PAGE_SIZE + 3} rows" in first.text and "page 1 of 2" in first.text
    assert first.text.count('<tr class="step-row">') == PAGE_SIZE
    assert second.text.count('<tr class="step-row">') == 3
    shown = re.findall(r'<tr class="step-row">\s*<td>([^<]*)</td>', first.text + second.text)
    assert len(set(shown)) == PAGE_SIZE + 3  # every row once, none repeated across pages


def test_a_runs_pages_read_that_run_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, every page of a run (each page of its samples too) listed, and
    so opened, every journal of the runs directory first: with 3,000 past
    runs, seconds per page."""
    from primeruns.journal import Journal
    from primeruns.local.dashboard import journal_source

    runs = point_at(monkeypatch, tmp_path, None)
    demo = eval_episodes()
    ids = []
    for name in ("one", "two", "three"):
        run = pr.init(name=name, environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
        assert run.journal_path is not None
        run.log_episodes([fresh(demo[0]) for _ in range(3)])
        run.finish()
        ids.append(run.journal_path.name)
    source = JournalSource(runs)

    def listed(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run's page listed every journal")

    opened: list[Path] = []
    real = Journal.open

    def spy(path: Path, *args: object, **kwargs: object) -> Journal:
        opened.append(Path(path))
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(journal_source, "list_journals", listed)
    monkeypatch.setattr(Journal, "open", spy)
    detail = source.run(ids[1])
    rows, total = source.samples(ids[1], 0, PAGE_SIZE)
    assert detail is not None and detail.row.name == "two" and total == 3 and len(rows) == 3
    assert {p.name for p in opened} == {ids[1]}


def test_a_damaged_last_summary_shows_the_one_before_it(tmp_path: Path) -> None:
    # The index took the last summary by its header and showed a marker
    # where its body was damaged; a crash is closed out with the one before
    # it, and the page shows that one, the damage noted.
    journal = Journal.create(tmp_path, local_id="run")
    journal.append(EntryKind.SUMMARY, [b'{"step": 1}'])
    index = JournalIndex(True)
    index.update(journal)
    assert index.summary == {"step": 1}
    journal.append(EntryKind.METRICS, [b'{"step": 2, "loss": 0.5}'])
    damaged = journal.append(EntryKind.SUMMARY, [b'{"step": 2}']).first_seq
    assert damaged is not None
    journal.close()
    journal = Journal.open(tmp_path / "run")  # every entry in LMDB
    flip_stored(journal, damaged)
    index.update(journal)
    assert index.summary == {"step": 1}
    assert any(f"entry {damaged}" in note for note in index.notes)
    fresh_index = JournalIndex(True)
    fresh_index.update(journal)
    assert (fresh_index.summary, fresh_index.summary_seq) == ({"step": 1}, 1)
    journal.close()


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_damaged_entry_is_noted_once_on_its_runs_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A run's page lists a damaged entry among its damage once. The index
    goes over the headers once for the episodes and once for metric rows,
    and each pass noted a header that did not read: twice. An evaluation's
    index now makes no pass for what its journal does not hold (metric
    rows, summary entries), and a note met again is not added."""
    runs = point_at(monkeypatch, tmp_path, None)
    if kind == "eval":
        run = pr.init(name="e", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
        episodes = [fresh(eval_episodes()[0]) for _ in range(4)]
    else:
        run = pr.init(
            name="t", kind="train", model="m", team_id="team-a", mode="offline", runs_dir=runs
        )
        episodes = [fresh(train_episodes()[0][0]) for _ in range(4)]
    assert run.journal_path is not None
    run.log_episodes(episodes)
    if kind == "train":
        run.log_metrics({"loss": 0.5}, step=1)
    run.finish()
    with Journal.open(run.journal_path) as journal:
        first = journal.read(0, kinds={EntryKind.EPISODE}, max_entries=4)
        damaged = first.entries[2].seq
        flip_stored(journal, damaged, 0)  # its header's version: the header does not read
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None
    noted = [what for what in detail.row.damage if f"entry {damaged}:" in what]
    assert noted == [f"entry {damaged}: unknown frame version {0x02 ^ 0xFF}"]
    if kind == "train":
        assert detail.metrics and detail.metrics[0]["loss"] == 0.5  # its metric rows were read


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The journals each probe child walks from now on (their names), this
    process's walks forgotten, as in a new process."""
    from primeruns.journal import probe

    walked: list[list[str]] = []
    real_child = probe._run_child
    monkeypatch.setattr(probe, "_known", OrderedDict())
    monkeypatch.setattr(
        probe, "_run_child", lambda dirs: walked.append([d.name for d in dirs]) or real_child(dirs)
    )
    return walked


def test_a_runs_first_page_maps_a_journal_its_summary_vouches_for_without_a_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a run's first page walked the journal's whole tree in a child
    process before mapping it (~0.3 s for 20,000 episodes), though its
    current summary (kept only of a file walked clean, or written by the
    process keeping it) already vouched for that very file. A file changed
    since its summary is walked as ever (one kept in another boot:
    ``test_a_summary_kept_in_another_boot_vouches_for_nothing``)."""
    from primeruns.journal import probe

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="done", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    run.log_episodes([fresh(eval_episodes()[0]) for _ in range(3)])
    run.finish()
    walked = _walks(monkeypatch)  # a fresh process: no walk of it kept
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and detail.row.name == "done" and walked == []
    rows, total = JournalSource(runs).samples(run.journal_path.name, 0, PAGE_SIZE)
    assert total == 3 and len(rows) == 3 and walked == []
    # Its times set back after a change (``touch -r``): its change time moved.
    data = run.journal_path / "data.mdb"
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.setattr(probe, "_known", OrderedDict())
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and walked == [[run.journal_path.name]]


def test_a_runs_page_opens_where_the_system_keeps_no_boot_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where time has no CLOCK_BOOTTIME and the kernel no boot id (macOS), a
    finished run's page, and ``journal_info`` of it (``show``, ``replay``),
    raised AttributeError from a boot check of ``probe.vouch``. Nothing tells
    which boot a summary was walked in there: the journal is walked in a
    child, as before the vouch."""
    from primeruns.journal import origin
    from primeruns.journal.listing import journal_info

    monkeypatch.setattr(origin, "_BOOT_ID", tmp_path / "no-boot-id")

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="done", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    run.log_episodes([fresh(eval_episodes()[0]) for _ in range(3)])
    run.finish()
    monkeypatch.delattr(time, "CLOCK_BOOTTIME")
    walked = _walks(monkeypatch)  # a fresh process: no walk of it kept
    assert journal_info(run.journal_path).last_seq > 0
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and detail.row.name == "done"
    rows, total = JournalSource(runs).samples(run.journal_path.name, 0, PAGE_SIZE)
    assert total == len(rows) == 3 and walked == [[run.journal_path.name]]


def test_a_summary_read_while_no_child_could_walk_the_journal_vouches_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing that could start no child (a process limit reached, no
    memory to fork) opens each journal unwalked, as before, and kept its
    summary; that summary then vouched for the file (``probe.vouch``), and
    the run's page mapped it with no walk: a journal damaged inside its tree
    (never walked by anyone) could abort the dashboard's process in LMDB.
    Now such a summary still serves listings but vouches for nothing: the
    page walks the journal."""
    import subprocess

    from primeruns.journal import probe
    from primeruns.journal.listing import list_journals

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="done", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    run.log_episodes([fresh(eval_episodes()[0]) for _ in range(3)])
    run.finish()
    data = run.journal_path / "data.mdb"
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # changed since its summary
    monkeypatch.setattr(probe, "_known", OrderedDict())

    def no_child(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    with monkeypatch.context() as no_fork:
        no_fork.setattr(subprocess, "run", no_child)
        (listed,) = list_journals(runs, tally=True)
    assert listed.last_seq > 0 and not listed.damage  # listed as ever
    assert (runs / FOLDER / f"{run.journal_path.name}.json").is_file()  # kept: ls stays fast
    walked = _walks(monkeypatch)  # the dashboard: another process
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and detail.row.name == "done"
    assert walked == [[run.journal_path.name]]


def test_a_summary_kept_in_another_boot_vouches_for_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A summary kept in another boot (a disk written by a machine that then
    crashed, moved here, where its device number may well be the same) of a
    file whose change time falls in this boot vouched for it: the run's page
    mapped it unwalked, though the crash may have kept the file's times and
    meta page but not every data page the walk read then. Now only a summary
    made in this boot vouches; the page walks the journal."""
    from primeruns.journal import origin, probe
    from primeruns.journal.listing import list_journals

    runs = point_at(monkeypatch, tmp_path, None)
    other_boot = tmp_path / "boot_id"
    other_boot.write_text("0b5e55ed-0000-4000-8000-000000000000\n")
    with monkeypatch.context() as elsewhere:
        elsewhere.setattr(origin, "_BOOT_ID", other_boot)
        run = pr.init(name="done", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
        assert run.journal_path is not None
        run.log_episodes([fresh(eval_episodes()[0]) for _ in range(3)])
        run.finish()
        (listed,) = list_journals(runs, tally=True)
    assert listed.last_seq > 0 and (runs / FOLDER / f"{run.journal_path.name}.json").is_file()
    walked = _walks(monkeypatch)  # the dashboard: another process
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and detail.row.name == "done"
    assert walked == [[run.journal_path.name]]
    # Kept again in this boot (the journal changed since): vouched, no walk.
    data = run.journal_path / "data.mdb"
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    list_journals(runs, tally=True)
    monkeypatch.setattr(probe, "_known", OrderedDict())
    walked.clear()
    assert JournalSource(runs).run(run.journal_path.name) is not None and walked == []


def test_a_summary_kept_without_its_walk_vouches_once_one_walk_found_the_file_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A summary kept by an earlier version names no walk (``walked_in_boot``),
    so it vouched for nothing: every process that opened the unchanged
    journal (the dashboard's run page, ``show``) walked its whole tree in a
    child again, for as long as the journal did not change. Now the first
    walk of a boot that finds the file clean names this boot in the summary,
    and the next process maps it with no walk."""
    import json

    from primeruns.journal.summary import WALKED_IN

    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(name="done", environments=["gsm8k"], model="m", mode="offline", runs_dir=runs)
    assert run.journal_path is not None
    run.log_episodes([fresh(eval_episodes()[0]) for _ in range(3)])
    run.finish()
    kept = runs / FOLDER / f"{run.journal_path.name}.json"
    doc = json.loads(kept.read_text())
    assert doc["fields"].pop(WALKED_IN, None) is not None
    kept.write_text(json.dumps(doc))  # as an earlier version kept it
    walked = _walks(monkeypatch)  # a fresh process
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and detail.row.name == "done"
    assert walked == [[run.journal_path.name]]  # vouched for by nothing: walked
    walked = _walks(monkeypatch)  # the next process
    detail = JournalSource(runs).run(run.journal_path.name)
    assert detail is not None and detail.row.name == "done" and walked == []
    rows, total = JournalSource(runs).samples(run.journal_path.name, 0, PAGE_SIZE)
    assert total == 3 and len(rows) == 3 and walked == []


def _appends_while_indexed(monkeypatch: pytest.MonkeyPatch, append: Callable[[], None]) -> None:
    """Once, ``append`` runs just after an index's update looked for the
    journal's end: a live run's entries written while a page reads."""
    looked = Journal.last_seq
    pending = [append]

    def last_seq(journal: Journal) -> int:
        end = looked(journal)
        if pending and sys._getframe(1).f_code is JournalIndex.update.__code__:
            pending.pop()()
        return end

    monkeypatch.setattr(Journal, "last_seq", last_seq)


def test_a_live_runs_rows_appended_while_a_page_reads_are_charted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update read metric rows and episodes to the journal's end as it
    read them but recorded having read only to the end it looked up first:
    rows a training run appended meanwhile were read again by the next
    page's update, each of those steps charted twice (and its episodes
    counted twice)."""
    runs = point_at(monkeypatch, tmp_path, None)
    run = pr.init(
        name="t", kind="train", model="m", team_id="team-a", mode="offline", runs_dir=runs
    )
    assert run.journal_path is not None
    demo = train_episodes()[0][0]

    def log_step(step: int) -> None:
        episode = fresh(demo)
        episode["run"]["work"]["step"] = step
        run.log_episodes([episode])
        run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)

    log_step(0)
    source = JournalSource(runs)
    _appends_while_indexed(monkeypatch, lambda: log_step(1))
    first = source.run(run.journal_path.name)
    log_step(2)
    second = source.run(run.journal_path.name)
    run.finish()
    assert first is not None and second is not None
    assert [row["step"] for row in second.metrics] == [0, 1, 2]
    index = source._indexes[str(run.journal_path)]
    assert {step: len(seqs) for step, seqs in index.steps.items()} == {0: 1, 1: 1, 2: 1}


def test_a_live_evaluations_episodes_appended_while_a_page_reads_are_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, source, demo = _live_evaluation(tmp_path, monkeypatch, 2)
    assert run.journal_path is not None
    _appends_while_indexed(monkeypatch, lambda: run.log_episodes([fresh(demo[1])]))
    source.samples(run.journal_path.name, 0, PAGE_SIZE)
    rows, total = source.samples(run.journal_path.name, 0, PAGE_SIZE)
    run.finish()
    assert total == 3 and len({row.sample_id for row in rows}) == 3
