"""Which process of several attached to one run is its primary (``primeruns.ranks``):
the launcher's choice first, then the run's creator, then rank 0, then the
first process on the host to attach."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from primeruns import ranks, redaction
from primeruns.exceptions import ConfigurationError
from primeruns.journal.lock import LOCK_NAME


def _role(
    env: dict[str, str],
    tmp_path: Path,
    *,
    attach: str | None = "run-1",
    primary: bool | None = None,
    local_id: str = "20261203-090000-aaaa",
) -> ranks.Role:
    return ranks.resolve_role(
        primary, attach_id=attach, runs_dir=tmp_path, local_id=local_id, environ=env
    )


@pytest.mark.parametrize(
    ("env", "primary", "label"),
    [
        ({"RANK": "0"}, True, "rank0"),
        ({"RANK": "3"}, False, "rank3"),
        ({"SLURM_PROCID": "0"}, True, "rank0"),
        ({"SLURM_PROCID": "5"}, False, "rank5"),
        ({"RANK": "1", "SLURM_PROCID": "0"}, False, "rank1"),  # torchrun's rank under srun
        ({"RANK": "2", "PRIME_RUNS_PRIMARY": "yes"}, True, "rank2"),
        ({"RANK": "0", "PRIME_RUNS_PRIMARY": "0"}, False, "rank0"),
    ],
)
def test_the_launcher_names_the_primary_by_its_rank_or_the_variable(
    tmp_path: Path, env: dict[str, str], primary: bool, label: str
) -> None:
    role = _role(env, tmp_path)
    assert (role.primary, role.label) == (primary, label)


@pytest.mark.parametrize(
    ("env", "rank", "said"),
    [
        ({"RANK": "1234567890"}, None, "has 10 digits, more than any rank (at most 9)"),
        ({"RANK": "1234567890", "SLURM_PROCID": "2"}, 2, "SLURM_PROCID=2 is taken instead"),
        ({"RANK": "-1"}, None, "is not a rank"),
        ({"RANK": "rank3"}, None, "is not a rank"),
    ],
    ids=["ten-digits", "ten-digits-under-srun", "negative", "words"],
)
def test_a_rank_variable_that_is_no_rank_is_said_once_with_its_fix(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    rank: int | None,
    said: str,
) -> None:
    """A launcher's rank of ten digits was read as no rank in silence, as any
    other value that is none: the process took the part of a process without
    a rank (the run's primary if the first on this host to attach) and nobody
    said why. It is still no rank (the next variable read), and said once,
    naming the variable, what is wrong with its value and the fix."""
    monkeypatch.setattr(ranks, "_warned_ranks", set(), raising=False)  # (said once a process)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        roles = [_role(env, tmp_path, local_id=f"20261203-090000-aaa{i}") for i in range(2)]
    assert [role.rank for role in roles] == [rank, rank]
    warnings = [r.getMessage() for r in caplog.records if "RANK=" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"RANK={env['RANK']!r}" in warnings[0]
    assert said in warnings[0]
    assert "Set RANK to this process's rank" in warnings[0]


def test_a_rank_variable_holding_the_api_key_is_said_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key pasted into a rank variable (``RANK=$PRIME_API_KEY`` for
    ``$RANK``) is no rank, and the warning that says so names the variable,
    not the key: a log is no place for it."""
    key = "pk-rank-0123456789abcdef"
    monkeypatch.setattr(redaction, "_secrets", set())  # (this test's key only)
    redaction.remember_secret(key)  # (as the run's settings do once they resolve it)
    monkeypatch.setattr(ranks, "_warned_ranks", set(), raising=False)
    with caplog.at_level(logging.WARNING, logger="primeruns"):
        assert _role({"RANK": key}, tmp_path).rank is None
        assert _role({"RANK": f"Bearer {key[:-1]}", "SLURM_PROCID": "1"}, tmp_path).rank == 1
    warnings = [r.getMessage() for r in caplog.records if "RANK=" in r.getMessage()]
    assert len(warnings) == 2, warnings
    for warning in warnings:
        assert "pk-rank-" not in warning, warning
        assert "Set RANK to this process's rank" in warning


def test_an_explicit_argument_wins_and_a_created_run_is_its_creators(tmp_path: Path) -> None:
    assert _role({"RANK": "0"}, tmp_path, primary=False).primary is False
    assert _role({"PRIME_RUNS_PRIMARY": "0"}, tmp_path, primary=True).primary is True
    assert _role({"RANK": "4"}, tmp_path, attach=None).primary is True  # init() created it


def test_a_primary_variable_that_is_not_a_boolean_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="PRIME_RUNS_PRIMARY"):
        ranks.primary_from_env({"PRIME_RUNS_PRIMARY": "rank0"})


