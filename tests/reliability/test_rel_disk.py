"""Disk faults (issue #8 §3): the journal's byte budget reached, the disk full
(a 2 MiB tmpfs the test mounts; skipped where mounting is not allowed, failed so under CI), the
runs directory read-only or deleted mid-run. The loop never sees an
exception, drops are counted, and the run still finishes.

Not covered: a runs directory turned read-only *mid-run*: as root permission
bits do not apply and a busy tmpfs cannot be remounted read-only, so only the
read-only-at-init case is tested (``test_read_only_runs_dir_is_an_init_error``).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads
from sdk_helpers import kill_the_uplink, wait_for

import primeruns as pr
from primeruns.exceptions import JournalError, JournalFullError
from primeruns.journal import EntryKind, Journal
from primeruns.local import LocalPlatform


def _cannot(why: str) -> None:
    """Skip a test that needs a mount where none can be made; fail it under
    CI, which runs as root and must run these tests."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI runs as root and must run this test")
    pytest.skip(why)


def _mount(target: Path, *options: str) -> None:
    if os.geteuid() != 0:
        _cannot("mounting needs root")
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", *options, str(target)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        _cannot(f"cannot mount here: {result.stderr.strip()[:200]}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only; skipped elsewhere, failed under CI)."""
    target = tmp_path / "small"
    _mount(target, "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_byte_budget_drops_are_counted_and_bookkeeping_still_fits(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path / "runs", local_id="r", max_bytes=2 << 20)
    written = dropped = 0
    for _ in range(4000):
        result = journal.append(EntryKind.EPISODE, [os.urandom(900)])
        written, dropped = written + result.count, dropped + result.dropped
    assert written > 100 and dropped > 0
    # The control reserve: acks and in-flight records still commit at the budget.
    journal.ack("traces", written // 2)  # also folds the drop count in
    assert journal.losses()["journal"]["count"] == dropped
    journal.close()
    reopened = Journal.open(tmp_path / "runs" / "r", owner=False)
    try:
        assert (
            len(reopened.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6).entries) == written
        )
        assert reopened.damage() == []
    finally:
        reopened.close()


def test_journal_budget_can_be_set_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PRIME_RUNS_MAX_JOURNAL_BYTES", str(1 << 20))
    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=tmp_path / "runs")
    for _ in range(300):
        run.log_episodes(
            [{"id": os.urandom(8).hex(), "traces": [], "blob": os.urandom(6000).hex()}]
        )
    run.finish()
    assert run.dropped_records > 0  # the budget applied: drops counted, nothing raised
    assert run.status is pr.RunStatus.COMPLETED


def test_a_budget_below_the_minimum_is_an_init_error_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ValueError, match="max_journal_bytes"):
        pr.init(
            environments=["gsm8k"],
            mode="offline",
            runs_dir=tmp_path / "runs",
            max_journal_bytes=1000,
        )
    monkeypatch.setenv("PRIME_RUNS_MAX_JOURNAL_BYTES", "lots")
    with pytest.raises(pr.ConfigurationError, match="PRIME_RUNS_MAX_JOURNAL_BYTES"):
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=tmp_path / "runs")


def _fill(run: pr.Run, episodes: list[dict[str, Any]]) -> list[str]:
    acked: list[str] = []
    for i in range(0, len(episodes), 10):
        run.log_episodes(episodes[i : i + 10])  # must never raise
        acked.extend(e["id"] for e in episodes[i : i + 10])
    return acked


def _said_full(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the run warned that its journal is full: its records held in
    memory (an online run's) or dropped."""
    return any("is full" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_disk_full_never_reaches_the_loop_and_the_run_finishes(
    small_disk: Path, make_local_platform: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A finish with a short timeout leaves what it cannot ship in time in
    the journal, or counted as dropped: records held in memory for the full
    disk are waited for at most half of it, and the close-out keeps the rest
    (waited for the whole timeout, they left the close-out none)."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1000)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _fill(run, episodes)
        assert _said_full(caplog)  # the disk really filled
        run.finish(timeout=5)
    assert run.finished and run.status is pr.RunStatus.COMPLETED
    assert run.journal_path is not None
    journaled = {r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)}
    accepted = journaled | set(rh.platform_episode_ids(lp.data_dir, run.id))  # see compaction
    # Every record is accounted for (the count may include the finish entry,
    # which a full disk refuses too).
    assert len(accepted) + run.dropped_records in (len(episodes), len(episodes) + 1)


def test_disk_full_still_ships_everything_journaled(
    small_disk: Path, make_local_platform: Any, tmp_path: Path
) -> None:
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1000)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _fill(run, episodes)
        run.finish(timeout=60)
    assert run.journal_path is not None
    journaled = {r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)}
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert journaled <= set(stored) and max(stored.values()) == 1
    assert len(stored) + run.dropped_records in (len(episodes), len(episodes) + 1)


