"""The index of a runs directory by run (``primeruns.run_index``): the close-out
of a primary attached by id, and an attach, read the run's journals, not every
past run of the runs directory."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from primeruns import ranks, run_index
from primeruns.journal import EntryKind, Journal
from primeruns.journal.lock import LOCK_NAME
from primeruns.ship.uplink import earlier_journals
from primeruns.spec import SPEC_KEY, RunSpec


def _journal(runs: Path, stamp: int, *, attach: str | None, bound: str | None = None) -> Journal:
    """A journal as an older version made it (not entered in the index)."""
    spec = RunSpec(kind="eval", name=str(stamp), attach_id=attach)
    meta: dict[str, Any] = {SPEC_KEY: spec.to_json()}
    if bound is not None:
        meta["platform"] = {"run_id": bound, "kind": "eval"}
    return Journal.create(runs, local_id=f"20261203-{stamp:06d}-aaaaaaaa", meta=meta)


@pytest.fixture
def reads(journal_reads: list[str]) -> list[str]:
    return journal_reads


def _close_out(runs: Path, stamp: int, run_id: str) -> tuple[list[Path], Path]:
    """The others a primary attached to ``run_id`` (entered as ``init`` enters
    it) looks for at its close-out, and its journal's path."""
    mine = _journal(runs, stamp, attach=run_id)
    run_index.enter(mine.path, run_id)
    try:
        return ranks.others_of(mine, run_id, own_children=False), mine.path
    finally:
        mine.close()


def test_an_attached_primarys_close_out_reads_no_past_run(tmp_path: Path, reads: list[str]) -> None:
    """A torchrun job's primary attaches to its run by id: its close-out
    looked for the run's other ranks by reading every journal of the runs
    directory (a second per thousand past runs, on every job's finish). Past
    runs an older version made are read by the first look, once; a later
    job's close-out reads only its own run's journals."""
    runs = tmp_path / "runs"
    for stamp in range(30):  # past runs of an older version: created, attached, bound
        attach = f"old-{stamp}" if stamp % 2 else None
        _journal(runs, stamp, attach=attach, bound=f"old-{stamp}").close()
    _close_out(runs, 100, "run-1")  # an earlier job's close-out: reads them once
    rank = _journal(runs, 200, attach="run-2")
    run_index.enter(rank.path, "run-2")
    rank.close()
    reads.clear()
    others, mine = _close_out(runs, 201, "run-2")
    assert others == [rank.path]
    assert sorted(set(reads)) == [rank.path.name]
    reads.clear()  # a requeued job's attach looks for the run's earlier journals
    assert earlier_journals(runs, "run-2", exclude=mine) == ([rank.path], [], [])
    assert sorted(set(reads)) == [rank.path.name]


def test_a_journal_init_makes_is_entered_under_the_run_it_attaches_to(
    tmp_path: Path, reads: list[str]
) -> None:
    import primeruns as pr

    runs = tmp_path / "runs"
    _journal(runs, 1, attach="run-0").close()
    _close_out(runs, 2, "run-0")  # entered
    run = pr.init(mode="offline", id="run-1", runs_dir=runs, primary=False)
    run.finish()
    reads.clear()
    others, _ = _close_out(runs, 999999, "run-1")
    assert [p.name for p in others] == sorted(set(reads)) != []