def test_without_a_rank_the_first_to_attach_is_the_primary_while_its_journal_is_in_use(
    tmp_path: Path,
) -> None:
    run = f"run-{os.getpid()}-{id(tmp_path)}"  # the lock is this process's for its life
    first = _role({}, tmp_path, attach=run, local_id="j1")
    journal = tmp_path / "j1"
    journal.mkdir()
    fd = os.open(journal / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the first handle's journal, still open
    try:
        second = _role({}, tmp_path, attach=run, local_id="j2")
    finally:
        os.close(fd)
    third = _role({}, tmp_path, attach=run, local_id="j3")  # the first one finished
    assert (first.primary, second.primary, third.primary) == (True, False, True)
    assert second.label == "j2"


def _in_use(journal: Path) -> int:
    """Hold the owner lock of a journal at ``journal`` (its handle still in
    use); the descriptor to close."""
    journal.mkdir()
    fd = os.open(journal / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


@pytest.mark.parametrize("variable", ["SLURM_PROCID", "RANK"])
def test_a_child_that_inherited_its_parents_rank_is_neither_that_rank_nor_the_primary(
    tmp_path: Path, variable: str
) -> None:
    """Processes no launcher started one by one share the rank they
    inherited (``torch.multiprocessing.spawn`` in an sbatch script: all of
    them ``SLURM_PROCID=0``). One that attaches while the rank's holder
    lives neither closes the run (a second primary's ``finish()`` closes it
    while the rest still log) nor takes its label and sample id ranges
    (their keys of a step would overwrite each other's, their Parquet rows
    of a step share sample ids). The holder's own later handles keep it."""
    run = f"run-{os.getpid()}-{variable}"  # the locks are this process's for its life
    env = {variable: "0"}
    first = _role(env, tmp_path, attach=run, local_id="j1")
    held = [_in_use(tmp_path / "j1")]
    try:
        again = _role(env, tmp_path, attach=run, local_id="j2")  # a second phase
        held.append(_in_use(tmp_path / "j2"))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                child = _role(env, tmp_path, attach=run, local_id="j3")
                os.write(write, json.dumps(child.to_json()).encode())
            finally:
                os._exit(0)
        os.close(write)
        child = ranks.Role.from_json(json.loads(os.read(read, 1000)))
        os.waitpid(pid, 0)
    finally:
        for fd in held:
            os.close(fd)
    assert first == again == ranks.Role(primary=True, label="rank0", rank=0)
    assert child == ranks.Role(primary=False, label="j3")


_RANK_0_THAT_DIES_LEAVING_A_CHILD = """
import os, sys
from pathlib import Path
from primeruns import ranks, redaction

runs, run, held = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
role = ranks.resolve_role(None, attach_id=run, runs_dir=runs, local_id="old", environ={"RANK": "0"})
assert role.primary
if os.fork() == 0:  # a worker of its own (a data loader's), alive after it
    os.read(held, 1)  # until the test lets it go
    os._exit(0)
os._exit(0)  # killed: nothing of it runs at its end
"""


def test_a_restarted_rank_0_is_the_primary_while_a_child_of_the_dead_one_lives(
    tmp_path: Path,
) -> None:
    """torchrun restarts rank 0 after it died, while a forked worker of the
    dead one (a data loader's) has not noticed yet. The worker must not keep
    the rank: the new rank 0 would be nobody's primary, and the run never
    closed."""
    run = f"run-{os.getpid()}-restarted"
    held, release = os.pipe()
    try:
        args = [str(tmp_path), run, str(held)]
        died = subprocess.run(
            [sys.executable, "-c", _RANK_0_THAT_DIES_LEAVING_A_CHILD, *args],
            pass_fds=(held,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        restarted = _role({"RANK": "0"}, tmp_path, attach=run, local_id="new")
    finally:
        os.close(release)  # the dead one's worker ends
        os.close(held)
    assert died.returncode == 0
    assert restarted == ranks.Role(primary=True, label="rank0", rank=0)


def test_a_role_read_back_from_a_damaged_meta_value_is_none() -> None:
    assert ranks.Role.from_json({"primary": False}) is None
    assert ranks.Role.from_json("x") is None
    role = ranks.Role.from_json({"primary": False, "label": "rank2", "rank": 2})
    assert role == ranks.Role(primary=False, label="rank2", rank=2)


def test_the_step_table_and_primary_lock_folders_follow_no_symlink(tmp_path: Path) -> None:
    """A shared scratch disk: a neighbour plants ``.steps`` and ``.primary``
    as links to a folder of theirs. Nothing is created through them (the
    step table goes unused, the row is sent as it is; the role falls back)."""
    from primeruns.sinks.step_rows import StepRows

    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (runs / ".steps").symlink_to(theirs)
    (runs / ".primary").symlink_to(theirs)
    table = StepRows(runs, label="rank1", primary=False, rank=1)
    assert table.merge("run-1", 0, {"loss": 1.0}) is None
    table.close()
    assert ranks._first_to_attach(runs, "run-1", "local-1") is True
    assert list(theirs.iterdir()) == []


def _merge_at_once(folder: str, rank: int, barrier: Any, out: Any) -> None:
    from primeruns.sinks.step_rows import StepRows

    table = StepRows(Path(folder), label=f"rank{rank}", primary=rank == 0, rank=rank)
    barrier.wait()
    merged = table.merge("run-1", 0, {f"loss_r{rank}": 1.0})
    out.put((rank, merged is not None))
    table.close()


def test_ranks_opening_the_step_table_at_once_all_merge_into_it(tmp_path: Path) -> None:
    """Four ranks' uplinks ship step 0 at the same moment, each opening the
    host's step table for the first time. Each must merge: one that found it
    locked gave up on it for good and sent its rows as logged, and the row
    that landed last lacked its key (CI: "rank 0's key lost at step 0")."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for trial in range(25):
        folder = tmp_path / f"runs{trial}"
        folder.mkdir(mode=0o700)
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [
            ctx.Process(target=_merge_at_once, args=(str(folder), r, barrier, out))
            for r in range(4)
        ]
        for proc in procs:
            proc.start()
        merged = dict(out.get(timeout=60) for _ in procs)
        for proc in procs:
            proc.join(timeout=60)
        assert merged == {0: True, 1: True, 2: True, 3: True}, f"trial {trial}: {merged}"


def _journal(runs: Path, local_id: str, *, attach: str | None) -> Any:
    from primeruns.journal import Journal
    from primeruns.spec import SPEC_KEY, RunSpec

    spec = RunSpec(kind="eval", name=local_id, attach_id=attach)
    return Journal.create(
        runs,
        local_id=local_id or None,
        meta={SPEC_KEY: spec.to_json(), "platform": {"run_id": "run-1", "kind": "eval"}},
    )


@pytest.mark.parametrize("attached", [False, True])
def test_a_close_out_reads_past_journals_only_for_a_run_others_could_attach_to_before_it(
    tmp_path: Path, journal_reads: list[str], attached: bool
) -> None:
    """A run its own process created can only be attached to after it was
    registered: its close-out looks for the run's other processes among the
    journals made since its own (a later rank is found), and reads none of
    the runs directory's past runs, however many there are (each finish of
    a sweep of short evaluations read them all). A run attached by id may
    have ranks that attached before it: all are looked at."""
    runs = tmp_path / "runs"
    past = _journal(runs, "20261203-090000-aaaaaaaa", attach="run-1")
    mine = _journal(runs, "20261203-100000-bbbbbbbb", attach="run-1" if attached else None)
    later = _journal(runs, "20261203-100001-cccccccc", attach="run-1")
    for journal in (past, later):
        journal.close()
    try:
        others = ranks.others_of(mine, "run-1", own_children=False)
    finally:
        mine.close()
    if attached:
        assert others == [past.path, later.path]
    else:
        assert others == [later.path]
        assert past.path.name not in journal_reads


def test_a_close_out_finds_a_process_that_attached_after_the_clock_stepped_back(
    tmp_path: Path,
) -> None:
    """The run's creator made its journal with the wall clock an hour ahead
    (stepped back since: NTP, a VM resumed). A process attaching to the run
    now must still be named as made since the creator's journal: its
    close-out looks for the run's other processes only there, and would
    close the run while that process still logs into it."""
    from datetime import UTC, datetime, timedelta

    runs = tmp_path / "runs"
    ahead = datetime.now(UTC) + timedelta(hours=1)
    mine = _journal(runs, f"{ahead:%Y%m%d-%H%M%S}-bbbbbbbb", attach=None)
    later = _journal(runs, "", attach="run-1")  # named now, by the clock as it is
    later.close()
    try:
        others = ranks.others_of(mine, "run-1", own_children=False)
    finally:
        mine.close()
    assert others == [later.path]


def test_rows_merged_in_one_transaction_are_merged_as_one_at_a_time(tmp_path: Path) -> None:
    """``merge_many`` reads a window's steps at once: a step met twice in it,
    or already in the table from another rank, merges as ``merge`` does."""
    from primeruns.sinks.step_rows import StepRows

    rows: list[tuple[int, dict[str, Any]]] = [
        (1, {"loss": 1.0, "_timestamp": 5.0}),
        (2, {"acc": 0.5}),
        (1, {"kl": 0.1}),
        (1, {"kl": 0.1}),
        (3, {}),
    ]
    results = []
    for folder, at_once in ((tmp_path / "a", True), (tmp_path / "b", False)):
        other = StepRows(folder, label="rank1", primary=False, rank=1)
        assert other.merge("run-1", 1, {"loss": 2.0, "_timestamp": 9.0}) is not None
        table = StepRows(folder, label="rank0", primary=True, rank=0)
        if at_once:
            merged = table.merge_many("run-1", rows)
        else:
            merged = [table.merge("run-1", step, row) for step, row in rows]
        results.append((merged, table.versions("run-1", [1, 2, 3, 4])))
        table.close()
        other.close()
    assert results[0] == results[1]
    assert results[0][0][2] == (
        {"loss": 1.0, "kl": 0.1, "loss@rank1": 2.0, "step": 1, "_timestamp": 9.0},
        3,
    )
    assert results[0][1] == {1: 3, 2: 1, 3: 1, 4: 0}


_CREATOR = """
import sys
from pathlib import Path
from primeruns import ranks, redaction

ranks.claim_created(Path(sys.argv[1]), sys.argv[2], "creator")  # as init() does
print("claimed", flush=True)
sys.stdin.readline()  # alive until the test lets it go
"""


def test_rank_0_of_a_run_its_creator_still_runs_on_this_host_is_not_a_second_primary(
    tmp_path: Path,
) -> None:
    """A launcher script creates the run (``init()`` without ``id=``: its
    primary) and starts torchrun with the run's id. Rank 0 attaching by id
    was a primary too: its ``finish()`` closed the run while the creator
    still logged into it (and first waited for the creator's journal, which
    waited for torchrun, until the stall rule gave up). It keeps its rank
    (its label, its sample id ranges); the creator closes the run."""
    run = f"run-{os.getpid()}-created"
    creator = subprocess.Popen(
        [sys.executable, "-c", _CREATOR, str(tmp_path), run],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert creator.stdout is not None and creator.stdout.readline() == "claimed\n"
        rank0 = _role({"RANK": "0"}, tmp_path, attach=run, local_id="r0")
    finally:
        creator.communicate("\n", timeout=60)
    assert rank0 == ranks.Role(primary=False, label="rank0", rank=0)
    # With the creator gone (a requeued job's ranks), rank 0 is the primary.
    again = _role({"RANK": "0"}, tmp_path, attach=run, local_id="r0b")
    assert again == ranks.Role(primary=True, label="rank0", rank=0)


class _Meta:
    """A journal as ``ship.uplink._ranges_of`` reads it: its recorded role."""

    def __init__(self, role: Any) -> None:
        self._role = role

    def get_meta(self, key: str) -> Any:
        return self._role.to_json() if key == ranks.K_ROLE else None


def test_rank_0_beside_its_runs_creator_numbers_samples_apart_from_it() -> None:
    # The creator (the primary, no rank of its own) numbers from 0, where
    # rank 0's block is; rank 0, not the primary while the creator lives,
    # took the same block, and the two logging the same step shared their
    # sample ids.
    from primeruns.ship.uplink import _ranges_of

    creator = _ranges_of(_Meta(ranks.Role(primary=True, label="creator")), far=False)
    rank0 = _ranges_of(_Meta(ranks.Role(primary=False, label="rank 0", rank=0)), far=False)
    assert creator.end is not None
    assert rank0.start >= creator.end or (rank0.end is not None and rank0.end <= creator.start)


def test_a_journal_that_says_it_shipped_is_not_shipped_through_a_sync_journal_that_shipped_none(
    tmp_path: Path,
) -> None:
    """A journal's meta says it shipped (``state``), but its sinks
    acknowledged nothing. Its sync journal, made and fed with all of it,
    took that ``state`` over as its own, and a requeue's take-over then
    passed the journal over as shipped through it: its records were
    shipped by nothing. The sync journal says it shipped only once it did."""
    from primeruns.journal import EntryKind, Journal, journal_info
    from primeruns.ship.copies import make_sync_root
    from primeruns.ship.mirror import import_new, open_sync_journal
    from primeruns.spec import SPEC_KEY, RunSpec

    root = tmp_path / "synced"
    make_sync_root(root)
    meta = {SPEC_KEY: RunSpec(kind="eval").to_json(), "state": "shipped"}
    with Journal.create(tmp_path / "runs", local_id="20261207-000001-aaaaaaaa", meta=meta) as j:
        j.append(EntryKind.EPISODE, [b'{"id": "a"}', b'{"id": "b"}'])
        path = j.path
    with Journal.open(path, owner=False) as source:
        sync, _ = open_sync_journal(source, root)
        with sync:
            import_new(source, sync)
            assert sync.get_meta("state") is None
    assert not ranks.shipped_through_sync(journal_info(path), root)
