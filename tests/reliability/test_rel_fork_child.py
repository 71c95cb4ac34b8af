"""Forked children log into their parent's run (issue #29, first bullet).

A child of fork (a multiprocessing pool with the fork start, ``os.fork()``)
logs through the run handle it inherited: its records go to a journal of its
own, attached to the parent's platform run, and land exactly once in Prime
Traces and in the evaluation sample table, with nothing counted as dropped,
as the vendor's SDK uploads them. The parent logs its own and finishes the run.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import fork_oracle as fo
import one_run_oracle as oracle
import pytest
import rel_helpers as rh
import rel_torture as rt
import workloads
from sdk_helpers import wait_for

import primeruns as pr
from primeruns.local import LocalPlatform

# The run a pool worker logs into: set in the parent before the pool forks,
# inherited by every worker (a forked child shares nothing else with it).
_RUN: pr.Run | None = None


def _log_in_worker(part: list[dict[str, Any]]) -> int:
    assert _RUN is not None
    for i in range(0, len(part), 5):
        _RUN.log_episodes(part[i : i + 5])
    return _RUN.dropped_records


@pytest.mark.parametrize("ending", ["close", "terminate"])
def test_pool_workers_forked_from_an_evaluation_log_into_its_run_exactly_once(
    shared_platform: LocalPlatform, tmp_path: Path, ending: str
) -> None:
    """``ending``: the pool closed and joined (its workers exit through
    multiprocessing's process exit), or ended by ``with Pool() as pool:``,
    which terminates its workers (SIGTERM) as the block ends."""
    global _RUN
    lp = shared_platform
    episodes = workloads.gsm8k(110)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = _RUN = rt.eval_run(lp.url, tmp_path / "runs")
        try:
            with fo.fork_pool(4) as pool:
                parts = [episodes[k * 25 : (k + 1) * 25] for k in range(4)]
                dropped = pool.map(_log_in_worker, parts)
                if ending == "close":
                    pool.close()
                    pool.join()
            run.log_episodes(episodes[100:])
            run.finish(timeout=120)
        finally:
            _RUN = None
    assert dropped == [0, 0, 0, 0]
    fo.assert_exactly_once(lp, run, episodes)


def test_a_child_of_os_fork_logs_into_its_parents_run_exactly_once(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    lp = shared_platform
    episodes = workloads.gsm8k(30)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:10])
        pid = fo.fork()
        if pid == 0:  # the child: log, then leave as forked children do (no atexit)
            code = 1
            try:
                run.log_episodes(episodes[10:15])
                run.log_traces(episodes[15:20])  # episodes among traces: as episodes
                shipped = run.flush(timeout=60)  # the child's own, shipped; the run left open
                ours = {e["id"] for e in episodes[10:20]}
                landed = ours <= set(rh.platform_episode_ids(lp.data_dir, run.id))
                still_open = lp.run(run.id)["status"] == "RUNNING"
                code = 2 if run.dropped_records else 0 if shipped and landed and still_open else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        run.log_episodes(episodes[20:])
        run.finish(timeout=120)
    assert os.waitstatus_to_exitcode(status) == 0
    fo.assert_exactly_once(lp, run, episodes)


def test_a_forked_child_killed_right_after_logging_loses_nothing_of_what_it_logged(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """SIGKILL (the OOM killer) right after the calls returned: nothing of the
    child's ran at its end; its uplink ships its journal, and the parent's
    finish() waits for that before it closes the run."""
    lp = shared_platform
    episodes = workloads.gsm8k(230)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:10])
        pid = fo.fork()
        if pid == 0:
            try:
                for k in range(10, 210, 10):
                    run.log_episodes(episodes[k : k + 10])
            finally:
                os.kill(os.getpid(), signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        run.log_episodes(episodes[210:])
        run.finish(timeout=120)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL
    fo.assert_exactly_once(lp, run, episodes)


def test_the_parents_finish_ships_what_a_child_still_logging_logged_before_it(
    shared_platform: LocalPlatform, tmp_path: Path
) -> None:
    """A child still alive, and logging, when the parent finishes: when
    finish() returns, every record the child's calls returned for before it
    was called is on the platform; what the child logs after that its own
    uplink ships into the run, and in the end every record is there once."""
    lp = shared_platform
    episodes = workloads.gsm8k(410)
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:10])
        pid = fo.fork()
        if pid == 0:  # the child: log, say so, log on until told to stop
            code = 1
            try:
                os.close(ready_r)
                os.close(stop_w)
                for k in range(10, 210, 10):
                    run.log_episodes(episodes[k : k + 10])
                os.write(ready_w, b"r")
                k = 210
                while k < 410 and not select.select([stop_r], [], [], 0)[0]:
                    run.log_episodes(episodes[k : k + 10])
                    k += 10
                os.write(ready_w, k.to_bytes(4, "big"))
                os.read(stop_r, 1)  # alive until the parent's finish() returned
                code = 0 if run.dropped_records == 0 else 2
            finally:
                os._exit(code)  # as forked children leave: no atexit
        os.close(ready_w)
        os.close(stop_r)
        assert os.read(ready_r, 1) == b"r"
        run.finish(timeout=120)
        landed = rh.platform_episode_ids(lp.data_dir, run.id)
        in_table = fo.sample_ids(lp.data_dir, run.id)
        os.write(stop_w, b"s")
        logged = int.from_bytes(os.read(ready_r, 4), "big")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    before = Counter(e["id"] for e in episodes[:210])
    assert landed & before == before, f"{sum((before - landed).values())} not in Prime Traces"
    assert in_table & before == before, f"{sum((before - in_table).values())} not in the table"
    wait_for(
        lambda: fo.landed_once(lp, run.id, episodes[:logged]),
        timeout=120,
        what="the child's uplink to ship what it logged after the parent finished",
    )
    fo.assert_exactly_once(lp, run, episodes[:logged])


def test_the_parents_finish_names_a_live_child_whose_records_it_could_not_wait_for(
    shared_platform: LocalPlatform, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The child's uplink is held (SIGSTOP) while the parent finishes with a
    short timeout: finish() returns in its budget and its warning names the
    child, what it left and why; once the uplink goes on, every record lands
    once."""
    from primeruns.journal.lock import read_owner

    lp = shared_platform
    episodes = workloads.gsm8k(40)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = rt.eval_run(lp.url, tmp_path / "runs")
        run.log_episodes(episodes[:10])
        assert run.flush(timeout=60)  # the parent's own are shipped: finish() has no time
        pid = fo.fork()
        if pid == 0:  # the child: open its journal, wait, log the rest, stay alive
            code = 1
            try:
                run.log_episodes(episodes[10:11])
                os.write(ready_w, b"o")
                os.read(go_r, 1)
                run.log_episodes(episodes[11:40])
                os.write(ready_w, b"r")
                os.read(go_r, 1)
                code = 0
            finally:
                os._exit(code)
        assert os.read(ready_r, 1) == b"o"
        journal = next(
            p
            for p in (tmp_path / "runs").iterdir()
            if p != run.journal_path and not p.name.startswith(".")  # not .primary, .summaries
        )
        owner = read_owner(journal)
        assert owner is not None and owner.helper_pid is not None
        os.kill(owner.helper_pid, signal.SIGSTOP)  # the child's uplink ships nothing now
        try:
            os.write(go_w, b"g")
            assert os.read(ready_r, 1) == b"r"
            with caplog.at_level("WARNING", logger="primeruns"):
                run.finish(timeout=0)  # no time to wait: said all the same
        finally:
            os.kill(owner.helper_pid, signal.SIGCONT)
        os.write(go_w, b"s")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    said = [r.getMessage() for r in caplog.records if "forked child" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert f"forked child pid {pid}: traces: " in said[0], said[0]
    assert "not shipped (the finish timeout passed first); it is still running" in said[0]
    wait_for(
        lambda: fo.landed_once(lp, run.id, episodes),
        timeout=120,
        what="the child's uplink to ship what the parent could not wait for",
    )


def _fork_and_log(run: pr.Run, episodes: list[dict[str, Any]]) -> int:
    """Fork a child that logs ``episodes`` and leaves as forked children do
    (no atexit); its exit code (2: it dropped records)."""
    pid = fo.fork()
    if pid == 0:
        code = 1
        try:
            for k in range(0, len(episodes), 10):
                run.log_episodes(episodes[k : k + 10])
            code = 2 if run.dropped_records else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_child_forked_before_the_run_was_registered_keeps_its_records(
    own_platform: LocalPlatform, tmp_path: Path
) -> None:
    """The platform is down at init(): the run is not registered when the
    child forks. The child's journal keeps its records and ships them into
    the parent's run once the parent registered it."""
    lp = own_platform
    episodes = workloads.gsm8k(60)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        lp.stop()
        run = rt.eval_run(lp.url, tmp_path / "runs")
        assert run.url is None
        run.log_episodes(episodes[:10])
        code = _fork_and_log(run, episodes[10:50])
        lp.start()
        run.log_episodes(episodes[50:])
        run.finish(timeout=120)
    assert code == 0
    fo.assert_exactly_once(lp, run, episodes)


def _offline_run_with_a_child(runs: Path, episodes: list[dict[str, Any]]) -> tuple[Path, Path]:
    """An offline run whose forked child logged the middle fifth to
    three fifths of ``episodes`` (the run the rest), finished: the run's
    journal and its child's."""
    from primeruns.journal import journal_info
    from primeruns.ship.family import children_of

    run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
    fifth = len(episodes) // 5
    run.log_episodes(episodes[:fifth])
    assert _fork_and_log(run, episodes[fifth : 4 * fifth]) == 0
    run.log_episodes(episodes[4 * fifth :])
    run.finish()
    assert run.journal_path is not None
    (child,) = children_of(run.journal_path, journal_info(run.journal_path).local_id)
    return run.journal_path, child


@pytest.mark.parametrize("which", ["the run", "--all"])
def test_a_child_forked_from_an_offline_run_is_shipped_by_primeruns_sync_of_the_run(
    shared_platform: LocalPlatform, tmp_path: Path, which: str
) -> None:
    """``primeruns sync RUN`` (or ``sync --all``) ships the run and its
    children, which could not find the run (it was never registered), and
    closes the run after every record of it landed, children's too, as a
    live ``finish()`` closes it after its children's records shipped."""
    from primeruns.cli import main

    lp = shared_platform
    episodes = workloads.gsm8k(60)
    home = tmp_path / "home"
    with rt.sdk_env(lp.url, home):
        journal, _ = _offline_run_with_a_child(tmp_path / "runs", episodes)
        runs = ["--all", "--runs-dir", str(tmp_path / "runs")]
        target = [str(journal)] if which == "the run" else runs
        assert main(["sync", "--base-url", lp.url, *target]) == 0
    run_id = rh.bound_run_id(journal, home)
    assert run_id is not None
    assert fo.landed_once(lp, run_id, episodes)
    oracle.closed_after_every_record(lp, run_id, "eval", "COMPLETED")


@pytest.mark.parametrize("first", ["the run", "the child"])
def test_primeruns_sync_of_a_run_and_its_child_named_closes_the_run_after_the_child(
    shared_platform: LocalPlatform, tmp_path: Path, first: str
) -> None:
    """``primeruns sync RUN CHILD`` (or ``CHILD RUN``): the child named ships
    with its run, before the run's close-out, as it would unnamed. Named
    after the run, it shipped after the run was closed; named before, it
    could not find the run (not registered yet) and failed."""
    from primeruns.cli import main

    lp = shared_platform
    episodes = workloads.gsm8k(30)
    home = tmp_path / "home"
    with rt.sdk_env(lp.url, home):
        journal, child = _offline_run_with_a_child(tmp_path / "runs", episodes)
        named = [journal, child] if first == "the run" else [child, journal]
        assert main(["sync", "--base-url", lp.url, *map(str, named)]) == 0
    run_id = rh.bound_run_id(journal, home)
    assert run_id is not None
    assert fo.landed_once(lp, run_id, episodes)
    oracle.closed_after_every_record(lp, run_id, "eval", "COMPLETED")


_HOLD_JOURNAL = """
import sys
from primeruns.journal import Journal
journal = Journal.open(sys.argv[1], owner=True)
print("held", flush=True)
sys.stdin.read()
journal.close()
"""


class _Holder:
    """Another process owning a journal (a worker still writing it) until
    ``release()``; a context manager that releases it at its end."""

    def __init__(self, journal: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD_JOURNAL, str(journal)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> _Holder:
        assert self._proc.stdout is not None and self._proc.stdout.readline() == "held\n"
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    @property
    def holding(self) -> bool:
        return self._proc.poll() is None

    def release(self) -> None:
        if self.holding:
            self._proc.communicate(timeout=60)


@pytest.mark.parametrize("which", ["the run", "--all"])
def test_a_forked_child_that_does_not_ship_holds_its_runs_close_until_a_sync_ships_it(
    shared_platform: LocalPlatform, tmp_path: Path, which: str
) -> None:
    """A forked child whose journal cannot be shipped now (another process
    owns it: a worker still writing) keeps ``primeruns sync`` from closing
    the run: the run's own records ship, the run stays open, and the
    command says why and fails. The next sync ships the child, then closes
    the run, after every record of it landed."""
    from primeruns.cli import main

    lp = shared_platform
    episodes = workloads.gsm8k(60)
    home = tmp_path / "home"
    with rt.sdk_env(lp.url, home):
        journal, child = _offline_run_with_a_child(tmp_path / "runs", episodes)
        runs = ["--all", "--runs-dir", str(tmp_path / "runs")]
        target = [str(journal)] if which == "the run" else runs
        with _Holder(child):
            assert main(["sync", "--base-url", lp.url, *target]) != 0
            run_id = rh.bound_run_id(journal, home)
            assert run_id is not None
            assert lp.run(run_id)["status"] not in ("COMPLETED", "FAILED")
            parents = Counter(e["id"] for e in episodes[:12] + episodes[48:])
            assert fo.sample_ids(lp.data_dir, run_id) == parents
        assert main(["sync", "--base-url", lp.url, *target]) == 0
    assert fo.landed_once(lp, run_id, episodes)
    oracle.closed_after_every_record(lp, run_id, "eval", "COMPLETED")


@pytest.mark.parametrize("which", ["the run", "--all"])
def test_a_dry_run_says_a_forked_child_being_written_would_hold_its_runs_close(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    """``primeruns sync --dry-run`` says what the sync would do: with a
    forked child of the run still being written, leave the run open, naming
    the child (it said the run would be closed out)."""
    from primeruns.cli import main

    episodes = workloads.gsm8k(30)
    with rt.sdk_env("http://127.0.0.1:9", tmp_path / "home"):
        journal, child = _offline_run_with_a_child(tmp_path / "runs", episodes)
        runs = ["--all", "--runs-dir", str(tmp_path / "runs")]
        target = [str(journal)] if which == "the run" else runs
        with _Holder(child):
            capsys.readouterr()
            main(["sync", "--dry-run", *target])
            said = capsys.readouterr().out
    assert f"would leave the run open: its forked child {child.name} has not shipped" in said
    assert "would close it out" not in said, said


def test_primeruns_sync_watch_holds_a_runs_close_while_its_forked_child_is_being_written(
    shared_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``primeruns sync --watch``: a pass that finds a forked child still
    being written (another process owns its journal) ships the run's own
    records and leaves the run open; a later pass, the child done, ships the
    child, then closes the run. The watch closed the run in its first pass,
    and the child's records landed in a closed run."""
    from primeruns.cli import main
    from primeruns.commands import replay as replay_command

    lp = shared_platform
    episodes = workloads.gsm8k(30)
    home = tmp_path / "home"
    seen: list[str] = []

    class Stop(Exception):
        pass

    with rt.sdk_env(lp.url, home):
        journal, child = _offline_run_with_a_child(tmp_path / "runs", episodes)
        with _Holder(child) as holder:

            def between_passes(_: float) -> None:
                run_id = rh.bound_run_id(journal, home)
                seen.append(lp.run(run_id)["status"] if run_id else "not registered")
                if not holder.holding:
                    raise Stop
                holder.release()  # the child's process ends

            monkeypatch.setattr(replay_command, "pause", between_passes)
            runs = ["--runs-dir", str(tmp_path / "runs")]
            with pytest.raises(Stop):
                main(["sync", "--watch", "--interval", "0", "--base-url", lp.url, *runs])
    assert seen == ["RUNNING", "COMPLETED"]
    run_id = rh.bound_run_id(journal, home)
    assert run_id is not None
    assert fo.landed_once(lp, run_id, episodes)
    oracle.closed_after_every_record(lp, run_id, "eval", "COMPLETED")


def test_a_forked_child_whose_shipping_fails_holds_its_runs_close(
    shared_platform: LocalPlatform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's shipping that fails in this pass (its platform requests
    refused, say) leaves its run open, as a child passed over does: the
    next sync ships the child, then closes the run."""
    from primeruns.cli import main
    from primeruns.commands import replay as replay_command
    from primeruns.commands.common import EXIT_FAILED

    lp = shared_platform
    episodes = workloads.gsm8k(30)
    home = tmp_path / "home"
    real = replay_command.replay_one
    with rt.sdk_env(lp.url, home):
        journal, child = _offline_run_with_a_child(tmp_path / "runs", episodes)

        def failing_child(path: Path, **kwargs: Any) -> int:
            return EXIT_FAILED if path == child else real(path, **kwargs)

        monkeypatch.setattr(replay_command, "replay_one", failing_child)
        assert main(["sync", "--base-url", lp.url, str(journal)]) == EXIT_FAILED
        run_id = rh.bound_run_id(journal, home)
        assert run_id is not None
        assert lp.run(run_id)["status"] not in ("COMPLETED", "FAILED")
        monkeypatch.setattr(replay_command, "replay_one", real)
        assert main(["sync", "--base-url", lp.url, str(journal)]) == 0
    assert fo.landed_once(lp, run_id, episodes)
    oracle.closed_after_every_record(lp, run_id, "eval", "COMPLETED")


def test_a_forked_child_logging_the_parents_step_of_a_training_run_collides_with_nothing(
    train_platform: LocalPlatform, tmp_path: Path
) -> None:
    """Parent and child log episodes of the same step: each Parquet object its
    own, no sample id used twice within the step, every episode once in Prime Traces."""
    lp = train_platform
    steps = workloads.agentic_by_step(10)
    with rt.sdk_env(lp.url, tmp_path / "home"):
        run = fo.train_run(lp.url, tmp_path / "runs")
        run.log_episodes(steps[0][:5])
        pid = fo.fork()
        if pid == 0:  # the child: log its half of step 0, then leave without atexit
            code = 1
            try:
                run.log_episodes(steps[0][5:])
                run.flush(timeout=60)
                code = 0 if run.dropped_records == 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        run.log_episodes(steps[10])
        run.finish(timeout=120)
    assert os.waitstatus_to_exitcode(status) == 0
    fo.assert_training_samples_apart(lp, run, 20)


def test_the_parents_finish_looks_only_at_journals_made_since_its_own(tmp_path: Path) -> None:
    """Costs do not grow with history: finish() of a run that forked opens the
    journals made since its own (a child's is made after its parent's), never
    every past run of the runs dir."""
    from primeruns import forkchild

    runs = tmp_path / "runs"
    names = ["20261101-090000-aaaa", "20261203-080000-own0", "20261203-080000-bbbb",
             "20261203-090000-cccc", "my-named-run"]  # fmt: skip
    for name in names:
        (runs / name).mkdir(parents=True)
        (runs / name / "data.mdb").write_bytes(b"")
    (runs / "20261203-095959-dddd").mkdir()  # no journal in it
    found = forkchild._made_since(runs, runs / "20261203-080000-own0")
    assert sorted(p.name for p in found) == [
        "20261203-080000-bbbb",
        "20261203-090000-cccc",
        "my-named-run",
    ]


_FORKED_FROM_A_THREAD = """
import os, signal, sys, threading
import primeruns as pr
from primeruns.journal.appending import Appender

run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=sys.argv[1])
run.log_episodes([{"id": "before", "traces": []}])

def child() -> None:
    run.log_episodes([{"id": "child", "traces": []}])
    os.kill(os.getpid(), signal.SIGTERM)  # Pool.terminate(): the worker must end
    os._exit(0)  # it did not

forked = []
def fork_from_a_thread() -> None:
    pid = os.fork()
    if pid == 0:
        child()
    forked.append(pid)

write = Appender._write
def write_and_fork(self, kind, payloads, essential):
    # The run's main thread inside a log call while another thread forks,
    # as a pool's worker handler forks a worker in place of one that died.
    Appender._write = write
    thread = threading.Thread(target=fork_from_a_thread)
    thread.start()
    thread.join()
    return write(self, kind, payloads, essential)
Appender._write = write_and_fork

run.log_episodes([{"id": "inside", "traces": []}])
_, status = os.waitpid(forked[0], 0)
run.finish()
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_child_forked_by_a_thread_while_the_main_thread_logs_ends_on_sigterm(
    tmp_path: Path,
) -> None:
    """A pool replaces a worker that died from its worker-handler thread,
    whenever that happens: here while the run's main thread is inside a log
    call. The new worker must not inherit that call's hold on SIGTERM (the
    signal kept until a call returns that, in the child, never will):
    ``Pool.terminate()`` SIGTERMs it and waits for it to end."""
    done = rh.run_script(_FORKED_FROM_A_THREAD, tmp_path)
    assert done.stdout.split() == ["child", str(-signal.SIGTERM)], done.stdout + done.stderr[-2000:]


_FORKED_WHILE_A_THREAD_HOLDS_A_LOCK = """
import importlib.machinery, os, select, signal, sys, threading
import primeruns as pr
from primeruns import joining
from primeruns.journal import store

# The thread named "other" is held inside what sys.argv[2] names until "go":
# "import": its import of multiprocessing.util (the module's import lock held);
# "open": opening a second run's journal (the lock of the process's journal
# environments held); "join": joining the run (pr.join's lock held), and the
# child then joins it too, as a pool's task does.
ready, go = threading.Event(), threading.Event()

def held() -> None:
    if threading.current_thread().name == "other":
        ready.set()
        go.wait()

class Pausing:
    def find_spec(self, name, path, target=None):
        if name != "multiprocessing.util":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run_module = spec.loader.exec_module
        def exec_module(module):
            held()
            run_module(module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Pausing())

class OpenedSlowly(store.Store):
    def __init__(self, *args, **kwargs):
        held()
        super().__init__(*args, **kwargs)
store.Store = OpenedSlowly

open_child = joining.open_child
def joined_slowly(origin):
    held()
    return open_child(origin)
joining.open_child = joined_slowly

runs = sys.argv[1]
run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs)
run.log_episodes([{"id": "before", "traces": []}])
handle = run.handle()

def other() -> None:
    if sys.argv[2] == "import":
        import multiprocessing.util
    elif sys.argv[2] == "join":
        pr.join(handle).finish()
    else:
        pr.init(environments=["gsm8k"], mode="offline", runs_dir=runs + "-second").finish()
    ready.set()
thread = threading.Thread(target=other, name="other")
thread.start()
ready.wait()  # inside it, or done with it
logged_r, logged_w = os.pipe()
pid = os.fork()
if pid == 0:
    logging_to = pr.join(handle) if sys.argv[2] == "join" else run
    logging_to.log_episodes([{"id": "child", "traces": []}])
    os.write(logged_w, b"l")
    os._exit(0)
logged = select.select([logged_r], [], [], 60)[0]  # a hang's bound, not a race
go.set()
thread.join()
if not logged:
    os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)
run.finish()
print("logged" if logged else "hung", flush=True)
"""


@pytest.mark.parametrize("other", ["import", "open", "join"])
def test_a_child_forked_while_a_thread_holds_a_lock_logs_its_first_record(
    tmp_path: Path, other: str
) -> None:
    """Another thread of the run's process, at the fork, was inside a lock the
    child's first record takes: importing a module it imports
    (multiprocessing's, for the child's exit), or opening a journal (a
    second evaluation starting in a thread while the main thread's pool
    forks), or joining the run (``pr.join``, which the child's task calls
    too). The lock was copied held into the child, and its first record
    waited for it for good."""
    done = rh.run_script(_FORKED_WHILE_A_THREAD_HOLDS_A_LOCK, tmp_path, other)
    assert done.stdout.split() == ["logged"], done.stdout + done.stderr[-2000:]


_CHILD_WAITS_ON_A_SEMAPHORE = """
import multiprocessing, os, signal, sys, threading, time
import primeruns as pr

run = pr.init(environments=["gsm8k"], mode="offline", runs_dir=sys.argv[1])
lock = multiprocessing.get_context("fork").Lock()
lock.acquire()  # held by the parent: the child waits on it, as an idle pool worker does
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:
    run.log_episodes([{"id": "child", "traces": []}])
    # The signal lands where the interpreter cannot act on it at once: on
    # another thread, the main thread deep in a semaphore wait (as when it
    # lands between two of sem_wait's futex waits).
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.write(ready_w, b"r")
    lock.acquire()
    os._exit(0)
os.read(ready_r, 1)
os.kill(pid, signal.SIGTERM)  # Pool.terminate(); in its wait or about to be, all the same
for _ in range(300):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.1)
else:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
run.finish()
print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_forked_child_waiting_in_a_semaphore_ends_on_sigterm(tmp_path: Path) -> None:
    """A forked child has SIGTERM as it was before the run's handler: the
    child ships nothing from it (its uplink ships its journal), and a
    Python-level handler runs only once the main thread's wait ends. A pool
    worker waiting for a task (a semaphore its pool's terminate() holds for
    good) whose SIGTERM landed out of that wait never ended, and
    ``Pool.terminate()`` waited for it for ever."""
    done = rh.run_script(_CHILD_WAITS_ON_A_SEMAPHORE, tmp_path)
    assert done.stdout.split() == ["child", str(-signal.SIGTERM)], done.stdout + done.stderr[-2000:]