def test_a_rank_an_older_version_made_is_found_while_it_logs_and_after(
    tmp_path: Path, reads: list[str]
) -> None:
    """A journal no version of the index entered (an older version's, or one
    copied from another host) is read by every look while a process holds
    it (its meta may still change: it binds), and entered once none does."""
    runs = tmp_path / "runs"
    old = _journal(runs, 1, attach="run-1")
    old_path = old.path
    old.close()
    fd = os.open(old_path / LOCK_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its process still logs
    try:
        first, _ = _close_out(runs, 2, "run-1")
    finally:
        os.close(fd)
    reads.clear()
    second, _ = _close_out(runs, 3, "run-1")  # read again: then entered
    assert old_path.name in reads
    reads.clear()
    third, _ = _close_out(runs, 4, "run-1")
    assert old_path in first and old_path in second and old_path in third
    assert old_path.name in reads  # read as one of the run's, by its marker
    other = _close_out(runs, 5, "run-9")[0]
    assert old_path not in other


def test_a_journal_that_binds_later_is_found_under_its_run(tmp_path: Path) -> None:
    """A run key's journal, or a forked child made before the run was
    registered, names its run only once it binds: the binding enters it."""
    runs = tmp_path / "runs"
    later = _journal(runs, 1, attach=None)
    run_index.enter(later.path, None)
    later.set_meta("platform", {"run_id": "run-1", "kind": "eval"})
    run_index.note(later.path, "run-1")
    later.close()
    assert _close_out(runs, 2, "run-1")[0] == [later.path]


def test_gc_prunes_the_markers_of_deleted_journals(tmp_path: Path) -> None:
    from primeruns.journal import delete_journal

    runs = tmp_path / "runs"
    kept = _journal(runs, 1, attach="run-1")
    gone = _journal(runs, 2, attach="run-2")
    for journal in (kept, gone):
        run_index.enter(journal.path, journal.get_meta(SPEC_KEY)["attach_id"])
        journal.close()
    delete_journal(gone.path)
    assert run_index.prune(runs) == 2  # its run's marker, and its entry
    folders = sorted(p.name for p in (runs / run_index.FOLDER).iterdir())
    assert folders == sorted([".known", run_index._digest("run-1")])
    assert _close_out(runs, 3, "run-1")[0] == [kept.path]


def test_an_index_folder_that_is_a_symlink_is_not_used(tmp_path: Path) -> None:
    """A neighbour plants ``.runs`` as a link to a folder of theirs: nothing
    is made through it, and the look reads every journal, as before."""
    runs = tmp_path / "runs"
    rank = _journal(runs, 1, attach="run-1")
    rank.close()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (runs / run_index.FOLDER).symlink_to(theirs)
    assert _close_out(runs, 2, "run-1")[0] == [rank.path]
    assert list(theirs.iterdir()) == []


def test_a_run_id_names_no_path_outside_the_index(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    journal = _journal(runs, 1, attach="../../x")
    before = set(tmp_path.rglob("*"))
    run_index.enter(journal.path, "../../x")
    run_index.note(journal.path, "/etc")
    run_index.note(journal.path, "run-\udcff")  # an id from the environment's bytes
    journal.close()
    made = {p.relative_to(runs) for p in set(tmp_path.rglob("*")) - before}
    assert len(made) == 9  # .runs, .known and its marker, three run folders and theirs
    assert all(p.parts[0] == run_index.FOLDER for p in made)


def test_a_copy_brought_again_after_its_journal_bound_is_found_under_its_run(
    tmp_path: Path, reads: list[str]
) -> None:
    """A copy of a rank's journal from its node (a cluster's rsync) is read
    and entered by the first look after it arrived, before the rank bound
    (a run key's journal, a child forked before the run was registered: its
    meta names no run yet). Its node's journal then binds, and the copy is
    brought again: the look of a requeued job attaching by the run's id must
    still find it (its records were never shipped from here), as the reading
    of every journal's meta did."""
    import shutil

    runs, node = tmp_path / "runs", tmp_path / "node"
    rank = _journal(node, 1, attach=None)
    rank.close()
    copy = runs / rank.path.name
    shutil.copytree(rank.path, copy)  # the first rsync
    assert _close_out(runs, 2, "run-0")[0] == []  # a look: it logs to no run yet, entered so
    with Journal.open(rank.path) as journal:  # on its node, it binds
        journal.set_meta("platform", {"run_id": "run-1", "kind": "eval"})
    shutil.rmtree(copy)
    shutil.copytree(rank.path, copy)  # the next rsync brings it again
    assert earlier_journals(runs, "run-1").left == [copy]
    assert _close_out(runs, 3, "run-1")[0] == [copy]
    reads.clear()  # entered under its run now, for good: another run's look reads it no more
    _close_out(runs, 4, "run-9")
    assert copy.name not in reads


def test_a_binding_enters_the_journal_under_its_run_before_its_meta_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank of a run key binds: its journal, entered at init under no run,
    names the run in its meta, and in the index. A process killed between
    the two (its meta written first) would leave a journal bound to the run
    that no look reads: the requeued job's attach would never ship what it
    logged, which the reading of every journal's meta did. The index is
    written first; a marker whose meta never followed is passed over."""
    from types import SimpleNamespace

    from primeruns.ship.lifecycle import Lifecycle
    from primeruns.ship.policy import RetryPolicy

    runs = tmp_path / "runs"
    journal = _journal(runs, 1, attach=None)
    run_index.enter(journal.path, None)
    marker = runs / run_index.FOLDER / run_index._digest("run-1") / journal.path.name
    entered_first: list[bool] = []
    real = Journal.set_meta

    def set_meta(self: Journal, key: str, value: Any) -> None:
        if key == "platform":
            entered_first.append(marker.exists())
        real(self, key, value)

    monkeypatch.setattr(Journal, "set_meta", set_meta)
    client: Any = SimpleNamespace(settings=SimpleNamespace(api_root="http://127.0.0.1:9/api/v1"))
    lifecycle = Lifecycle(journal, client, policy=RetryPolicy(), on_failure=lambda *_: None)
    spec = RunSpec(kind="eval", name="keyed", run_key="key-1")
    try:
        lifecycle._bind(spec, "run-1", "keyed", None)
    finally:
        journal.close()
    assert entered_first == [True]


def test_a_binding_deletes_nothing_through_an_index_folder_that_is_a_symlink(
    tmp_path: Path,
) -> None:
    """A binding that cannot enter its journal takes it out of the entered
    ones, so that looks read it: never through ``.runs`` planted as a link
    (to another folder holding a file of the journal's name)."""
    runs = tmp_path / "runs"
    journal = _journal(runs, 1, attach=None)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / ".known").mkdir(parents=True)
    kept = elsewhere / ".known" / journal.path.name
    kept.touch()
    (runs / run_index.FOLDER).symlink_to(elsewhere)
    run_index.note(journal.path, "run-1")
    journal.close()
    assert kept.exists()


def test_a_binding_that_cannot_enter_its_journal_leaves_it_to_every_look(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    journal = _journal(runs, 1, attach=None)
    run_index.enter(journal.path, None)
    (runs / run_index.FOLDER / run_index._digest("run-1")).touch()  # no folder: no marker
    run_index.note(journal.path, "run-1")
    journal.set_meta("platform", {"run_id": "run-1", "kind": "eval"})
    journal.close()
    assert not (runs / run_index.FOLDER / ".known" / journal.path.name).exists()
    assert _close_out(runs, 2, "run-1")[0] == [journal.path]


def test_a_folder_gc_deleted_during_a_look_is_made_again(tmp_path: Path) -> None:
    """A look checks each folder of the index once (entering thousands of
    past journals at the first look after an upgrade); a folder ``gc``
    deleted as empty meanwhile is made again, not taken as made."""
    root = tmp_path / "runs" / run_index.FOLDER
    root.parent.mkdir(mode=0o700)
    made = {".known"}  # as checked earlier in the look, then deleted by gc
    run_index._mark(root, ".known", "20261203-000001-aaaaaaaa", made=made)
    assert (root / ".known" / "20261203-000001-aaaaaaaa").is_file()
    assert oct((root / ".known").stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("platform", [["run-3"], "run-3", 7])
def test_a_journal_whose_platform_meta_is_no_mapping_is_passed_over(
    tmp_path: Path, platform: Any
) -> None:
    """A journal is untrusted input (a copy, a damaged meta): a ``platform``
    meta that is no mapping raised AttributeError out of the primary's
    close-out and out of an attach's look for the run's earlier journals
    (``init(id=)``), whatever else the runs directory held."""
    runs = tmp_path / "runs"
    odd = Journal.create(runs, local_id="20261203-000001-aaaaaaaa", meta={"platform": platform})
    odd.close()
    rank = _journal(runs, 2, attach="run-3")
    rank.close()
    others, mine = _close_out(runs, 3, "run-3")
    assert others == [rank.path]
    assert earlier_journals(runs, "run-3", exclude=mine) == ([rank.path], [], [])


def _ended(
    runs: Path, stamp: int, *, meta: dict[str, Any], acked: dict[str, int] | None = None
) -> Path:
    """A journal of run ``run-1`` whose process logged two episodes and a
    finish and is gone, ``meta`` added, each sink acknowledged as ``acked``
    says (to its end by default)."""
    journal = _journal(runs, stamp, attach=None, bound="run-1")
    with journal:
        journal.append(EntryKind.EPISODE, [b'{"id": "a"}', b'{"id": "b"}'])
        journal.append(EntryKind.FINISH, [b'{"status": "completed"}'])
        end = journal.last_seq()
        for sink, upto in (acked or {"eval_samples": end, "traces": end}).items():
            journal.ack(sink, upto)
        journal.update_meta(meta)
    return journal.path


def test_a_requeued_jobs_look_passes_over_an_earlier_journal_that_left_nothing_to_ship(
    tmp_path: Path,
) -> None:
    """A run key's (or an attach's) next process takes over the journals its
    run's earlier processes left; one that finished, every sink acknowledged
    to its end and its run closed out (as its meta says), has nothing left,
    and taking it over only copied it into a sync journal again on each
    requeue. One that says less, or says it in another shape (a journal is
    untrusted), is taken over as before."""
    runs = tmp_path / "runs"
    closed = {"state": "shipped", "finalized": {"status": "completed", "at": 1.0}}
    done = _ended(runs, 1, meta=closed)
    close_out_failed = _ended(runs, 2, meta={})
    behind = _ended(runs, 3, meta=closed, acked={"eval_samples": 3, "traces": 1})
    one_sink = _ended(runs, 4, meta=closed, acked={"eval_samples": 3})
    odd_finalized = _ended(runs, 5, meta={"state": "shipped", "finalized": "yes"})
    no_spec = _ended(runs, 6, meta={**closed, SPEC_KEY: 5})
    assert earlier_journals(runs, "run-1") == (
        [close_out_failed, behind, one_sink, odd_finalized, no_spec],
        [done],
        [],
    )


def test_a_requeued_jobs_look_takes_over_an_earlier_journal_whose_close_out_or_spec_reads_empty(
    tmp_path: Path,
) -> None:
    """A journal is untrusted: one whose close-out says nothing
    (``finalized: {}``), or whose spec is damaged to ``{}`` (which reads as
    an evaluation's, so that the sinks checked were perhaps not the run's),
    was passed over as having left nothing. Each is taken over instead."""
    runs = tmp_path / "runs"
    closed = {"state": "shipped", "finalized": {"status": "completed", "at": 1.0}}
    empty_close_out = _ended(runs, 1, meta={"state": "shipped", "finalized": {}})
    empty_spec = _ended(runs, 2, meta={**closed, SPEC_KEY: {}})
    assert earlier_journals(runs, "run-1") == ([empty_close_out, empty_spec], [], [])