def test_a_disk_filled_while_the_platform_is_down_still_ships_everything_journaled(
    small_disk: Path, make_local_platform: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The worst case for the full disk: nothing is acknowledged (so nothing can
    be compacted) when the disk fills, and every in-flight batch and
    acknowledgement must still be written. The journal's reserve file is
    released for them; compaction then frees room as batches are acknowledged.
    Before the reserve, the shipper died on ENOSPC (83 of 320 journaled
    records shipped) or stalled (164 of 370)."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1000)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        lp.stop()
        _fill(run, episodes)
        assert _said_full(caplog)  # the disk really filled
        lp.start()
        run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED
    assert run.journal_path is not None
    # Compaction removes acknowledged entries from the journal: what the
    # producer's calls had accepted is what is left there plus what is stored.
    journaled = {r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)}
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    accepted = journaled | set(stored)
    # (the drops may include the finish entry, which a full disk refuses too)
    assert len(accepted) + run.dropped_records in (len(episodes), len(episodes) + 1)
    assert set(stored) == accepted and max(stored.values()) == 1


_UNDER_A_FILE_SIZE_LIMIT = """
import logging, resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, resource.RLIM_INFINITY))
import primeruns as pr, workloads
run = pr.init(environments=["gsm8k"], model="m", mode="offline", runs_dir=sys.argv[1])
episodes = workloads.gsm8k(1000)
for i in range(0, len(episodes), 20):
    run.log_episodes(episodes[i : i + 20])
run.finish()
print(run.dropped_records)
"""


def test_a_journal_stopped_by_the_file_size_limit_names_the_limit_and_its_fix(
    tmp_path: Path,
) -> None:
    """A job started under ``ulimit -f`` (RLIMIT_FSIZE: a write past it fails
    with EFBIG, Python ignoring SIGXFSZ) drops records with disk and budget
    to spare. The warning blamed the byte budget and told the user to raise
    PRIME_RUNS_MAX_JOURNAL_BYTES, which changes nothing; it names the limit
    and how to lift it now."""
    result = rh.run_script(_UNDER_A_FILE_SIZE_LIMIT, tmp_path)
    assert int(result.stdout.split()[-1]) > 0  # the limit was met: drops, counted
    said = [line for line in result.stderr.splitlines() if "is full" in line]
    assert said, result.stderr[-2000:]
    assert "file size limit (ulimit -f: 3 MiB)" in said[0], said[0]
    assert "ulimit -f unlimited" in said[0]
    assert "PRIME_RUNS_MAX_JOURNAL_BYTES" not in said[0]


_ONLINE_UNDER_ULIMIT_F_1000 = """
import resource, sys
from pathlib import Path
import primeruns as pr, workloads
from sdk_helpers import platform_episode_ids
resource.setrlimit(resource.RLIMIT_FSIZE, (1000 << 10, resource.RLIM_INFINITY))  # ulimit -f 1000
run = pr.init(environments=["gsm8k"], model="m", runs_dir=sys.argv[1])
episodes = workloads.gsm8k(600)
for i in range(0, len(episodes), 20):
    run.log_episodes(episodes[i : i + 20])
run.finish(timeout=40)
stored = platform_episode_ids(Path(sys.argv[2]), run.id)
print(run.status.value, run.dropped_records, len(stored), max(stored.values()))
"""


def test_an_evaluation_under_ulimit_f_1000_ships_every_record_it_logged(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A job started under ``ulimit -f 1000`` (1000 KiB, a quarter of a spool
    segment): LMDB's data file met the limit as well, its short write read as
    an I/O error, not as full, so the uplink could write no cursor nor
    acknowledgement, nothing was compacted, and the records held for it
    waited until the finish dropped them (on main: 320 of 600 dropped, the
    warning saying "held in memory for the full disk"). The room count keeps
    the data file short of the limit now, as it does a full disk's: every
    record lands once, none dropped, and the warning names ``ulimit -f``."""
    lp = shared_platform
    env = rh.isolated_env(
        tmp_path,
        {
            "PRIME_API_KEY": rt.KEY,
            "PRIME_API_BASE_URL": lp.url,
            "PRIME_TRACES_URL": lp.url,
        },
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _ONLINE_UNDER_ULIMIT_F_1000,
            str(tmp_path / "runs"),
            str(lp.data_dir),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    status, dropped, stored, most = done.stdout.split()[-4:]
    assert (status, int(dropped), int(stored), int(most)) == ("completed", 0, 600, 1), done.stderr
    said = [line for line in done.stderr.splitlines() if "is full" in line]
    assert said and "(ulimit -f: 1000 KiB)" in said[0], done.stderr[-2000:]


_SPOOL_UNDER_A_SMALL_FILE_SIZE_LIMIT = """
import json, resource, sys
import workloads
from primeruns.journal import EntryKind, Journal
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
journal = Journal.create(sys.argv[1], local_id="r")
journal._mover.stop()  # moved here, after each append: a journal that keeps up
kept = dropped = 0
for episode in workloads.gsm8k(160):
    result = journal.append(EntryKind.EPISODE, [json.dumps(episode).encode()])
    kept, dropped = kept + result.count, dropped + result.dropped
    while journal._mover.step():
        pass
read = len(journal.read(0, kinds={EntryKind.EPISODE}, max_entries=10**6).entries)
print(kept, dropped, read)
"""


def test_a_spool_segment_at_the_file_size_limit_gives_way_to_the_next(tmp_path: Path) -> None:
    """Under a file size limit below a spool segment's 4 MiB (1 MiB here),
    the segment being written met it and every later append was refused
    with EFBIG, although LMDB had moved its entries and held them in a
    fraction of the limit: 110 of 160 episodes kept on main, the rest
    dropped. The next append starts a segment of its own now (the limit
    binds each file alone), and the old one goes once LMDB holds it."""
    result = rh.run_script(_SPOOL_UNDER_A_SMALL_FILE_SIZE_LIMIT, tmp_path)
    kept, dropped, read = map(int, result.stdout.split()[-3:])
    assert (kept, dropped, read) == (160, 0, 160), result.stderr[-2000:]


def test_runs_dir_deleted_mid_run_never_reaches_the_loop(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The open journal outlives its directory entry: logging goes on, the run
    ships and finishes; nothing is left behind to replay (there is no path)."""
    lp = shared_platform
    episodes = workloads.gsm8k(60)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        acked = _fill(run, episodes[:30])
        shutil.rmtree(tmp_path / "runs")
        acked += _fill(run, episodes[30:])
        run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED and run.dropped_records == 0
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert set(stored) == set(acked) and max(stored.values()) == 1


def test_read_only_runs_dir_is_an_init_error_naming_the_directory(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    _mount(ro, "--bind", str(ro))
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        with pytest.raises(JournalError, match=str(ro)):
            pr.init(environments=["gsm8k"], mode="offline", api_key=rt.KEY, runs_dir=ro)
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)


def _paced_run_under_a_small_budget(
    lp: LocalPlatform, tmp_path: Path, episodes: list[dict[str, Any]]
) -> pr.Run:
    """An eval under a 4 MiB budget, logged no faster than the platform ships
    (a flush after every call of 50), then finished."""
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = pr.init(
            environments=["gsm8k"],
            model="m",
            api_key=rt.KEY,
            base_url=lp.url,
            runs_dir=tmp_path / "runs",
            max_journal_bytes=4 << 20,
        )
        for i in range(0, len(episodes), 50):
            run.log_episodes(episodes[i : i + 50])
            assert run.flush(timeout=60)  # the platform keeps up: a backlog of one call
        run.finish(timeout=60)
    return run


def test_the_budget_bounds_the_backlog_not_the_runs_history(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A 4 MiB journal budget and a healthy platform that keeps up: the run
    logs several times its budget and drops nothing, because entries every
    sink acknowledged are compacted away when space runs short. Before, 1,924
    of 3,000 records were dropped although every earlier one had shipped."""
    lp = shared_platform
    episodes = workloads.gsm8k(1500)
    run = _paced_run_under_a_small_budget(lp, tmp_path, episodes)
    assert run.dropped_records == 0
    assert run.id is not None
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert len(stored) == len(episodes) and max(stored.values()) == 1
    assert run.journal_path is not None
    assert (run.journal_path / "data.mdb").stat().st_size <= 4 << 20


def test_sync_of_a_journal_that_filled_its_disk_ships_everything_in_it(
    small_disk: Path, shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """An offline run fills a 2 MiB disk; ``primeruns sync`` then ships it on
    that full disk. Before, every in-flight write failed with EIO (LMDB's
    short write) and 16 to 43 of 319 records shipped in 60 s."""
    lp = shared_platform
    episodes = workloads.gsm8k(1000)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = pr.init(
            environments=["gsm8k"], mode="offline", api_key=rt.KEY, runs_dir=small_disk / "runs"
        )
        _fill(run, episodes)
        run.finish()
    assert run.dropped_records > 0 and run.journal_path is not None
    journaled = {r["id"] for r in rh.journal_records(run.journal_path, EntryKind.EPISODE)}
    env = rh.isolated_env(tmp_path / "sync", {"PRIME_API_KEY": rt.KEY, "PRIME_TRACES_URL": lp.url})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "primeruns",
            "sync",
            "--runs-dir",
            str(small_disk / "runs"),
            "--base-url",
            lp.url,
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]

    bound = rh.bound_run_id(run.journal_path, home=tmp_path / "sync" / "home")
    assert bound is not None
    stored = rh.platform_episode_ids(lp.data_dir, bound)
    assert set(stored) == journaled and max(stored.values()) == 1
    # finish() was called: its entry uses the room kept for bookkeeping, so the
    # run closes as completed, not as crashed.
    assert lp.run(bound)["status"] == "COMPLETED"


def test_without_prime_traces_the_budget_still_bounds_only_the_backlog(
    make_local_platform: Any, tmp_path: Path
) -> None:
    """Prime Traces not enabled for the account (the common case): the traces
    sink is off for good, so compaction must not wait for its acknowledgements,
    or the budget would cap the run's whole history again."""
    lp: LocalPlatform = make_local_platform(traces_disabled=True)
    episodes = workloads.gsm8k(1500)
    run = _paced_run_under_a_small_budget(lp, tmp_path, episodes)
    assert run.dropped_records == 0
    assert run.id is not None
    assert lp.run(run.id)["samples"]["rows"] == len(episodes)


# The vendor's prime-runs 0.1.4, recorded: its uploader queue holds 256
# batches and a full queue makes log_* wait up to 5 s before it drops. A
# producer logging 100 batches of 10 episodes therefore loses none of them,
# whatever the disk (it keeps nothing on disk).
VENDOR_QUEUE_BATCHES = 256


def test_a_disk_full_mid_run_keeps_what_the_vendor_keeps(
    small_disk: Path, make_local_platform: Any, tmp_path: Path
) -> None:
    """Invariant 13: on a disk that fills mid-run every record the vendor's
    SDK would ship still reaches the platform. Before, 920 of 1,000 episodes
    were dropped on the 2 MiB disk, where the vendor ships all 1,000; what
    the disk refuses is now held in memory and journaled as the uplink's
    acknowledgements free room (``journal.overflow``)."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1000)
    assert len(episodes) // 10 <= VENDOR_QUEUE_BATCHES  # the vendor keeps every batch
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _fill(run, episodes)
        run.finish(timeout=60)
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert run.dropped_records == 0
    assert set(stored) == {e["id"] for e in episodes}


def test_a_flush_while_a_full_disk_holds_records_returns_once_they_landed(
    small_disk: Path, make_local_platform: Any, tmp_path: Path
) -> None:
    """flush() on a full disk, records held in memory: it returns True once
    they too are on the platform (the user reads True as "shipped"). Before,
    its targets named only what was journaled, and it said True with
    hundreds of the episodes logged before it still held."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1000)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = _held_in_an_outage(lp, small_disk, episodes)
        lp.start()
        assert run.flush(timeout=120)
        stored = rh.platform_episode_ids(lp.data_dir, run.id)
        assert set(stored) == {e["id"] for e in episodes}
        run.finish(timeout=60)
    assert run.dropped_records == 0


def _held_in_an_outage(lp: LocalPlatform, disk: Path, episodes: list[dict[str, Any]]) -> pr.Run:
    """An evaluation on ``disk`` whose journal filled it with ``episodes``
    while the platform was down (stopped here, and left so): nothing
    acknowledged, nothing compacted, what the disk refused held in memory."""
    # Retries far enough apart that the outage, however long a loaded
    # host takes to fill the disk, retires no sink: flush() says False
    # once one is (as documented), which is not what these are about.
    os.environ["PRIME_RUNS_RETRY_BASE_S"] = "1"
    run = rt.eval_run(lp.url, disk / "runs")
    assert run._supervisor is not None
    uplink = run._supervisor.uplink
    wait_for(uplink.begun, timeout=60, what="the uplink process to begin")  # type: ignore[attr-defined]
    lp.stop()
    _fill(run, episodes)
    return run


def test_a_flush_on_a_full_disk_waits_for_what_was_held_before_it_not_after(
    small_disk: Path, make_local_platform: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """flush() waits for what was logged before it, records a full disk
    holds in memory included. It waited until nothing at all was held: with
    another thread logging on (its records held behind those, faster than a
    full disk frees room), that was never, and the flush ran out its
    timeout, False, though what was logged before it had shipped; with no
    timeout it never returned. It waits for the appends held when it was
    called now, then for their shipping."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(400)
    stop = threading.Event()

    def keep_logging(run: pr.Run) -> None:
        for n in itertools.count():
            if stop.wait(0.02):  # a loop's pace: 200 episodes a second
                return
            run.log_episodes([dict(e, id=f"later-{n}-{e['id']}") for e in episodes[:4]])

    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = _held_in_an_outage(lp, small_disk, episodes)
        assert _said_full(caplog)  # the disk filled: records are held
        lp.start()
        other = threading.Thread(target=keep_logging, args=(run,))
        other.start()
        try:
            flushed = run.flush(timeout=180)
        finally:
            stop.set()
            other.join()
        assert run.id is not None
        stored = rh.platform_episode_ids(lp.data_dir, run.id)
        run.finish(timeout=10)  # (what the other thread logged is not at stake)
    assert flushed
    assert {e["id"] for e in episodes} <= set(stored)


def _held_as_the_uplink_dies(
    lp: LocalPlatform, run: pr.Run, episodes: list[dict[str, Any]]
) -> None:
    """Fill the small disk with the run's own journal while the platform is
    down (nothing acknowledged, so nothing compacted: what the disk refuses
    is held in memory), then SIGKILL the run's uplink process alone (an
    out-of-memory kill) and bring the platform back. Only an uplink frees
    room now: no held record is journaled until one ships again."""
    assert run._supervisor is not None
    uplink = run._supervisor.uplink  # (the process, once it took over from threads)
    wait_for(uplink.begun, timeout=60, what="the uplink process to begin")  # type: ignore[attr-defined]
    lp.stop()
    _fill(run, episodes)
    kill_the_uplink(run)
    lp.start()


def test_a_finish_after_the_uplink_died_while_a_full_disk_held_records_ships_them(
    small_disk: Path, make_local_platform: Any, tmp_path: Path
) -> None:
    """The uplink process killed while records wait in memory for a full
    disk, then finish(): before, its wait for the held records (half its
    timeout) came before any look at the dead uplink, so nothing freed room
    and every held record was dropped as "disk full" (1,000 of 1,000 here)."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1000)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _held_as_the_uplink_dies(lp, run, episodes)
        run.finish(timeout=60)
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert run.dropped_records == 0
    assert set(stored) == {e["id"] for e in episodes} and max(stored.values()) == 1


def test_an_uplink_killed_while_a_full_disk_holds_records_is_started_again_by_the_log_calls(
    small_disk: Path, make_local_platform: Any, tmp_path: Path
) -> None:
    """The uplink process killed while records wait in memory for a full
    disk, the loop logging on with no flush(): the log calls' look at the
    uplink starts it again, it frees room, and the held records ship. Before,
    an append held for the disk did not look (only a journaled one woke the
    supervisor), so nothing shipped or freed room for the rest of the run,
    and every record logged since was held until the finish dropped it."""
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(1200)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _held_as_the_uplink_dies(lp, run, episodes[:1000])
        more = iter(episodes[1000:])
        logged = {e["id"] for e in episodes[:1000]}

        def shipped_while_logging() -> bool:
            held = set(logged)
            for episode in itertools.islice(more, 1):  # the loop goes on
                run.log_episodes([episode])
                logged.add(episode["id"])
            return held <= set(rh.platform_episode_ids(lp.data_dir, run.id))

        wait_for(shipped_while_logging, timeout=60, what="the held episodes to land")
        run.finish(timeout=60)
    stored = rh.platform_episode_ids(lp.data_dir, run.id)
    assert run.dropped_records == 0
    assert set(stored) == logged and max(stored.values()) == 1


def _fill_disk(disk: Path, leave: int) -> None:
    """Write a file on ``disk`` until it is full, then give back ``leave`` bytes."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    if leave:
        size = (disk / "filler").stat().st_size
        os.truncate(disk / "filler", max(0, size - leave))


def test_an_online_run_on_a_full_disk_ships_from_elsewhere_and_init_never_raises(
    small_disk: Path, make_local_platform: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The vendor's SDK keeps nothing on disk, so a full disk changes nothing
    for it; verifiers turns an exception from init() into a disabled run.
    Before, init() raised OSError (ENOSPC, writing the journal's owner lock),
    not the JournalError that sends the journal to a fallback folder."""
    (small_disk / "runs").mkdir(mode=0o700)
    _fill_disk(small_disk, leave=0)
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(50)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _fill(run, episodes)
        run.finish(timeout=60)
    assert run.status is pr.RunStatus.COMPLETED and run.dropped_records == 0
    assert set(rh.platform_episode_ids(lp.data_dir, run.id)) == {e["id"] for e in episodes}
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("cannot take this run's journal" in m for m in said) == 1, said


_NEARLY_FULL_PRODUCER = """
import sys
from pathlib import Path
import prime_runs as pr
run = pr.init(environments=["gsm8k"], model="m", api_key=sys.argv[1], base_url=sys.argv[2],
              runs_dir=Path(sys.argv[3]))
run.log_episodes([{"id": f"e{i}", "traces": []} for i in range(5)])
run.finish(timeout=60)
print(run.id, run.dropped_records)
"""


@pytest.mark.parametrize("leave", [8192])
def test_an_online_run_on_a_nearly_full_disk_neither_kills_its_process_nor_raises(
    small_disk: Path, make_local_platform: Any, tmp_path: Path, leave: int
) -> None:
    """A few KiB free: LMDB's lock file is sized sparse and mapped, and a
    write to a page the disk cannot back is a SIGBUS, which killed the
    producer inside init(). The vendor's SDK keeps nothing on disk, so its
    run goes on and ships."""
    (small_disk / "runs").mkdir(mode=0o700)
    _fill_disk(small_disk, leave=leave)
    lp: LocalPlatform = make_local_platform()
    with rt.sdk_env(lp.url, tmp_path / "home"):
        proc = subprocess.run(
            [sys.executable, "-c", _NEARLY_FULL_PRODUCER, rt.KEY, lp.url, str(small_disk / "runs")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id, dropped = proc.stdout.split()
    assert dropped == "0"
    assert set(rh.platform_episode_ids(lp.data_dir, run_id)) == {f"e{i}" for i in range(5)}


@pytest.mark.parametrize("leave", [128 << 10, 512 << 10])
def test_an_online_run_opened_on_a_nearly_full_disk_ships_what_the_vendor_ships(
    small_disk: Path, make_local_platform: Any, tmp_path: Path, leave: int
) -> None:
    """A disk with a few hundred KiB free: the journal was made in the runs
    directory, then its first appends found the disk full and dropped every
    record (128 KiB free: 0 of 100 shipped; 512 KiB: 10), where the vendor's
    SDK ships all 100. An online run's journal now starts only on a disk
    with room for it (``refuge.short_of_room``), else in a fallback folder."""
    (small_disk / "runs").mkdir(mode=0o700)
    _fill_disk(small_disk, leave=leave)
    lp: LocalPlatform = make_local_platform()
    episodes = workloads.gsm8k(100)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, small_disk / "runs")
        _fill(run, episodes)
        run.finish(timeout=60)
    assert run.dropped_records == 0
    assert set(rh.platform_episode_ids(lp.data_dir, run.id)) == {e["id"] for e in episodes}


def test_a_journal_whose_lock_file_lmdb_left_sparse_is_read_on_a_full_disk(
    small_disk: Path,
) -> None:
    """LMDB (and this package before its lock files were allocated) leaves
    lock.mdb sparse past the page it set up. On a full disk, allocating the
    rest refused such a journal to every reader (``primeruns show``, ``sync``)
    as damaged, where LMDB, writing only that page, read it as before."""
    journal = Journal.create(small_disk / "runs", local_id="r")
    journal.append(EntryKind.EPISODE, [b'{"id": "e0"}'])
    journal.close()
    lock_file = small_disk / "runs" / "r" / "lock.mdb"
    first_page = lock_file.read_bytes()[:4096]
    lock_file.unlink()
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, first_page, 0)
        os.ftruncate(fd, 8192)  # as LMDB sizes it: the second page a hole
    finally:
        os.close(fd)
    assert lock_file.stat().st_blocks * 512 < 8192
    _fill_disk(small_disk, leave=0)
    reader = Journal.open(small_disk / "runs" / "r", owner=False)
    try:
        assert len(reader.read(0, kinds={EntryKind.EPISODE}, max_entries=10).entries) == 1
    finally:
        reader.close()


def _refuse_with_enospc(*args: Any, **kwargs: Any) -> None:
    raise OSError(28, "No space left on device")


def _refuse_store(*args: Any, **kwargs: Any) -> None:
    raise lmdb.DiskError("No space left on device")


def _refuse_meta(*args: Any, **kwargs: Any) -> None:
    raise JournalFullError("the disk is full (mdb_txn_commit: No space left on device)")


@pytest.mark.parametrize(
    ("where", "refusal"),
    [
        ("primeruns.journal.journal.OwnerLock", _refuse_with_enospc),
        ("primeruns.journal.journal.acquire_store", _refuse_store),
        ("primeruns.journal.origin.Origin.write_beside", _refuse_with_enospc),
        ("primeruns.journal.journal.Journal.update_meta", _refuse_meta),
    ],
)
def test_a_disk_that_fills_while_a_journal_is_made_refuses_it_and_lets_it_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, refusal: Any
) -> None:
    """A disk filling meanwhile (a checkpoint written beside) can refuse the
    journal's first files after its folder, its owner lock and LMDB took
    theirs (45 KiB free on a tmpfs). It raised the OSError (an online run's
    init() raised it at its caller, as no fallback folder was tried), or kept
    the directory locked, its environment open, for as long as the process
    lived; and the half-made folder stayed in the runs directory for good
    (no listing showed it, no gc took it) while the run went elsewhere."""
    monkeypatch.setattr(where, refusal)
    runs = tmp_path / "runs"
    with pytest.raises(JournalError):
        Journal.create(runs, local_id="r")
    assert list(runs.iterdir()) == []
    held = [os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.is_symlink()]
    assert not [name for name in held if name.startswith(str(runs))]  # lock and map let go


def test_a_journal_opened_as_its_owner_on_a_full_disk_is_a_journal_error(
    small_disk: Path,
) -> None:
    """``sync``, ``replay`` and the mirror open a journal as its owner, which
    writes the owner's record into its lock file: on a full disk that raised
    a plain OSError (ENOSPC) past the handlers of a JournalError, a traceback
    where a journal that cannot be taken now is said so."""
    journal = Journal.create(small_disk / "runs", local_id="r")
    journal.append(EntryKind.METRICS, [b'{"step": 0}'])
    journal.close()
    (small_disk / "runs" / "r" / "owner.lock").unlink()  # its record is written anew
    _fill_disk(small_disk, leave=0)
    with pytest.raises(JournalError, match="cannot take the journal"):
        Journal.open(small_disk / "runs" / "r", owner=True)
    Journal.open(small_disk / "runs" / "r", owner=False).close()  # readers still read it
